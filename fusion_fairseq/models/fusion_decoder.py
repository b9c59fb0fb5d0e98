"""Transformer decoder that exposes its layer stack and fuses it before the output projection."""

from typing import Any, Dict, List, Optional

from torch import Tensor
from fairseq.models.transformer import TransformerDecoder

from fusion_fairseq.modules import LayerFusion

from .fusion_encoder import stack_with_normalised_top


class FusionTransformerDecoder(TransformerDecoder):
    """Decoder whose prediction reads phi(z0_j, ..., zL_j) (MLRF Eq. 3) when ``output_fusion`` is
    given. Fusion is per target position, so incremental decoding stays exact: each step fuses the
    new position's layer states only.

    With self-attention fusion ``extra["fusion_attn"]`` holds the hop-by-layer weights,
    ``(batch, tgt_len, nhop, layers)`` (MLRF Figure 5).
    """

    def __init__(self, args, dictionary, embed_tokens, output_fusion: Optional[LayerFusion] = None,
                 no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.output_fusion = output_fusion

    def extract_features(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        x, extra = super().extract_features(
            prev_output_tokens, encoder_out, incremental_state, full_context_alignment, alignment_layer, alignment_heads
        )
        if self.output_fusion is None:
            return x, extra
        return self.fuse_layer_stack(extra)

    def fuse_layer_stack(self, extra: Dict[str, Any]):
        states = extra["inner_states"]
        top = self.layer_norm(states[-1]) if self.layer_norm is not None else states[-1]
        fused, weights = self.output_fusion(stack_with_normalised_top(states, top), need_weights=True)
        fused = fused.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            fused = self.project_out_dim(fused)
        extra["fusion_attn"] = None if weights is None else weights.transpose(0, 1)
        return fused, extra

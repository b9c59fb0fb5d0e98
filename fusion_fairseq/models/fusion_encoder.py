"""Transformer encoder that exposes its layer stack and fuses it into the decoder's memory."""

from typing import List, Optional

import torch
from torch import Tensor
from fairseq.models.transformer import TransformerEncoder

from fusion_fairseq.modules import LayerFusion
from fusion_fairseq.modules.layer_aggregation import PlainStack

from .layer_stack import run_layer


def stack_with_normalised_top(states: List[Tensor], top: Tensor) -> List[Tensor]:
    """[h0, h1, ..., hL] with hL the stack's final output ``top``: in a pre-norm stack fairseq's
    final LayerNorm follows the last layer's raw output, which fairseq records."""
    return states[:-1] + [top]


class FusionTransformerEncoder(TransformerEncoder):
    """fairseq's Transformer encoder, plus ``aggregation``, the wiring of the layer stack (Dou et al.
    2018, DenseFormer, hyper-connections; :class:`PlainStack` is fairseq's own); ``output_fusion``: the
    memory for the decoder is phi(h0, ..., hL) (MLRF Fig. 1b); ``keep_layer_states``: always return
    every layer's output (``encoder_states``, which layer attention reads)."""

    def __init__(self, args, dictionary, embed_tokens, output_fusion: Optional[LayerFusion] = None,
                 keep_layer_states: bool = False, aggregation: Optional[PlainStack] = None):
        super().__init__(args, dictionary, embed_tokens)
        self.output_fusion = output_fusion
        self.keep_layer_states = keep_layer_states
        self.aggregation = aggregation if aggregation is not None else PlainStack(len(self.layers))

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None, fusion_weights: bool = False):
        """fairseq's encoder, with the layer stack wired by ``self.aggregation`` and its output fused by
        ``self.output_fusion``; ``fusion_weights``: also return the weights of self-attention fusion."""
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        layer_padding_mask = padding_mask if has_pads else None

        def apply_layer(index: int, layer_input: Tensor, states: List[Tensor]) -> Tensor:
            return run_layer(self.layers[index], states, layer_input, encoder_padding_mask=layer_padding_mask)

        top, states = self.aggregation.run(x.transpose(0, 1), apply_layer)
        if self.layer_norm is not None:
            top = self.layer_norm(top)
        weights = None
        if self.output_fusion is not None:
            top, weights = self.output_fusion(stack_with_normalised_top(states, top), need_weights=fusion_weights)
        out = {
            "encoder_out": [top],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C, no positions
            "encoder_states": states if return_all_hiddens or self.keep_layer_states else [],  # [h0, ..., hL]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }
        return {**out, "fusion_weights": weights} if fusion_weights else out

    def fusion_weights(self, src_tokens, src_lengths: Optional[Tensor] = None) -> Optional[Tensor]:
        """Hop-by-layer attention of self-attention fusion, ``(src_len, batch, nhop, layers)``, for analysis."""
        return self.forward_scriptable(src_tokens, src_lengths, fusion_weights=True)["fusion_weights"]

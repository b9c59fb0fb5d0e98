"""Transformer encoder that exposes its layer stack and fuses it into the decoder's memory."""

from typing import List, Optional

from torch import Tensor
from fairseq.models.transformer import TransformerEncoder

from fusion_fairseq.modules import LayerFusion


def stack_with_normalised_top(states: List[Tensor], top: Tensor) -> List[Tensor]:
    """[h0, h1, ..., hL] where hL is the stack's final output.

    fairseq records every layer's raw output; in a pre-norm stack the final LayerNorm is applied
    after the last layer, so the top state is replaced by that normalised output (``top``). In a
    post-norm stack the two are the same tensor.
    """
    return states[:-1] + [top]


class FusionTransformerEncoder(TransformerEncoder):
    """Encoder whose memory for the decoder is phi(h0, ..., hL) (MLRF Fig. 1b) when
    ``output_fusion`` is given, and the top layer otherwise. ``keep_layer_states`` makes it
    always return every layer's output (``encoder_states``), which per-decoder-layer memories
    (layer attention) read, also when the generator does not ask for them."""

    def __init__(self, args, dictionary, embed_tokens, output_fusion: Optional[LayerFusion] = None,
                 keep_layer_states: bool = False):
        super().__init__(args, dictionary, embed_tokens)
        self.output_fusion = output_fusion
        self.keep_layer_states = keep_layer_states

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None):
        return_all_hiddens = return_all_hiddens or self.keep_layer_states
        if self.output_fusion is None:
            return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        out = super().forward(src_tokens, src_lengths, True, token_embeddings)
        states = stack_with_normalised_top(out["encoder_states"], out["encoder_out"][0])
        fused, _ = self.output_fusion(states)
        out["encoder_out"] = [fused]
        if not return_all_hiddens:
            out["encoder_states"] = []
            out["fc_results"] = []
        return out

    def fusion_weights(self, src_tokens, src_lengths: Optional[Tensor] = None) -> Optional[Tensor]:
        """Hop-by-layer attention of self-attention fusion, ``(src_len, batch, nhop, layers)``, for analysis."""
        if self.output_fusion is None:
            return None
        out = super().forward(src_tokens, src_lengths, True)
        states = stack_with_normalised_top(out["encoder_states"], out["encoder_out"][0])
        return self.output_fusion(states, need_weights=True)[1]

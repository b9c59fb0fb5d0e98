"""The fusion layer of MLRF: the whole stack [h0, h1, ..., hL] in, one representation out."""

from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from .feedforward_fusion import FeedForwardFusion
from .multihop_attention_fusion import MultiHopAttentionFusion

FUSION_FUNCTIONS = ("none", "avg", "fnn", "sa")


class AverageFusion(nn.Module):
    """phi(Z_j) = the mean of the fused layers z^l_j (MLRF Sec. 3.2 "Fusion by Pooling"; h0..hL, L + 1 of them,
    unless the embedding layer is left out), no parameters: ``(..., L, d)`` to ``(..., d)``."""

    def forward(self, layers: Tensor) -> Tensor:
        return layers.mean(dim=-2)


class LayerFusion(nn.Module):
    """Applies a fusion function phi to the layer stack, then layer normalisation.

    Paper (MLRF): Eq. 3 replaces the top layer z^L_j by phi(Z_j); footnote 2 names the word
    embedding layer h0, and Table 4 (the word-embedding ablation), Fig. 5 (its layer axis starts at
    h0) and Table 2's counts show it fused (unless ``include_embedding_layer`` is False, Table 4's
    ablation; the layer embedding's row for h0 is then left unread); "we use layer normalization
    after the fusion layer" (end of Sec. 3.2).

    ``states``: list of ``L + 1`` tensors of equal shape ``(..., d)``, embedding layer first.
    Returns ``(fused (..., d), attention weights (..., nhop, L') or None)``.
    """

    def __init__(self, function: nn.Module, embed_dim: int, include_embedding_layer: bool = True, layer_norm: bool = True):
        super().__init__()
        self.function = function
        self.include_embedding_layer = include_embedding_layer
        self.layer_norm = nn.LayerNorm(embed_dim) if layer_norm else None

    def forward(self, states: List[Tensor], need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        if not self.include_embedding_layer:
            states = states[1:]
        layers = torch.stack(states, dim=-2)
        if isinstance(self.function, MultiHopAttentionFusion):
            fused, weights = self.function(layers, need_weights=need_weights)
        else:
            fused, weights = self.function(layers), None
        if self.layer_norm is not None:
            fused = self.layer_norm(fused)
        return fused, weights


def build_layer_fusion(function: str, num_layers: int, embed_dim: int, attn_dim: int, ffn_dim: int, num_hops: int,
                       include_embedding_layer: bool = True, layer_embedding: Optional[nn.Embedding] = None,
                       independent_w1: bool = False, layer_norm: bool = True,
                       dropout: float = 0.0) -> Optional[LayerFusion]:
    """A :class:`LayerFusion` over ``num_layers`` stacked layers (plus h0 when included), or
    ``None`` for ``function == "none"``."""
    if function not in FUSION_FUNCTIONS:
        raise ValueError(f"unknown fusion function {function!r}; allowed: {', '.join(FUSION_FUNCTIONS)}")
    if function == "none":
        return None
    fused_layers = num_layers + 1 if include_embedding_layer else num_layers
    first_layer_index = 0 if include_embedding_layer else 1
    if function == "avg":
        phi = AverageFusion()
    elif function == "fnn":
        phi = FeedForwardFusion(fused_layers, embed_dim, ffn_dim, dropout, layer_embedding, first_layer_index)
    else:
        phi = MultiHopAttentionFusion(fused_layers, embed_dim, attn_dim, ffn_dim, num_hops, layer_embedding,
                                      first_layer_index, independent_w1, dropout)
    return LayerFusion(phi, embed_dim, include_embedding_layer, layer_norm)

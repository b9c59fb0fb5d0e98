"""Multi-hop self-attention fusion over layers (MLRF, Sec. 3.2, Eqs. 4-7, Figure 2)."""

from typing import Optional, Tuple

import torch
from torch import nn

from .feedforward_fusion import FeedForward, layer_embedding_rows
from .init import fan_in_uniform_


class MultiHopAttentionFusion(nn.Module):
    """phi(Z_j) = FNN(SelfAtt([z~^1_j, ..., z~^L_j])) with ``num_hops`` attention hops along depth.

    Paper: Eq. 4  z~^l = z^l + E_l                      (layer embedding, optional)
           Eq. 5  e = W2 sigma(W1 [z~^1, ..., z~^L]^T)   (W1: d x da, W2: da x nhop)
           Eq. 6  a^l_p = softmax over layers l of e^l_p
           Eq. 7  s~_p = a_p . [z~^1, ..., z~^L]         (one d-vector per hop)
           then the nhop x d matrix s~ goes through a single-hidden-layer FNN (df units) to d.
    Reading: sigma is tanh, as in the structured self-attention of Lin et al. (2017) that the
    paper follows for hops. W1 and W2 carry biases, which Eq. 5 (and Lin et al.) do not write:
    Table 2's counts, rounded up, do not tell (Enc-SA nhop=4: 11,893,252 with them, 11,892,224
    without, both 11.90M), W2's bias is the same for every layer and cancels in Eq. 6's softmax
    over layers, so only W1's, inside sigma, changes what is computed. ``independent_w1`` gives
    each layer its own W1 (the "+ indep. W1" row of Table 3; footnote 4).

    ``layer_embedding`` may be shared with another fusion module (the paper shares it between
    encoder and decoder, and FNN fusion reads it too); ``first_layer_index`` is the row of the first fused layer (0 when the
    embedding layer h0 is fused, 1 otherwise).

    Input ``layers``: ``(..., L, d)``. Returns the fused ``(..., d)`` and, when asked, the
    attention weights ``(..., nhop, L)``.
    """

    def __init__(self, num_layers: int, embed_dim: int, attn_dim: int, ffn_dim: int, num_hops: int,
                 layer_embedding: Optional[nn.Embedding] = None, first_layer_index: int = 0,
                 independent_w1: bool = False, dropout: float = 0.0):
        super().__init__()
        self.num_layers = num_layers
        self.num_hops = num_hops
        self.independent_w1 = independent_w1
        if independent_w1:
            self.w1_weight = nn.Parameter(torch.empty(num_layers, embed_dim, attn_dim))
            self.w1_bias = nn.Parameter(torch.empty(num_layers, attn_dim))
            bound = embed_dim ** -0.5  # U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as nn.Linear below
            nn.init.uniform_(self.w1_weight, -bound, bound)
            nn.init.uniform_(self.w1_bias, -bound, bound)
        else:
            self.w1 = nn.Linear(embed_dim, attn_dim)
            fan_in_uniform_(self.w1)
        self.w2 = nn.Linear(attn_dim, num_hops)
        fan_in_uniform_(self.w2)
        self.ffn = FeedForward(num_hops * embed_dim, ffn_dim, embed_dim, dropout)
        self.layer_embedding = layer_embedding
        self.register_buffer("layer_ids", layer_embedding_rows(layer_embedding, first_layer_index, num_layers),
                             persistent=False)

    def forward(self, layers: torch.Tensor, need_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if self.layer_embedding is not None:
            layers = layers + self.layer_embedding(self.layer_ids)  # Eq. 4
        if self.independent_w1:
            projected = torch.einsum("...ld,lda->...la", layers, self.w1_weight) + self.w1_bias
        else:
            projected = self.w1(layers)
        energy = self.w2(torch.tanh(projected))  # Eq. 5: W2 sigma(W1 z~^l), (..., L, nhop)
        weights = torch.softmax(energy.float(), dim=-2).type_as(energy)  # Eq. 6, over layers
        hops = torch.einsum("...lp,...ld->...pd", weights, layers)  # Eq. 7: (..., nhop, d)
        fused = self.ffn(hops.flatten(start_dim=-2))
        return fused, (weights.transpose(-1, -2) if need_weights else None)

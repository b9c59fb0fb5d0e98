"""Single-hidden-layer FNN fusion (MLRF, Sec. 3.2 "Fusion by Feed-forward Neural Network")."""

import torch
import torch.nn.functional as F
from torch import nn

from .init import fan_in_uniform_


class FeedForward(nn.Module):
    """``in_dim -> hidden_dim -> out_dim`` with ReLU and dropout on the hidden units.

    The MLRF paper names a "single hidden layer FNN with df hidden units" without its activation;
    Reading: ReLU, the Transformer's own FFN activation.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, out_dim)
        self.dropout = dropout
        fan_in_uniform_(self.fc1)
        fan_in_uniform_(self.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.dropout(F.relu(self.fc1(x)), p=self.dropout, training=self.training)
        return self.fc2(hidden)


class FeedForwardFusion(nn.Module):
    """phi(Z_j) = FNN([z^1_j; ...; z^L_j]): the L layers concatenated into one L*d vector.

    Input ``layers``: ``(..., L, d)``; output ``(..., d)``.
    Parameters: (L*d)*df + df + df*d + d, e.g. 656,128 for L=4 (h0..h3), d=256, df=512, which
    is the 11.63M - 10.97M difference of Enc-FNN in MLRF Table 2.
    """

    def __init__(self, num_layers: int, embed_dim: int, ffn_dim: int, dropout: float = 0.0):
        super().__init__()
        self.num_layers = num_layers
        self.ffn = FeedForward(num_layers * embed_dim, ffn_dim, embed_dim, dropout)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        return self.ffn(layers.flatten(start_dim=-2))

"""Average-pooling fusion over the layer stack (MLRF, Sec. 3.2 "Fusion by Pooling")."""

import torch
from torch import nn


class AverageFusion(nn.Module):
    """phi(Z_j) = 1/L * sum_l z^l_j. No parameters.

    Input ``layers``: ``(..., L, d)``; output ``(..., d)``.
    """

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        return layers.mean(dim=-2)

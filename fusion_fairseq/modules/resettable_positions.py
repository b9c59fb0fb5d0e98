"""Resettable sinusoidal positions (He et al., NeurIPS 2018, Sec. 3 "Position Embedding")."""

import torch
from torch import Tensor


def sinusoidal_positions(positions: Tensor, dim: int) -> Tensor:
    """p(pos, k) = sin(pos / 10000^(k/d)) for even k and cos(pos / 10000^(k/d)) for odd k.

    Paper's formula as written (interleaved sine/cosine, exponent k/d for dimension k).
    ``positions``: integer tensor of any shape; returns ``positions.shape + (dim,)``.
    """
    k = torch.arange(dim, device=positions.device, dtype=torch.float32)
    angles = positions.unsqueeze(-1).float() / torch.pow(10000.0, k / dim)
    return torch.where(k.long() % 2 == 0, torch.sin(angles), torch.cos(angles))


def positions_from_zero(tokens: Tensor, padding_idx: int) -> Tensor:
    """0, 1, 2, ... over the non-padding tokens of each row (left or right padding); 0 at pads.
    Source and target are numbered separately, so the target restarts at zero."""
    not_pad = tokens.ne(padding_idx)
    return ((torch.cumsum(not_pad, dim=1) - 1).clamp(min=0) * not_pad).long()


def position_embedding(tokens: Tensor, padding_idx: int, dim: int) -> Tensor:
    """Sinusoidal embedding of :func:`positions_from_zero`, zero at padding."""
    embedding = sinusoidal_positions(positions_from_zero(tokens, padding_idx), dim)
    return embedding * tokens.ne(padding_idx).unsqueeze(-1)

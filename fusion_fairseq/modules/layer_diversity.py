"""Layer diversity (Dou et al., 2018, "Exploiting Deep Representations for NMT", Sec. 3.2).

Eq. 10:  L_div = 1/(L-1) * sum_{l=1}^{L-1} D(H^l, H^{l+1}),
         D(H^l, H^{l+1}) = 1/N * sum_{n=1}^{N} (1 - cos^2(h^l_n, h^{l+1}_n)).

The cosine-*squared* distance is 0 for linearly dependent vectors (parallel or anti-parallel,
footnote 1) and 1 for orthogonal ones, so L_div lies in [0, 1].

Readings (the paper does not spell these out):
  * ``N`` is one sentence's non-padding positions; a batch's value is the mean of its sentences' with the
    weights the caller gives them, by default their positions, which pools every non-padding position of
    the batch (each token counts once). Padding positions are excluded.
  * ``H^1..H^L`` are the outputs of the L layers; the embedding output is not a layer here.
  * A zero vector counts as orthogonal to everything (distance 1): norms are clamped at ``eps``
    before dividing, so the value and its gradient stay finite.
  * Computed in float32 whatever the dtype of the states and with autocast disabled, so the
    same value comes out under ``--fp16``/``--amp``.

Pure computation: no fairseq arguments; the criterion
``label_smoothed_cross_entropy_with_layer_diversity`` wires it to a model's layer states.
"""

from typing import Optional, Sequence

import torch
from torch import Tensor

DEFAULT_EPS = 1e-8


def _unit(x: Tensor, eps: float) -> Tensor:
    """``x / max(||x||, eps)`` along the last dimension, in float32."""
    x = x.float()
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)


def cosine_squared_distance(a: Tensor, b: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """``1 - cos^2(a, b)`` along the last dimension (float32, shape ``a.shape[:-1]``)."""
    if a.shape != b.shape:
        raise ValueError(f"cosine_squared_distance: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    with torch.autocast(device_type=a.device.type, enabled=False):
        cos = (_unit(a, eps) * _unit(b, eps)).sum(dim=-1)
        return 1.0 - cos.square().clamp(max=1.0)


def layer_diversity(layers: Sequence[Tensor], padding_mask: Optional[Tensor] = None,
                    weights: Optional[Tensor] = None, eps: float = DEFAULT_EPS) -> Tensor:
    """Eq. 10 for one layer stack: a float32 scalar in [0, 1].

    ``layers``: the outputs H^1..H^L of the L >= 2 layers (not the embedding output), each
    ``T x B x C`` (fairseq's time-major layout). ``padding_mask``: ``B x T``, True at padding
    positions, or None when there is no padding. ``weights`` ``(B,)``: each sentence's weight in the
    mean of the sentences' values; by default its non-padding positions. With no non-padding position
    (or no weight) the value is 0.
    """
    layers = list(layers)
    if len(layers) < 2:
        raise ValueError(f"layer diversity needs the outputs of at least 2 layers, got {len(layers)}")
    shape = layers[0].shape
    if len(shape) != 3:
        raise ValueError(f"layer states must be T x B x C, got shape {tuple(shape)}")
    for index, layer in enumerate(layers):
        if layer.shape != shape:
            raise ValueError(f"layer {index + 1} has shape {tuple(layer.shape)}, layer 1 has {tuple(shape)}")
    tgt_len, batch = shape[0], shape[1]
    if padding_mask is not None and tuple(padding_mask.shape) != (batch, tgt_len):
        raise ValueError(
            f"padding_mask must be batch x time = {(batch, tgt_len)} for states of shape {tuple(shape)}, "
            f"got {tuple(padding_mask.shape)}")

    with torch.autocast(device_type=layers[0].device.type, enabled=False):
        # sum over the L-1 adjacent pairs per position; every pair shares the same positions, so
        # the mean of the per-pair means is the mean of this sum divided by L-1.
        distance = sum(cosine_squared_distance(lower, upper, eps) for lower, upper in zip(layers[:-1], layers[1:]))
        if padding_mask is None:
            count = distance.new_full((batch,), float(tgt_len))
        else:
            keep = ~padding_mask.t().to(device=distance.device, dtype=torch.bool)
            distance = distance.masked_fill(~keep, 0.0)
            count = keep.sum(dim=0).to(torch.float32)
        if weights is None:  # every position once: the pooled mean
            return distance.sum() / count.sum().clamp_min(1.0) / (len(layers) - 1)
        weights = weights.to(distance)
        per_sentence = distance.sum(dim=0) / count.clamp_min(1.0)
        return (weights * per_sentence).sum() / weights.sum().clamp_min(1e-12) / (len(layers) - 1)

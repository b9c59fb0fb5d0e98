"""Mixed attention of layer-wise coordination (He et al., NeurIPS 2018, Sec. 3, Eq. 3)."""

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .projected_attention import ProjectedAttention


class MixedAttention(ProjectedAttention):
    """Multi-head dot-product attention whose keys and values may come from several sequences.

    Layer-wise coordination uses one attention for both sides: a source position attends to the
    source positions of the layer below; a target position attends, in ONE softmax, to every
    source position and to the target positions up to itself of the layer below (Eq. 3:
    softmax(QK^T / sqrt(d_model) + M) V with M(i, j) = 0 for j < n or j <= i + n, else -inf).
    Reading: each head scales by the square root of its own dimension, as the Transformer's
    multi-head attention does; the paper writes d_model for the single-head form.
    Keys and values are projected apart from the query (:meth:`project_memory`) so that the
    decoder can project the source once per sentence and append one target position per decoding
    step. Shapes and masks: :class:`ProjectedAttention`. Its projections start as fairseq's
    attention's weights (query, key and value at gain 1/sqrt(2)), with zero biases where fairseq
    keeps torch's default ones for the query, key and value.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__(embed_dim, num_heads, dropout, qkv_gain=1 / math.sqrt(2))

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, allowed: Optional[Tensor] = None,
                need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` to projected ``keys``/``values``; returns the output and, when
        asked, the weights averaged over heads ``(batch, query_length, key_length)``."""
        if not need_weights:
            return self.attend(query, keys, values, allowed), None
        scores = torch.matmul(self.project_query(query), keys.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
        context = torch.matmul(self.dropout_module(weights), values)
        return self.project_output(context), weights.mean(dim=1)

    def attend_blocks(self, query: Tensor, blocks: List[Tuple[Tensor, Tensor, Tensor]],
                      need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """One softmax over several memories ``[(keys, values, allowed), ...]`` without
        concatenating them: the scores of each block are computed against its own keys, joined
        (cheap: one column per key), normalised together, and each block's values are weighted
        by its share. Incremental decoding thus never copies the cached source memory."""
        q = self.project_query(query) / math.sqrt(self.head_dim)
        scores = [torch.matmul(q, keys.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
                  for keys, _, allowed in blocks]
        weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).type_as(q)
        shares = self.dropout_module(weights).split([block.size(-1) for block in scores], dim=-1)
        context = sum(torch.matmul(share, values) for share, (_, values, _) in zip(shares, blocks))
        return self.project_output(context), (weights.mean(dim=1) if need_weights else None)

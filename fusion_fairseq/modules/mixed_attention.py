"""Mixed attention of layer-wise coordination (He et al., NeurIPS 2018, Sec. 3, Eq. 3)."""

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MixedAttention(nn.Module):
    """Multi-head dot-product attention whose keys and values may come from several sequences.

    Layer-wise coordination uses one attention for both sides: a source position attends to the
    source positions of the layer below; a target position attends, in ONE softmax, to every
    source position and to the target positions up to itself of the layer below (Eq. 3:
    softmax(QK^T / sqrt(d) + M) V with M(i, j) = 0 for j < n or j <= i + n, else -inf).
    Keys and values are projected separately (:meth:`project_memory`) so that the decoder can
    project the source once per sentence and append one target position per decoding step.
    Tensors are batch-first: ``(batch, length, embed_dim)``; projected memories are
    ``(batch, heads, length, head_dim)``; masks are boolean, True where attention is allowed,
    broadcastable to ``(batch, heads, query_length, key_length)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed dim {embed_dim} is not divisible by {num_heads} attention heads")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for linear in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(linear.weight, gain=1 / math.sqrt(2))  # as fairseq's attention
            nn.init.zeros_(linear.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def project_memory(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Projected keys and values of ``x``."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, allowed: Optional[Tensor] = None,
                need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` to projected ``keys``/``values``; returns the output and, when
        asked, the weights averaged over heads ``(batch, query_length, key_length)``."""
        q = self.split_heads(self.q_proj(query))
        batch, _, query_length, _ = q.shape
        if need_weights:
            scores = torch.matmul(q, keys.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
            context = torch.matmul(F.dropout(weights, self.dropout, self.training), values)
            averaged = weights.mean(dim=1)
        else:
            context = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
            )
            averaged = None
        output = self.out_proj(context.transpose(1, 2).reshape(batch, query_length, -1))
        return output, averaged

    def attend_blocks(self, query: Tensor, blocks: List[Tuple[Tensor, Tensor, Tensor]],
                      need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """One softmax over several memories ``[(keys, values, allowed), ...]`` without
        concatenating them: the scores of each block are computed against its own keys, joined
        (cheap: one column per key), normalised together, and each block's values are weighted
        by its share. Incremental decoding thus never copies the cached source memory."""
        q = self.split_heads(self.q_proj(query)) / math.sqrt(self.head_dim)
        batch, _, query_length, _ = q.shape
        scores = [torch.matmul(q, keys.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
                  for keys, _, allowed in blocks]
        weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).type_as(q)
        dropped = F.dropout(weights, self.dropout, self.training)
        context, start = 0, 0
        for (_, values, _), block_scores in zip(blocks, scores):
            width = block_scores.size(-1)
            context = context + torch.matmul(dropped[..., start:start + width], values)
            start += width
        output = self.out_proj(context.transpose(1, 2).reshape(batch, query_length, -1))
        return output, (weights.mean(dim=1) if need_weights else None)

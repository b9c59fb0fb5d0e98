"""Surface attention of SurfaceFusion (Liu et al., ICLR 2021, Sec. 4.1)."""

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.incremental_decoding_utils import with_incremental_state


@with_incremental_state
class SurfaceAttention(nn.Module):
    """Multi-head dot-product attention r(y_j, x) with the decoder output y^M_j as query, the
    encoder output X_N as keys and the encoder's word embeddings X_emb as values.

    Keys and values come from two different tensors, which fairseq's encoder-decoder attention
    does not support, hence this module. Incremental decoding: the projected keys and values
    are computed at the first step of a sentence and kept in ``incremental_state``; every later
    step projects only its one query.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"surface attention: embed dim {embed_dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(batch, length, D)`` -> ``(batch, heads, length, head_dim)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def projected_memory(self, keys: Tensor, values: Tensor,
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]]):
        """Projected keys and values ``(batch, heads, src_len, head_dim)``, once per sentence."""
        if incremental_state is not None:
            cached = self.get_incremental_state(incremental_state, "memory")
            if cached is not None:
                return cached["keys"], cached["values"]
        projected_keys = self.split_heads(self.k_proj(keys))
        projected_values = self.split_heads(self.v_proj(values))
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "memory", {"keys": projected_keys, "values": projected_values})
        return projected_keys, projected_values

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        """``query`` ``(batch, tgt_len, D)``; ``keys``/``values`` ``(batch, src_len, D)``;
        ``key_padding_mask`` ``(batch, src_len)``, True at padding. Returns ``(batch, tgt_len, D)``."""
        projected_keys, projected_values = self.projected_memory(keys, values, incremental_state)
        attn_mask = None
        if key_padding_mask is not None:
            attn_mask = ~key_padding_mask[:, None, None, :]  # True where attention is allowed
        context = F.scaled_dot_product_attention(
            self.split_heads(self.q_proj(query)), projected_keys, projected_values, attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
        )
        batch, _, tgt_len, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(batch, tgt_len, -1))

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        """Beam search reorders (and repeats) sentences: reorder the cached memory with them."""
        cached = self.get_incremental_state(incremental_state, "memory")
        if cached is not None:
            self.set_incremental_state(
                incremental_state, "memory", {name: tensor.index_select(0, new_order) for name, tensor in cached.items()}
            )
        return incremental_state

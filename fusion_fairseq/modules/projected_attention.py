"""Multi-head dot-product attention whose keys and values are projected apart from the query: the
core of surface attention (SurfaceFusion, ``surface_attention.py``) and of mixed attention
(layer-wise coordination, ``mixed_attention.py``).

fairseq's ``MultiheadAttention`` projects keys and values from one tensor in one call; both
methods need them projected on their own (surface attention: keys and values from two different
tensors; mixed attention: the source projected once per sentence, one target position appended
per decoding step), so they project the memory here and attend to it with torch's
``scaled_dot_product_attention``.
"""

from typing import Optional, Tuple

import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout


class ProjectedAttention(nn.Module):
    """q/k/v/out projections (Xavier-uniform weights, zero biases; ``qkv_gain`` scales the
    query, key and value weights, 1/sqrt(2) in fairseq's own attention, which keeps torch's default
    biases for them: ``zero_qkv_biases=False``). Tensors are batch-first
    ``(batch, length, embed_dim)``; projected memories are ``(batch, heads, length, head_dim)``;
    masks are boolean, True where attention is allowed, broadcastable to
    ``(batch, heads, query_length, key_length)``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, qkv_gain: float = 1.0,
                 zero_qkv_biases: bool = True):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed dim {embed_dim} is not divisible by {num_heads} attention heads")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(linear.weight, gain=1.0 if linear is self.out_proj else qkv_gain)
            if linear is self.out_proj or zero_qkv_biases:
                nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(batch, length, D)`` -> ``(batch, heads, length, head_dim)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def project_memory(self, keys: Tensor, values: Tensor) -> Tuple[Tensor, Tensor]:
        """Projected keys and values, split into heads."""
        return self.split_heads(self.k_proj(keys)), self.split_heads(self.v_proj(values))

    def project_query(self, query: Tensor) -> Tensor:
        return self.split_heads(self.q_proj(query))

    def project_output(self, context: Tensor) -> Tensor:
        """``(batch, heads, query_length, head_dim)`` -> ``(batch, query_length, D)``."""
        batch, _, query_length, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(batch, query_length, -1))

    def attend(self, query: Tensor, keys: Tensor, values: Tensor, allowed: Optional[Tensor] = None) -> Tensor:
        """Attend from ``query`` to projected ``keys``/``values``; the output, projected."""
        context = F.scaled_dot_product_attention(
            self.project_query(query), keys, values, attn_mask=allowed,
            dropout_p=self.dropout_module.p if self.training or self.dropout_module.apply_during_inference else 0.0)
        return self.project_output(context)

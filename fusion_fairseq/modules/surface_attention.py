"""Surface attention of SurfaceFusion (Liu et al., ICLR 2021, Sec. 4.1)."""

from typing import Dict, Optional

from torch import Tensor
from fairseq.incremental_decoding_utils import with_incremental_state

from .projected_attention import ProjectedAttention


@with_incremental_state
class SurfaceAttention(ProjectedAttention):
    """Multi-head dot-product attention r(y_j, x) with the decoder output y^M_j as query, the
    encoder output X_N as keys and the encoder's word embeddings X_emb as values.

    Keys and values come from two different tensors, which fairseq's encoder-decoder attention
    does not support, hence :class:`ProjectedAttention`. Incremental decoding: the projected keys
    and values are computed at the first step of a sentence and kept in ``incremental_state``;
    every later step projects only its one query.
    """

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        """``query`` ``(batch, tgt_len, D)``; ``keys``/``values`` ``(batch, src_len, D)``;
        ``key_padding_mask`` ``(batch, src_len)``, True at padding. Returns ``(batch, tgt_len, D)``."""
        # projected keys and values (batch, heads, src_len, head_dim), once per sentence
        memory = None if incremental_state is None else self.get_incremental_state(incremental_state, "memory")
        if memory is None:
            memory = dict(zip(("keys", "values"), self.project_memory(keys, values)))
            if incremental_state is not None:
                self.set_incremental_state(incremental_state, "memory", memory)
        allowed = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        return self.attend(query, memory["keys"], memory["values"], allowed)

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        """Beam search reorders (and repeats) sentences: reorder the cached memory with them."""
        cached = self.get_incremental_state(incremental_state, "memory")
        if cached is not None:
            self.set_incremental_state(
                incremental_state, "memory", {name: tensor.index_select(0, new_order) for name, tensor in cached.items()}
            )
        return incremental_state

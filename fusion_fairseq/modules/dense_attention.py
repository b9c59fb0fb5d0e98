"""Dense attention of DenseNMT (Shen et al., NAACL 2018, Sec. 3.2, Eqs. 8-10).

Every decoder layer attends several encoder layers ("sources") h_i instead of the top one:

* DenseAtt-1 (Eq. 9): a_l = F(L(z_l), L([{h_i}]), L([{h_i}]) + L(h0)) - the sources are mixed by
  one projection of their concatenation *before* the attention (one softmax);
* DenseAtt-2 (Eq. 10): a_l = sum_i F(L(z_l), L(h_i), L([h_i, h0])) - one softmax per source, the
  attention values summed *after* the attention.

F is the multiplicative attention of Eq. 8, softmax(Q K) V. The per-source key/value tensors are
built by the model (they depend on the encoder); the modules here take them stacked along a
``sources`` dimension: DenseAtt-1 passes one source (the mixed one), DenseAtt-2 one per layer,
and plain multi-step attention (Gehring et al. 2017) is the one-source case.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.modules import MultiheadAttention

DENSE_ATTENTION_KINDS = ("none", "1", "2")


def weight_normed_linear(in_dim: int, out_dim: int, dropout: float = 0.0, weight_norm: bool = True) -> nn.Module:
    """ConvS2S-style position-wise linear layer: normal init with std sqrt((1 - p) / in_dim),
    zero bias, weight normalisation (unless ``weight_norm`` is off)."""
    linear = nn.Linear(in_dim, out_dim)
    nn.init.normal_(linear.weight, mean=0.0, std=math.sqrt((1.0 - dropout) / in_dim))
    nn.init.zeros_(linear.bias)
    return nn.utils.weight_norm(linear) if weight_norm else linear


class DenseConvAttention(nn.Module):
    """ConvS2S multi-step attention over ``n`` sources (Eq. 8 inside Eq. 9/10).

    Query (Gehring et al.): ``(W_in z_l + g) * sqrt(1/2)`` with ``g`` the target embedding, i.e.
    L(z_l) of Eq. 9/10. Per source i: weights ``softmax(q . k_i)`` over the source positions,
    context ``sum_j w_j v_ij`` scaled by ``sqrt(m)`` (m = number of real source tokens, as ConvS2S),
    the contexts of the sources summed (Eq. 10; with one source this is Eq. 9 / multi-step
    attention), then projected back to ``conv_channels`` by ``W_out``.

    ``residual=True`` is ConvS2S's layer: the output is ``(W_out c + z_l) * sqrt(1/2)`` and is the
    layer's new state. ``residual=False`` is the dense decoder (Eq. 7): the output is the separate
    attention value ``a_l`` that is concatenated beside ``z_l``.
    """

    def __init__(self, conv_channels: int, embed_dim: int, residual: bool = True):
        super().__init__()
        self.in_projection = weight_normed_linear(conv_channels, embed_dim)
        self.out_projection = weight_normed_linear(embed_dim, conv_channels)
        self.residual = residual

    def forward(self, x: Tensor, target_embedding: Tensor, keys: Tensor, values: Tensor,
                padding_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """x: ``(batch, tgt, conv_channels)``; target_embedding: ``(batch, tgt, embed_dim)``;
        keys, values: ``(batch, sources, src, embed_dim)``; padding_mask: ``(batch, src)`` or None.
        Returns the output ``(batch, tgt, conv_channels)`` and the attention weights averaged over the
        sources ``(batch, tgt, src)``."""
        query = (self.in_projection(x) + target_embedding) * math.sqrt(0.5)
        scores = torch.matmul(query.unsqueeze(1), keys.transpose(2, 3))  # batch x sources x tgt x src
        if padding_mask is not None:
            scores = scores.float().masked_fill(padding_mask[:, None, None, :], float("-inf")).type_as(scores)
        weights = F.softmax(scores, dim=-1)
        context = torch.matmul(weights, values).sum(dim=1)  # Eq. 10: sum over the sources
        length = keys.size(2)
        if padding_mask is None:
            context = context * math.sqrt(length)
        else:
            real = (length - padding_mask.type_as(context).sum(dim=1))[:, None, None]
            context = context * real.sqrt()
        out = self.out_projection(context)
        if self.residual:
            out = (out + x) * math.sqrt(0.5)
        return out, weights.mean(dim=1)


class DenseSourceAttention(MultiheadAttention):
    """fairseq's encoder-decoder multi-head attention for the dense Transformer.

    ``groups == 1``: fairseq's own attention (multi-step attention, or DenseAtt-1 where the
    memory is already the mixed projection of the encoder layers). ``groups = n > 1``: DenseAtt-2
    (Eq. 10) - the memory is the ``n`` projected encoder layers stacked along the source-time
    axis (``n * src`` positions, padding mask tiled the same way); each head takes one softmax per
    group and sums the ``n`` contexts before the output projection. Incremental decoding projects
    the keys and values once per sentence and keeps them in fairseq's own attention buffer
    (``prev_key``/``prev_value``, batch first), so fairseq's ``reorder_incremental_state`` moves
    them with the beams exactly as it moves the vanilla encoder-decoder attention's.

    ``record_output``: keep the last output (``tgt x batch x embed_dim``) in ``last_output``, for a
    dense decoder that concatenates the attention value a_l beside z_l (Eq. 7). This is the value
    before the decoder layer's dropout; the layer concatenates its dropped-out form.
    """

    def __init__(self, *args, groups: int = 1, record_output: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.groups = groups
        self.record_output = record_output
        self.last_output: Optional[Tensor] = None

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                need_head_weights=False, **kwargs):
        if self.groups == 1:
            out, weights = super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                           need_head_weights=need_head_weights, **kwargs)
        else:
            out, weights = self.grouped_attention(query, key, key_padding_mask, incremental_state,
                                                  need_weights or need_head_weights, need_head_weights)
        if self.record_output:
            self.last_output = out
        return out, weights

    def set_beam_size(self, beam_size: int):
        """fairseq's beamable encoder-decoder attention keeps one key/value copy per sentence and
        reorders it per sentence; the grouped memory is kept per hypothesis, so it stays at 1."""
        if self.groups == 1:
            super().set_beam_size(beam_size)

    def grouped_attention(self, query: Tensor, memory: Tensor, padding_mask: Optional[Tensor], incremental_state,
                          need_weights: bool, need_head_weights: bool):
        """Eq. 10 over the stacked memory, whose keys and values ``(batch, heads, groups, src, head_dim)``
        are computed at a sentence's first step only when decoding incrementally."""
        tgt_len, batch, _ = query.shape
        heads, head_dim = self.num_heads, self.head_dim
        saved = self._get_input_buffer(incremental_state)  # empty when not decoding incrementally
        if saved.get("prev_key") is None:
            total = memory.size(0)
            if total % self.groups:
                raise ValueError(f"memory length {total} is not a multiple of the {self.groups} DenseAtt-2 sources")
            shape = (self.groups, total // self.groups, memory.size(1), heads, head_dim)
            saved["prev_key"] = self.k_proj(memory).view(shape).permute(2, 3, 0, 1, 4)
            saved["prev_value"] = self.v_proj(memory).view(shape).permute(2, 3, 0, 1, 4)
            self._set_input_buffer(incremental_state, saved)  # a no-op without incremental_state
        k, v = saved["prev_key"], saved["prev_value"]
        src_len = k.size(3)
        q = (self.q_proj(query) * self.scaling).view(tgt_len, batch, heads, head_dim).permute(1, 2, 0, 3)
        scores = torch.matmul(q.unsqueeze(2), k.transpose(-1, -2))  # batch x heads x groups x tgt x src
        if padding_mask is not None:
            mask = padding_mask.view(batch, self.groups, src_len)[:, None, :, None, :].to(torch.bool)
            scores = scores.float().masked_fill(mask, float("-inf")).type_as(scores)
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        context = torch.matmul(self.dropout_module(probs), v).sum(dim=2)  # Eq. 10: sum over sources
        context = context.permute(2, 0, 1, 3).reshape(tgt_len, batch, heads * head_dim)
        out = self.out_proj(context)
        weights = None
        if need_weights:
            weights = probs.mean(dim=2).transpose(0, 1)  # heads x batch x tgt x src
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

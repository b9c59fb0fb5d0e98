"""fairseq's Transformer layers as MUDDFormer's block B' (``--mudd-encoder``, ``--mudd-decoder``):
four inputs, the ways query, key, value and residual (Xiao et al. 2025, Eq. 7), ``T x B x 4 x C``
as :class:`modules.multiway_dense_connection.MultiwayDynamicDense` hands them over.

Paper: Eq. 7, X_A = MHA(LN(X^Q), LN(X^K), LN(X^V)) + X^R, then the FFN sublayer on X_A. Reading,
in fairseq's terms:

* The self-attention's query, keys and values are projected from their own ways, the residual
  added to its output is the residual way; every other part of the layer is fairseq's, with its
  dropouts and its parameters' names (so a Transformer's weights load as they are).
* Pre-norm (``--*-normalize-before``, the paper's block): one LayerNorm per way, the query's being fairseq's
  ``self_attn_layer_norm``, as the released code (``sepln``: separate norms); Eq. 7 writes LN for each. In
  every layer, as the JAX training code: the released PyTorch code shares the query's norm in the first layer
  (``sepln and lidx > 0``), whose ways all read X_0, so its count is 4D per side below ours. Post-norm
  (fairseq's default) has no LN before the sublayer and adds none: X_A = LN(MHA(Q, K, V) + R). There the
  side's output Xbar_L^R (the encoder's memory, the decoder's input to the output projection) is a learned mix
  of LayerNorm outputs with no LayerNorm of its own, as fairseq's post-norm stacks have no final one: X_L at
  the start, not normalised once the weights move.
* The decoder's cross-attention sits between self-attention and FFN, as in fairseq, and reads
  X_A as its query and the encoder's output (its final aggregate Xbar_L^R, after fairseq's final
  LayerNorm in pre-norm) as keys and values: the paper's block has one attention, whose inputs
  the four ways feed; the cross-attention query gets no way of its own.
* The self-attention takes keys and values apart from the query, so fairseq's attention is built
  as a general attention (``self_attention=False``), whose incremental state caches the projected
  keys and values of past positions as the self-attention's does: beam reordering and incremental
  decoding are fairseq's.

``--cross-self-attention`` is refused at build time; NormFormer's rescalings cannot be set for this model.
"""

from typing import Dict, Optional

from torch import Tensor
from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
WAY_NORMS = ("self_attn_key_layer_norm", "self_attn_value_layer_norm")


class MultiwaySublayers:
    """What B' changes in fairseq's layer (its self-attention sublayer), and fairseq's FFN sublayer."""

    def add_way_norms(self) -> None:
        for name in WAY_NORMS:
            setattr(self, name, LayerNorm(self.embed_dim) if self.normalize_before else None)
        self._register_load_state_dict_pre_hook(self.start_way_norms_as_query_norm)

    def start_way_norms_as_query_norm(self, state_dict, prefix, *args) -> None:
        """A state without the key and value norms (a Transformer's): copies of the query's norm, so that the
        model computes that Transformer."""
        for name in WAY_NORMS:
            for tensor in ("weight", "bias"):
                query_norm = state_dict.get(f"{prefix}self_attn_layer_norm.{tensor}")
                if getattr(self, name) is not None and f"{prefix}{name}.{tensor}" not in state_dict \
                        and query_norm is not None:
                    state_dict[f"{prefix}{name}.{tensor}"] = query_norm.clone()

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        """fairseq's self-attention, with its arguments, built as a general attention: keys and values come
        from their own ways, not from the query."""
        side = cfg.decoder if isinstance(self, TransformerDecoderLayerBase) else cfg.encoder
        return MultiheadAttention(
            embed_dim, side.attention_heads, dropout=cfg.attention_dropout, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn, self_attention=False, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size, xformers_att_config=side.xformers_att_config)

    def attend_ways(self, ways: Tensor, **attention) -> Tensor:
        """Eq. 7's first line: X_A from the ways ``T x B x 4 x C``."""
        query, key, value, residual = ways.unbind(-2)
        if self.normalize_before:
            query = self.self_attn_layer_norm(query)
            key, value = self.self_attn_key_layer_norm(key), self.self_attn_value_layer_norm(value)
        x, _ = self.self_attn(query=query, key=key, value=value, need_weights=False, **attention)
        x = self.residual_connection(self.dropout_module(x), residual)
        return x if self.normalize_before else self.self_attn_layer_norm(x)

    def feed_forward(self, x: Tensor) -> Tensor:
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.residual_connection(self.dropout_module(self.fc2(x)), residual)
        return x if self.normalize_before else self.final_layer_norm(x)


class MultiwayEncoderLayer(MultiwaySublayers, TransformerEncoderLayerBase):
    """fairseq's encoder layer as B'."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.add_way_norms()

    def forward(self, ways: Tensor, encoder_padding_mask: Optional[Tensor]) -> Tensor:
        return self.feed_forward(self.attend_ways(ways, key_padding_mask=encoder_padding_mask))


class MultiwayDecoderLayer(MultiwaySublayers, TransformerDecoderLayerBase):
    """fairseq's decoder layer as B', its cross-attention reading X_A (see the module docstring)."""

    def __init__(self, cfg, no_encoder_attn: bool = False):
        super().__init__(cfg, no_encoder_attn)
        self.add_way_norms()

    def forward(self, ways: Tensor, encoder_out: Optional[Tensor] = None,
                encoder_padding_mask: Optional[Tensor] = None, incremental_state: Optional[IncrementalState] = None,
                self_attn_mask: Optional[Tensor] = None, self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False, need_head_weights: bool = False):
        """fairseq's decoder layer's arguments and results (output, source attention, None)."""
        x = self.attend_ways(ways, key_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
                             attn_mask=self_attn_mask)
        attention = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            x, attention = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or need_head_weights or (not self.training and self.need_attn),
                need_head_weights=need_head_weights)
            x = self.residual_connection(self.dropout_module(x), residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
        return self.feed_forward(x), attention, None


def build_multiway_layer(cfg, index: int, no_encoder_attn: bool = False, *, decoder: bool):
    """Layer ``index`` of a MUDD stack: every layer is B'."""
    return MultiwayDecoderLayer(cfg, no_encoder_attn) if decoder else MultiwayEncoderLayer(cfg)

"""fairseq's Transformer layers whose self-attention also attends to the layers below
(``--multi-layer-attention K``, Dou et al. 2018, Sec. 3.1.2, Eq. 8).

Layer l (1-based) gets a :class:`modules.MultiLayerSelfAttention` over H^{l-1}, ..., H^{l-k} in
place of fairseq's self-attention (same names for the ordinary attention's parameters); every other
part of the layer, its forward included, is fairseq's. Its forward takes the stack's states
``lower_states`` beside fairseq's arguments and hands the ones it attends to its self-attention.

Paper: Sec. 3.1.2 and Table 1. Reading: the attended layers are layer outputs, l - k >= 1 (the
embedding H^0 is not one of "the lower k layers"), so layers 1..k are fairseq's own layers. On
Transformer-Base this gives exactly Table 1's +33.6M for k=2 (layers 3-6 of both stacks) and +37.8M
for k=3 (layers 4-6). Counting H^0 as a layer would give +42.0M / +50.4M, attending fewer layers
where fewer exist +33.6M / +46.2M, and both +42.0M / +58.8M.

Activation checkpointing: fairseq's wrapper would re-run the layer in backward from its positional
inputs alone, without the lower states and without passing them gradients; these layers therefore
checkpoint themselves (``activation_checkpointing.call_checkpointed``, torch's non-re-entrant
checkpoint) and the stacks do not wrap them.
"""

from typing import List

from torch import Tensor
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fusion_fairseq.modules import MultiLayerSelfAttention

from .activation_checkpointing import call_checkpointed


class MultiLayerAttentionSublayers:
    """What multi-layer attention changes in fairseq's layer: its self-attention, and a forward that
    reads the lower layers' states."""

    checkpoints_itself = True  # read by ``fusion_stacks.wrapped_like_fairseq``

    def set_options(self, cfg, num_attended: int, aggregation_function: str, aggregation_residual: str) -> None:
        """Before fairseq's ``__init__``, which builds the self-attention."""
        self.num_attended = num_attended
        self.aggregation_options = (aggregation_function, aggregation_residual)
        self.checkpointing = (bool(cfg.checkpoint_activations), bool(cfg.offload_activations))

    def build_multi_layer_attention(self, embed_dim: int, side_cfg, attention_dropout: float):
        """AGG's hidden size is the FFN's, as in the stacks' aggregation nodes."""
        return MultiLayerSelfAttention(embed_dim, side_cfg.attention_heads, self.num_attended - 1,
                                       side_cfg.ffn_embed_dim, attention_dropout, *self.aggregation_options)

    def forward(self, x: Tensor, *args, lower_states: List[Tensor], **kwargs):
        """fairseq's layer's forward; ``lower_states``: [H^0, ..., H^{l-1}], the stack's states up to this
        layer's input."""
        attended = lower_states[-2:-2 - len(self.self_attn.lower_attentions):-1]  # H^{l-2}, ..., H^{l-k}
        enabled, offload = self.checkpointing
        return call_checkpointed(self.forward_attending, x, attended, *args, enabled=enabled, offload=offload,
                                 **kwargs)

    def forward_attending(self, x: Tensor, attended: List[Tensor], *args, **kwargs):
        """Also where backward recomputes the layer: the self-attention gets its lower states again."""
        self.self_attn.attend_lower_layers(attended)
        return super().forward(x, *args, **kwargs)


class MultiLayerAttentionEncoderLayer(MultiLayerAttentionSublayers, TransformerEncoderLayerBase):
    def __init__(self, cfg, *, num_attended: int, aggregation_function: str, aggregation_residual: str):
        self.set_options(cfg, num_attended, aggregation_function, aggregation_residual)
        super().__init__(cfg)

    def build_self_attention(self, embed_dim, cfg):
        return self.build_multi_layer_attention(embed_dim, cfg.encoder, cfg.attention_dropout)


class MultiLayerAttentionDecoderLayer(MultiLayerAttentionSublayers, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn: bool = False, *, num_attended: int, aggregation_function: str,
                 aggregation_residual: str):
        self.set_options(cfg, num_attended, aggregation_function, aggregation_residual)
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return self.build_multi_layer_attention(embed_dim, cfg.decoder, cfg.attention_dropout)


def build_multi_layer_attention_layer(cfg, index: int, no_encoder_attn: bool = False, *, decoder: bool,
                                      num_attended: int, aggregation_function: str, aggregation_residual: str):
    """Layer ``index`` (0-based) of a stack with multi-layer attention: fairseq's own below layer
    k + 1, which has fewer than k layers (H^1, ...) below it."""
    if index < num_attended:
        return TransformerDecoderLayerBase(cfg, no_encoder_attn) if decoder else TransformerEncoderLayerBase(cfg)
    options = dict(num_attended=num_attended, aggregation_function=aggregation_function,
                   aggregation_residual=aggregation_residual)
    return MultiLayerAttentionDecoderLayer(cfg, no_encoder_attn, **options) if decoder else \
        MultiLayerAttentionEncoderLayer(cfg, **options)

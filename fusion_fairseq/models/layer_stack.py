"""Helpers shared by the fusion encoder and decoder for wiring their layer stacks."""

from typing import List

from torch import Tensor, nn

from fusion_fairseq.modules import MultiLayerSelfAttention


def hand_lower_layers(layer: nn.Module, states: List[Tensor]):
    """Give a layer with multi-layer attention the states of the layers below its input:
    ``states`` is [H^0, ..., H^{l-1}] when layer l is about to run."""
    attention = layer.self_attn
    if isinstance(attention, MultiLayerSelfAttention):
        count = len(attention.lower_attentions)
        attention.attend_lower_layers(states[-2:-2 - count:-1])


def install_multi_layer_attention(layers: nn.ModuleList, num_attended: int, embed_dim: int, num_heads: int,
                                  dropout: float, aggregation_hidden_dim: int, aggregation_function: str,
                                  aggregation_residual: str):
    """Replace the self-attention of every layer l (1-based) that has at least two layers below
    it by a :class:`MultiLayerSelfAttention` over min(k, l) layers (Dou et al., Eq. 8)."""
    for index, layer in enumerate(layers):
        attended = min(num_attended, index + 1)
        if attended < 2:
            continue
        layer.self_attn = MultiLayerSelfAttention(
            embed_dim, num_heads, attended - 1, aggregation_hidden_dim, dropout,
            aggregation_function, aggregation_residual,
        )

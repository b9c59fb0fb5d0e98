"""Helpers shared by the fusion encoder and decoder for wiring their layer stacks."""

from typing import List

from torch import Tensor, nn

from fusion_fairseq.modules import MultiLayerSelfAttention

from .activation_checkpointing import call_checkpointed
from .hyper_connected_layers import forward_on_streams


def hand_lower_layers(layer: nn.Module, states: List[Tensor]):
    """Give a layer with multi-layer attention the states of the layers below its input:
    ``states`` is [H^0, ..., H^{l-1}] when layer l is about to run."""
    attention = layer.self_attn
    if isinstance(attention, MultiLayerSelfAttention):
        count = len(attention.lower_attentions)
        attention.attend_lower_layers(states[-2:-2 - count:-1])


def run_layer(layer: nn.Module, states: List[Tensor], *args, **kwargs):
    """``layer(*args, **kwargs)`` after :func:`hand_lower_layers`; a layer with hyper-connections
    runs over its streams (:func:`forward_on_streams`). A layer with multi-layer
    attention that fairseq wrapped for ``--checkpoint-activations`` runs under torch's
    non-re-entrant checkpoint instead, which hands the lower states over again when backward
    recomputes the layer and passes their gradients (see ``activation_checkpointing``)."""
    forward = getattr(layer, "precheckpoint_forward", None)  # set by fairseq's checkpoint_wrapper
    offload = forward is not None and bool(layer.forward.args[1])  # partial(_checkpointed_forward, forward, offload)
    if hasattr(layer, "hyper_connections"):  # ``args[0]`` holds the streams; fairseq's forward would take one
        return call_checkpointed(forward_on_streams, layer, *args, enabled=forward is not None, offload=offload,
                                 **kwargs)
    if forward is None or not isinstance(layer.self_attn, MultiLayerSelfAttention):
        hand_lower_layers(layer, states)
        return layer(*args, **kwargs)
    states = list(states)  # as now: the stack appends to its list before backward recomputes

    def forward_with_lower_layers(*args, **kwargs):
        hand_lower_layers(layer, states)
        return forward(*args, **kwargs)

    return call_checkpointed(forward_with_lower_layers, *args, enabled=True, offload=offload, **kwargs)


def install_multi_layer_attention(layers: nn.ModuleList, num_attended: int, embed_dim: int, num_heads: int,
                                  dropout: float, aggregation_hidden_dim: int, aggregation_function: str,
                                  aggregation_residual: str):
    """Replace the self-attention of every layer l (1-based) with k = ``num_attended`` layers
    below it by a :class:`MultiLayerSelfAttention` over H^{l-1}, ..., H^{l-k} (Dou et al., Eq. 8).

    Paper: Sec. 3.1.2 and Table 1. Reading: the attended layers are layer outputs, l - k >= 1
    (the embedding H^0 is not one of "the lower k layers"), so layers 1..k keep fairseq's
    self-attention. On Transformer-Base this gives exactly Table 1's +33.6M for k=2 (layers 3-6 of
    both stacks) and +37.8M for k=3 (layers 4-6); counting H^0 as a layer, or attending fewer
    layers where fewer exist, would give +42.0M / +58.8M."""
    for index, layer in enumerate(layers):
        if index < num_attended:  # layer l = index + 1 has fewer than k layers (H^1..) below it
            continue
        layer.self_attn = MultiLayerSelfAttention(
            embed_dim, num_heads, num_attended - 1, aggregation_hidden_dim, dropout,
            aggregation_function, aggregation_residual)

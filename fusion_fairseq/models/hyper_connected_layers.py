"""fairseq's Transformer layers run over hyper-connected streams (``--hyper-connections-*``).

The layers stay fairseq's own, with their own parameters and names; :func:`install_hyper_connections`
gives each a ``hyper_connections`` list, one connection per sublayer, and :func:`forward_on_streams`
runs the layer sublayer by sublayer, each wrapped by :func:`modules.hyper_connection.connect` in
place of fairseq's residual connection (see ``modules/hyper_connection.py`` for the equations and
readings). Dropout sits where fairseq puts it: on each sublayer's output, before the connection.
"""

import math
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from fusion_fairseq.modules.hyper_connection import build_hyper_connection, connect

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


def install_hyper_connections(layers: nn.ModuleList, kind: str, rate: int, embed_dim: int,
                              sinkhorn_order: str = "columns-first", rescale_outputs: bool = True,
                              decay_static: bool = False) -> None:
    """One connection per sublayer, numbered over the whole stack (the paper's layer index k). For
    SHC and DHC, Zhu et al.'s recipe (Sec. 4): ``rescale_outputs`` divides the sublayers' output
    projections by sqrt(n), and unless ``decay_static`` the static weights get no weight decay."""
    index = 0
    for layer in layers:
        count = 3 if getattr(layer, "encoder_attn", None) is not None else 2  # (self-attention, cross-attention,) FFN
        layer.hyper_connections = nn.ModuleList(
            build_hyper_connection(kind, rate, embed_dim, index + position, sinkhorn_order)
            for position in range(count))
        index += count
        if kind in ("static", "dynamic"):
            if rescale_outputs:
                rescale_output_projections(layer, rate)
            if not decay_static:
                for connection in layer.hyper_connections:
                    exempt_from_weight_decay(connection.static_alpha, connection.static_beta)


def output_projections(layer: nn.Module) -> List[nn.Linear]:
    """The last linear map of each sublayer: attention's ``out_proj`` (self, cross) and the FFN's ``fc2``."""
    attentions = [layer.self_attn, getattr(layer, "encoder_attn", None)]
    return [attention.out_proj for attention in attentions if attention is not None] + [layer.fc2]


@torch.no_grad()
def rescale_output_projections(layer: nn.Module, rate: int) -> None:
    """Divide the initial std of the sublayers' output weights by sqrt(n) (the biases stay)."""
    for projection in output_projections(layer):
        projection.weight.div_(math.sqrt(rate))


def exempt_from_weight_decay(*parameters: nn.Parameter) -> None:
    """fairseq's per-parameter optimizer override (read by ``--optimizer adam_with_overrides`` and
    fairseq's ``composite`` optimizer): these parameters are not decayed."""
    for parameter in parameters:
        parameter.optim_overrides = {"optimizer": {"weight_decay": 0.0}}


def forward_on_streams(layer: nn.Module, streams: Tensor, encoder_out: Optional[Tensor] = None,
                       encoder_padding_mask: Optional[Tensor] = None,
                       incremental_state: Optional[IncrementalState] = None, self_attn_mask: Optional[Tensor] = None,
                       self_attn_padding_mask: Optional[Tensor] = None, need_attn: bool = False,
                       need_head_weights: bool = False):
    """fairseq's encoder or decoder layer over streams ``T x B x n x C``, with the arguments of its forward
    and what it returns. (``--cross-self-attention`` is refused at build time; NormFormer's rescalings
    cannot be set for this model.)"""
    decoder = isinstance(layer, TransformerDecoderLayerBase)
    if not decoder:  # an encoder layer's padding mask is its self-attention's
        self_attn_padding_mask, encoder_padding_mask = encoder_padding_mask, None
    connections = layer.hyper_connections  # (self-attention, cross-attention,) FFN
    pre = layer.normalize_before
    need_attn = need_attn or need_head_weights

    def self_attention(x):
        x, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                               incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask)
        return layer.dropout_module(x), None

    def cross_attention(x):
        x, weights = layer.encoder_attn(
            query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state, static_kv=True,
            need_weights=need_attn or (not layer.training and layer.need_attn), need_head_weights=need_head_weights)
        return layer.dropout_module(x), weights

    def feed_forward(x):
        x = layer.activation_dropout_module(layer.activation_fn(layer.fc1(x)))
        return layer.dropout_module(layer.fc2(x)), None

    streams, _ = connect(connections[0], streams, self_attention, layer.self_attn_layer_norm, pre)
    attention = None
    if getattr(layer, "encoder_attn", None) is not None and encoder_out is not None:
        streams, attention = connect(connections[1], streams, cross_attention, layer.encoder_attn_layer_norm, pre)
    streams, _ = connect(connections[-1], streams, feed_forward, layer.final_layer_norm, pre)
    return (streams, attention, None) if decoder else streams

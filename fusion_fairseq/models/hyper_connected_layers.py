"""fairseq's Transformer layers over hyper-connected streams (``--hyper-connections-*``).

The layers are fairseq's, with their own parameters and names, plus ``hyper_connections``, one per sublayer;
their forward takes and returns streams ``T x B x n x C`` and wraps each sublayer by
:func:`modules.hyper_connection.connect` in place of fairseq's residual connection (equations and readings
there). Dropout sits where fairseq puts it: on each sublayer's output, before the connection. The stacks build
them through fairseq's ``build_encoder_layer`` / ``build_decoder_layer``, so fairseq's activation
checkpointing wraps them as it wraps its own layers.

``--cross-self-attention`` is refused at build time; NormFormer's rescalings cannot be set for this model.
"""

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fusion_fairseq.modules.hyper_connection import build_hyper_connection, connect

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


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
    """fairseq's per-parameter optimizer override: ``--optimizer adam_with_overrides`` does not decay these
    parameters (fairseq's own optimizers ignore the override's weight decay)."""
    for parameter in parameters:
        parameter.optim_overrides = {"optimizer": {"weight_decay": 0.0}}


class HyperConnectedSublayers:
    """What hyper-connections add to fairseq's layer: a connection per sublayer, and fairseq's FFN
    sublayer as a function of its input."""

    def add_hyper_connections(self, index: int, kind: str, rate: int, sinkhorn_order: str, rescale_outputs: bool,
                              decay_static: bool) -> None:
        """One connection per sublayer of layer ``index``, the sublayers numbered over the whole stack
        (the paper's layer index k). For SHC and DHC, Zhu et al.'s recipe (Sec. 4): ``rescale_outputs``
        divides the sublayers' output projections by sqrt(n), and unless ``decay_static`` the static
        weights get no weight decay."""
        count = len(output_projections(self))  # (self-attention, cross-attention,) FFN
        self.hyper_connections = nn.ModuleList(
            build_hyper_connection(kind, rate, self.embed_dim, index * count + position, sinkhorn_order)
            for position in range(count))
        if kind in ("static", "dynamic"):
            if rescale_outputs:
                rescale_output_projections(self, rate)
            if not decay_static:
                for connection in self.hyper_connections:
                    exempt_from_weight_decay(connection.static_alpha, connection.static_beta)

    def connect(self, position: int, streams: Tensor, sublayer: Callable[[Tensor], Tuple[Tensor, Optional[Tensor]]],
                layer_norm: nn.Module) -> Tuple[Tensor, Optional[Tensor]]:
        return connect(self.hyper_connections[position], streams, sublayer, layer_norm, self.normalize_before)

    def feed_forward(self, x: Tensor) -> Tuple[Tensor, None]:
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        return self.dropout_module(self.fc2(x)), None


class HyperConnectedEncoderLayer(HyperConnectedSublayers, TransformerEncoderLayerBase):
    """fairseq's encoder layer (self-attention, FFN) over streams."""

    def __init__(self, cfg, index: int, *, kind: str, rate: int, sinkhorn_order: str = "columns-first",
                 rescale_outputs: bool = True, decay_static: bool = False):
        super().__init__(cfg)
        self.add_hyper_connections(index, kind, rate, sinkhorn_order, rescale_outputs, decay_static)

    def forward(self, streams: Tensor, encoder_padding_mask: Optional[Tensor]) -> Tensor:
        """What fairseq's encoder passes its layers."""
        def self_attention(x):
            x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask, need_weights=False)
            return self.dropout_module(x), None

        streams, _ = self.connect(0, streams, self_attention, self.self_attn_layer_norm)
        streams, _ = self.connect(-1, streams, self.feed_forward, self.final_layer_norm)
        return streams


class HyperConnectedDecoderLayer(HyperConnectedSublayers, TransformerDecoderLayerBase):
    """fairseq's decoder layer (self-attention, cross-attention, FFN) over streams."""

    def __init__(self, cfg, index: int, no_encoder_attn: bool = False, *, kind: str, rate: int,
                 sinkhorn_order: str = "columns-first", rescale_outputs: bool = True, decay_static: bool = False):
        super().__init__(cfg, no_encoder_attn)
        self.add_hyper_connections(index, kind, rate, sinkhorn_order, rescale_outputs, decay_static)

    def forward(self, streams: Tensor, encoder_out: Optional[Tensor] = None,
                encoder_padding_mask: Optional[Tensor] = None, incremental_state: Optional[IncrementalState] = None,
                self_attn_mask: Optional[Tensor] = None, self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False, need_head_weights: bool = False):
        """fairseq's decoder layer's arguments and results (streams, source attention, None)."""
        need_attn = need_attn or need_head_weights

        def self_attention(x):
            x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                                  incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask)
            return self.dropout_module(x), None

        def cross_attention(x):
            x, weights = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn), need_head_weights=need_head_weights)
            return self.dropout_module(x), weights

        streams, _ = self.connect(0, streams, self_attention, self.self_attn_layer_norm)
        attention = None
        if self.encoder_attn is not None and encoder_out is not None:
            streams, attention = self.connect(1, streams, cross_attention, self.encoder_attn_layer_norm)
        streams, _ = self.connect(-1, streams, self.feed_forward, self.final_layer_norm)
        return streams, attention, None

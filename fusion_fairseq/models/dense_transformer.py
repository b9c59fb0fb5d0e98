"""DenseNMT's ideas (Shen et al., NAACL 2018) on fairseq's Transformer: ``--arch dense_transformer``.

The paper builds DenseNMT on ConvS2S and notes that it "is agnostic to the transformation function"
(Sec. 3) and leaves self-attention networks to future work (Sec. 6). This is that mapping:

* dense encoder (Eq. 6): layer l+1 is fairseq's Transformer encoder layer of width d (the growth
  dimension) applied to a linear projection of the concatenation ``[h_l, ..., h_0]`` (reading: the
  transformation H of Eq. 6 is "project, then one Transformer layer"; the layer's own residual
  connections stay inside H);
* dense decoder (Eq. 7): likewise over ``[z_l, a_l, ..., z_1, a_1, z_0]``, z_l the layer's output
  and a_l its encoder-decoder attention's as its residual add reads it (:class:`DenseTransformerDecoderLayer`);
* summary layers (Sec. 3.3) after every SUMLEN-1 layers: a linear projection back to d0;
* dense attention (Sec. 3.2): the memory of every decoder layer's encoder-decoder attention is
  ``none``: the top encoder layer (projected to d0 when the encoder is dense); ``1`` (Eq. 9): the
  projection of the concatenation of the top block's layers, ``sum_i L_i(h_i)``; ``2`` (Eq. 10): the
  layers projected separately, one softmax per layer, contexts summed. Reading: fairseq's
  attention has one memory for keys and values, so Eq. 9/10's ``+ L(h0)`` on the values (a ConvS2S
  detail, Fig. 3a) is not used here;
* small embeddings (Sec. 4.2): ``--embed-bottleneck-dim E``: embeddings and softmax matrix of width
  E, projected to d0 (fairseq's ``project_in_dim`` on the decoder side).
"""

import argparse
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn
from fairseq.models.transformer import Linear, TransformerEncoder, TransformerModel
from fairseq.models.transformer import base_architecture as transformer_base_architecture, transformer_iwslt_de_en
from fairseq.modules import LayerNorm, PositionalEmbedding, TransformerDecoderLayer, TransformerEncoderLayer

from fusion_fairseq.checkpoint_safety import require_literal_transformer_config
from fusion_fairseq.modules.dense_attention import DenseSourceAttention
from fusion_fairseq.modules.densenmt_connection import SummaryLayer, build_dense_stack, run_dense
from fusion_fairseq.registry import register_model, register_model_architecture

from .activation_checkpointing import layer_checkpointing
from fusion_fairseq.config_fields import POSITIVE_INT, FlagsOfConfig, fill_defaults, flag, set_defaults

from .dense_fconv import DenseConfig, dense_args
from .fusion_config import TransformerFlags, decoder_dims_as_integers
from .fusion_stacks import FusionTransformerDecoder
from .fusion_transformer import build_token_embeddings
from fusion_fairseq.errors import ConfigurationError


def with_changes(args, **changes) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def build_side(stack, args, side: str, new_features: int, make_layer) -> Tuple[List[int], int]:
    """Fill ``stack.layers`` with ``--{side}-layers`` layers ``make_layer(layer_args, in_dim)``: fairseq's residual
    stack (``in_dim`` None) under ``--no-dense-{side}``, else a dense stack, each layer adding ``new_features``
    (``layer_args`` at the growth width), and its linear summary layers (Sec. 3.3). Returns the widths of the
    top block (what dense attention reads) and the stack's output width."""
    stack.call_layer = layer_checkpointing(args)  # the layers bypass fairseq's build_encoder/decoder_layer
    count, d0 = getattr(args, f"{side}_layers"), getattr(args, f"{side}_embed_dim")
    stack.num_layers = count
    if getattr(args, f"no_dense_{side}"):
        stack.layers.extend(make_layer(args, None) for _ in range(count))
        stack.layer_input_widths = [d0] * count
        return [d0] * count, d0
    layer_args = with_changes(args, **{f"{side}_embed_dim": args.growth_dim})
    layers, top_block, width = build_dense_stack(
        stack, [new_features] * count, d0, args.summary_every, lambda index, in_dim: make_layer(layer_args, in_dim),
        lambda index, in_dim: SummaryLayer(in_dim, d0, weight_norm=False))
    stack.layers.extend(layers)
    stack.layer_norm = None
    return top_block, width


class DenseTransformerEncoderLayer(TransformerEncoderLayer):
    """H of Eq. 6 for the Transformer: project the concatenated features to the layer width (in a
    dense stack, where ``in_dim`` is given), then fairseq's encoder layer."""

    def __init__(self, args, in_dim: Optional[int]):
        super().__init__(args)
        self.input_projection = Linear(in_dim, args.encoder_embed_dim) if in_dim is not None else None

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if self.input_projection is not None:
            x = self.input_projection(x)
        return super().forward(x, encoder_padding_mask, attn_mask)


class DenseTransformerDecoderLayer(TransformerDecoderLayer):
    """fairseq's decoder layer whose encoder-decoder attention is a :class:`DenseSourceAttention`
    (DenseAtt-2 groups; recording a_l for a dense decoder), with an input projection from the
    concatenated features when ``in_dim`` is given (H of Eq. 7).

    ``attention_value`` (with ``record_attention``): a_l as the layer's residual path adds it, i.e.
    after the layer's dropout, with the very mask the residual add used. Paper: Eq. 7 concatenates
    a_l beside z_l and Sec. 3.1 projects the top block's concatenation to the output; the paper
    states no dropout (its ConvS2S model drops every layer's input). Reading: a_l is one of the
    layer's outputs, so downstream layers and the output projection see it with the same dropout
    as the vanilla residual path does; in evaluation it is the attention output itself.
    """

    def __init__(self, args, in_dim: Optional[int], source_groups: int, record_attention: bool):
        self._source_groups = source_groups
        self._record_attention = record_attention
        super().__init__(args)
        self.input_projection = Linear(in_dim, args.decoder_embed_dim) if in_dim is not None else None
        self.attention_value: Optional[Tensor] = None

    def build_encoder_attention(self, embed_dim, cfg):  # fairseq's TransformerConfig
        return DenseSourceAttention(
            embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout, encoder_decoder_attention=True,
            groups=self._source_groups, record_output=self._record_attention)

    def forward(self, x, *args, **kwargs):
        if self.input_projection is not None:
            x = self.input_projection(x)
        self.attention_value = None
        if self._record_attention:
            self.encoder_attn.last_output = None  # set again only by this step's source attention
        return super().forward(x, *args, **kwargs)

    def take_attention_value(self) -> Optional[Tensor]:
        """a_l of the latest forward, then forgotten with the attention's output, so that no tensor of a forward
        outlives it (fairseq's --store-ema deep-copies the model after the first one)."""
        value, self.attention_value = self.attention_value, None
        if self._record_attention:
            self.encoder_attn.last_output = None
        return value

    def residual_connection(self, x, residual):
        # fairseq calls this with each sub-layer's dropped-out output; the first call after the
        # source attention has run carries a_l with the dropout mask its residual add uses
        if self._record_attention and self.attention_value is None and self.encoder_attn.last_output is not None:
            self.attention_value = x
        return super().residual_connection(x, residual)


class DenseTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(with_changes(args, encoder_layers=0), dictionary, embed_tokens)
        self.embed_dim = d0 = args.encoder_embed_dim
        self.dense, self.dense_attention = not args.no_dense_encoder, args.dense_attention
        self.embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(d0)
        token_dim = embed_tokens.embedding_dim
        self.project_in_dim = Linear(token_dim, d0, bias=False) if token_dim != d0 else None
        if token_dim != d0:
            if self.embed_positions is not None:
                self.embed_positions = PositionalEmbedding(
                    args.max_source_positions, d0, self.padding_idx, learned=args.encoder_learned_pos)
            if self.layernorm_embedding is not None:
                self.layernorm_embedding = LayerNorm(d0)
        top_block, _ = build_side(self, args, "encoder", args.growth_dim, DenseTransformerEncoderLayer)
        sources = top_block[-1:] if self.dense_attention == "none" else top_block
        self.source_projections = (nn.ModuleList(Linear(width, d0) for width in sources)
                                   if self.dense or self.dense_attention != "none" else None)
        self.num_sources = len(sources) if self.dense_attention == "2" else 1

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None):
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        tokens = self.embed_tokens(src_tokens) if token_embeddings is None else token_embeddings
        x = embedding = self.embed_scale * tokens
        if self.project_in_dim is not None:
            x = embedding = self.project_in_dim(x)
        if self.embed_positions is not None:
            x = x + self.embed_positions(src_tokens)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)
        layer_mask = padding_mask if has_pads else None

        if self.dense:
            states = run_dense(
                x, len(self.layers),
                lambda index, features: [self.call_layer(self.layers[index], features, encoder_padding_mask=layer_mask)],
                self.summaries, lambda summary, features: summary(features),
            ).top_block()  # Eq. 6
        else:
            states = []
            for layer in self.layers:
                x = self.call_layer(layer, x, encoder_padding_mask=layer_mask)
                states.append(x)
            if self.layer_norm is not None:
                states[-1] = self.layer_norm(states[-1])

        memory_mask = padding_mask
        if self.dense_attention == "none":
            memory = states[-1] if self.source_projections is None else self.source_projections[0](states[-1])
        else:
            projected = [projection(state) for projection, state in zip(self.source_projections, states)]
            if self.dense_attention == "1":
                memory = torch.stack(projected, dim=0).sum(dim=0)  # Eq. 9: L([{h_i}])
            else:
                memory = torch.cat(projected, dim=0)  # Eq. 10: one group of positions per layer
                memory_mask = padding_mask.repeat(1, len(projected))
        return {
            "encoder_out": [memory],
            "encoder_padding_mask": [memory_mask],
            "encoder_embedding": [embedding],
            "encoder_states": states if return_all_hiddens else [],
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_lengths] if src_lengths is not None else [],
        }


class DenseTransformerDecoder(FusionTransformerDecoder):
    """The fusion decoder's stack wiring (embedding, per-layer calls, alignment, output) around a
    dense stack (Eq. 7) or fairseq's residual one."""

    def __init__(self, args, dictionary, embed_tokens, source_groups: int):
        super().__init__(with_changes(args, decoder_layers=0), dictionary, embed_tokens, no_encoder_attn=False)
        self.dense = not args.no_dense_decoder
        # Eq. 7: every dense layer adds z_l and a_l, d features each (a_l recorded)
        _, top = build_side(self, args, "decoder", 2 * args.growth_dim, lambda layer_args, in_dim:
                            DenseTransformerDecoderLayer(layer_args, in_dim, source_groups, self.dense))
        self.aggregation.num_layers = self.num_layers
        # Sec. 3.1: the output is a linear transformation of the concatenation of the top block
        self.project_out_dim = Linear(top, self.output_embed_dim, bias=False) if top != self.output_embed_dim else None

    def run_layer(self, index: int, states: List[Tensor], *args, **kwargs):
        return self.call_layer(self.layers[index], *args, **kwargs)

    def run_stack(self, x: Tensor, apply_layer):
        if not self.dense:
            return super().run_stack(x, apply_layer)
        inner_states = [x]

        def dense_layer(index: int, features: Tensor):
            inner_states.append(apply_layer(index, features, inner_states))
            # Eq. 7: [z_l, a_l], a_l dropped out as in the residual add
            return inner_states[-1], self.layers[index].take_attention_value()

        features = run_dense(x, self.num_layers, dense_layer, self.summaries, lambda summary, features: summary(features))
        return features.concat(), inner_states


@dataclass
class DenseTransformerConfig(DenseConfig, TransformerFlags):
    """``--arch dense_transformer``: fairseq's Transformer flags and DenseNMT's; the growth
    dimension defaults to half the embedding size."""

    growth_dim: Optional[int] = flag(
        None, "hidden size of every dense layer: the new features it adds (Eq. 6/7); default half the embedding size",
        values=POSITIVE_INT, structural=True)


@register_model("dense_transformer", dataclass=DenseTransformerConfig)
class DenseTransformerModel(FlagsOfConfig, TransformerModel):
    """DenseNMT's dense encoder/decoder, dense attention, summary layers and small embeddings on
    fairseq's Transformer."""

    @classmethod
    def build_model(cls, args, task):
        args = dense_args(args, dense_transformer, DenseTransformerConfig,
                          ("encoder_layers_to_keep", "decoder_layers_to_keep", "encoder_layerdrop", "decoder_layerdrop",
                           # DenseNMT's decoder attends to the source in every layer (Sec. 3.2), over the target
                           # only; its encoder embeds without fairseq's quantisation noise layer
                           "no_cross_attention", "cross_self_attention", "quant_noise_pq"),
                          softmax_dim="decoder_output_dim")
        require_literal_transformer_config(args)  # before fairseq's layers eval() them
        check_dense_transformer_widths(args)
        encoder_embed, decoder_embed = build_token_embeddings(
            cls, args, task, args.embed_bottleneck_dim or args.encoder_embed_dim,
            args.embed_bottleneck_dim or args.decoder_embed_dim)
        encoder = DenseTransformerEncoder(args, task.source_dictionary, encoder_embed)
        decoder = DenseTransformerDecoder(args, task.target_dictionary, decoder_embed, encoder.num_sources)
        return cls(args, encoder, decoder)


def check_dense_transformer_widths(args) -> None:
    """What the attention of each side and a tied output projection need of the widths (``dense_args`` checks
    the rest): a ``ConfigurationError`` naming the flags and values."""
    for side in ("encoder", "decoder"):
        heads = getattr(args, f"{side}_attention_heads")
        dense = not getattr(args, f"no_dense_{side}")
        width = args.growth_dim if dense else getattr(args, f"{side}_embed_dim")
        if width % heads:
            flag = "--growth-dim" if dense else f"--{side}-embed-dim"
            raise ConfigurationError(f"{flag} {width} must be divisible by --{side}-attention-heads {heads}")
    tied = ("--share-all-embeddings" if args.share_all_embeddings else "--share-decoder-input-output-embed"
            if args.share_decoder_input_output_embed else None)
    target_width = args.embed_bottleneck_dim or args.decoder_embed_dim
    if tied and args.decoder_output_dim != target_width:
        raise ConfigurationError(f"{tied} needs --decoder-output-dim {args.decoder_output_dim} to equal the target "
                                 f"embedding width {target_width}")


@register_model_architecture("dense_transformer", "dense_transformer")
def dense_transformer(args):
    """Defaults: fairseq's ``transformer`` widths; growth dimension half the embedding size."""
    transformer_base_architecture(args)
    decoder_dims_as_integers(args)
    fill_defaults(args, DenseTransformerConfig)
    if args.growth_dim is None:
        args.growth_dim = args.encoder_embed_dim // 2


@register_model_architecture("dense_transformer", "dense_transformer_iwslt_de_en")
def dense_transformer_iwslt_de_en(args):
    """The dense counterpart of fairseq's ``transformer_iwslt_de_en`` (6 + 6 layers, d_model 512,
    FFN 1024, 4 heads): embedding size d0 = 512, growth (layer width) 384, FFN 1024, DenseAtt-2 and
    summary layers with sumlen = 4 (one after layer 3 of 6), chosen so that the model has about the
    size of the residual baseline (41.6M vs 42.9M parameters, see examples/dense_nmt/README.md)."""
    set_defaults(args, growth_dim=384, summary_every=4)
    transformer_iwslt_de_en(args)
    dense_transformer(args)

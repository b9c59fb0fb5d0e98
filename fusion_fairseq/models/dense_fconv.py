"""DenseNMT on ConvS2S: "Dense Information Flow for Neural Machine Translation" (Shen et al.,
NAACL 2018), ``--arch dense_fconv`` and the paper's presets.

Subclasses of fairseq's convolutional model (``fairseq.models.fconv``), which keeps the embeddings,
positions, dropout, ``max_positions`` and the incremental machinery (``LinearizedConvolution`` input
buffers); the layer stacks are rebuilt with a dense encoder (Eq. 6: layer l+1 reads ``[h_l, ..., h_0]``),
a dense decoder (Eq. 7: ``[z_l, a_l, ..., z_1, a_1, z_0]``), dense attention over every layer of the top
block (Sec. 3.2: ``--dense-attention 1`` Eq. 9, ``2`` Eq. 10), summary layers (Sec. 3.3,
``--summary-every``) and small embeddings (Sec. 4.2, ``--embed-bottleneck-dim``).
``--no-dense-encoder`` / ``--no-dense-decoder`` give ConvS2S's residual stacks for the ablations of
Table 2 (both off with ``--dense-attention 2``: DenseAtt-4L; all three off: BASE, ConvS2S itself).

Each ``(d, k)`` of ``--encoder-layers`` / ``--decoder-layers`` (fairseq's ConvS2S syntax) is a layer's
hidden size d (a dense side's growth dimension, a residual side's width) and kernel width k;
``--growth-dim`` replaces every d at once.
"""

import argparse
import logging
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.models.fconv import (
    ConvTBC, Embedding, FConvDecoder, FConvEncoder, FConvModel, Linear, LinearizedConv1d, extend_conv_spec,
    base_architecture as fconv_base_architecture, fconv_iwslt_de_en, fconv_wmt_en_de,
)
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.modules import GradMultiply
from omegaconf import II

from fusion_fairseq.checkpoint_safety import parse_config_literal
from fusion_fairseq.modules.dense_attention import DENSE_ATTENTION_KINDS, DenseConvAttention, weight_normed_linear
from fusion_fairseq.modules.densenmt_connection import SummaryLayer, build_dense_stack, run_dense, summary_positions
from fusion_fairseq.registry import register_model, register_model_architecture

from fusion_fairseq.config_fields import (
    POSITIVE_INT, PROBABILITY, FlagsOfConfig, Values, as_namespace, check_values, fill_defaults, flag, flag_of,
    set_defaults, warn_idle_flags,
)
from fusion_fairseq.errors import ConfigurationError

logger = logging.getLogger(__name__)

# A placeholder stack for fairseq's constructors, whose own layers are replaced right away.
_PLACEHOLDER_SPEC = ((1, 1),)


SUMMARY_INTERVAL = Values(
    "must be 0 (no summary layers) or an integer >= 2 (the paper's sumlen: one summary layer after every sumlen-1 "
    "layers)", lambda value: type(value) is int and (value == 0 or value >= 2), int)


@dataclass
class DenseConfig(FairseqDataclass):
    """DenseNMT's flags (Shen et al. 2018), common to its ConvS2S and Transformer models."""

    dropout: float = flag(0.1, "dropout probability", values=PROBABILITY)
    growth_dim: Optional[int] = flag(
        None, "hidden size of every layer: the new features each dense layer adds (Eq. 6/7), the width of a residual "
        "side unless --residual-dim is set (default: the per-layer sizes of the architecture)",
        values=POSITIVE_INT, structural=True)
    summary_every: int = flag(
        0, "Sec. 3.3 sumlen: one summary layer (projection back to the embedding size) after every SUMLEN-1 layers "
        "of a dense side; 0 = none (paper: 5 or 6 for deep models)", values=SUMMARY_INTERVAL, structural=True)
    dense_attention: ChoiceEnum(DENSE_ATTENTION_KINDS) = flag(
        "2", "none: multi-step attention over the top encoder layer; 1: DenseAtt-1 (Eq. 9); 2: DenseAtt-2 (Eq. 10)",
        structural=True)
    embed_bottleneck_dim: Optional[int] = flag(
        None, "Sec. 4.2: source/target embeddings and softmax matrix of width E, projected back to the embedding "
        "size (must not exceed it)", values=POSITIVE_INT, structural=True)
    no_dense_encoder: bool = flag(False, "ablation (Table 2): residual encoder", structural=True)
    no_dense_decoder: bool = flag(False, "ablation (Table 2): residual decoder", structural=True)


@dataclass
class DenseFConvConfig(DenseConfig):
    """``--arch dense_fconv``: fairseq's ConvS2S flags (``FConvModel.add_args``, which has no dataclass)
    and DenseNMT's, with the defaults of fairseq's ``fconv`` architecture."""

    encoder_embed_dim: int = field(default=512, metadata={"help": "encoder embedding dimension"})
    encoder_embed_path: Optional[str] = field(default=None, metadata={"help": "path to pre-trained encoder embedding"})
    encoder_layers: str = field(default="[(512, 3)] * 20", metadata={"help": "encoder layers [(dim, kernel_size), ...]"})
    decoder_embed_dim: int = field(default=512, metadata={"help": "decoder embedding dimension"})
    decoder_embed_path: Optional[str] = field(default=None, metadata={"help": "path to pre-trained decoder embedding"})
    decoder_layers: str = field(default="[(512, 3)] * 20", metadata={"help": "decoder layers [(dim, kernel_size), ...]"})
    decoder_out_embed_dim: int = field(default=256, metadata={"help": "decoder output embedding dimension"})
    share_input_output_embed: bool = field(default=False, metadata={"help": "share input and output embeddings"})
    # the task's flags (no help: no flag of the model's)
    max_source_positions: Optional[int] = II("task.max_source_positions")
    max_target_positions: Optional[int] = II("task.max_target_positions")

    summary_layer: ChoiceEnum(("conv", "linear")) = flag(
        "conv", "Sec. 3.3 summary layer: conv = a convolution layer + GLU of the stack's kernel width (default; "
        "reproduces En-De-15's 20%% fewer parameters than ConvS2S), linear = a position-wise linear projection",
        structural=True)
    residual_dim: Optional[int] = flag(
        None, "width of every layer of a residual side (--no-dense-encoder/--no-dense-decoder): the residual BASE "
        "model's (Table 2 ablations keep it; default: the IWSLT presets' BASE-4L 256 / BASE-8L 192, else the layer "
        "sizes)", values=POSITIVE_INT, structural=True)
    decoder_attention: str = flag("True", "decoder attention [True, ...]")


def idle_dense_flags(args) -> dict:
    """{flag: (what it acts on, why that is absent)} of DenseNMT's flags whose feature the configuration lacks."""
    idle = {}
    if args.no_dense_encoder and args.no_dense_decoder:
        idle["growth_dim"] = ("it is the dense layers' width", "both --no-dense-encoder and --no-dense-decoder are set")
    if hasattr(args, "summary_layer") and args.summary_every == 0:
        idle["summary_layer"] = ("it is the kind of the summary layers", "--summary-every is 0 (no summary layers)")
    if hasattr(args, "residual_dim") and not (args.no_dense_encoder or args.no_dense_decoder):
        idle["residual_dim"] = ("it is the width of a residual side",
                                "neither --no-dense-encoder nor --no-dense-decoder is set")
    if hasattr(args, "decoder_attention"):
        idle["decoder_attention"] = ("the dense_fconv decoder attends to the source in every layer (Sec. 3.2)",
                                     "it cannot be switched off")
    return idle


def dense_args(cfg, architecture, config, unsupported: Sequence[str], softmax_dim: str) -> argparse.Namespace:
    """The args a DenseNMT model builds from, with the defaults of ``architecture`` (its base architecture):
    errors naming the flag, the value and what is allowed for args that did not come through argparse (or
    combinations argparse cannot see) and for the fairseq flags ``unsupported``; warnings for idle flags."""
    args = as_namespace(cfg)
    architecture(args)
    check_values(args, config)
    for side in ("encoder", "decoder"):
        width = getattr(args, f"{side}_embed_dim")
        if args.embed_bottleneck_dim is not None and args.embed_bottleneck_dim > width:
            raise ConfigurationError(
                f"--embed-bottleneck-dim {args.embed_bottleneck_dim} is wider than --{side}-embed-dim {width}: the "
                f"small embeddings are projected back to the model width, so it must be at most {width}")
    if args.summary_every and args.no_dense_encoder and args.no_dense_decoder:
        raise ConfigurationError(
            f"--summary-every {args.summary_every} needs a dense side: summary layers only exist in dense stacks, "
            "and both --no-dense-encoder and --no-dense-decoder are set (use --summary-every 0)")
    for name in unsupported:
        if getattr(args, name, None):
            raise ConfigurationError(
                f"{flag_of(name)} {getattr(args, name)!r} is not supported by {architecture.__name__}")
    idle = idle_dense_flags(args)
    if args.embed_bottleneck_dim is not None:  # Sec. 4.2: the softmax matrix shrinks with the embeddings (below)
        idle[softmax_dim] = ("the softmax matrix takes the small embeddings' width (Sec. 4.2)",
                             f"--embed-bottleneck-dim is {args.embed_bottleneck_dim}")
    unset = argparse.Namespace(**{name: value for name, value in vars(args).items() if name not in idle})
    ARCH_CONFIG_REGISTRY.get(getattr(args, "arch", None) or getattr(args, "_name", None), architecture)(unset)
    warn_idle_flags(args, idle, vars(unset))  # a preset's own value is not the user's
    # a warning, not an error (checkpoints trained with it keep loading), when --summary-every builds no
    # summary layer; --{side}-layers is a count (dense Transformer) or a ConvS2S layer spec (dense ConvS2S)
    depths = {}
    for side in ("encoder", "decoder"):
        if not getattr(args, f"no_dense_{side}"):
            layers = getattr(args, f"{side}_layers")
            depths[side] = layers if isinstance(layers, int) else len(layer_spec(layers, f"--{side}-layers", None))
    if args.summary_every and not any(summary_positions(depth, args.summary_every) for depth in depths.values()):
        stacks = ", ".join(f"{side} {depth}" for side, depth in depths.items())
        logger.warning("flag without effect: --summary-every %d builds no summary layer (one follows every %d "
                       "layers below the top layer; dense layers: %s)", args.summary_every, args.summary_every - 1, stacks)
    args.max_source_positions = getattr(args, "max_source_positions", None) or 1024
    args.max_target_positions = getattr(args, "max_target_positions", None) or 1024
    if args.embed_bottleneck_dim is not None:
        setattr(args, softmax_dim, args.embed_bottleneck_dim)
    return args


def layer_spec(spec_text: str, flag: str, growth_dim: Optional[int]) -> List[Tuple[int, int]]:
    """``[(d, k), ...]`` from fairseq's ConvS2S layer syntax, ``d`` replaced by ``--growth-dim``. The text may
    come from a checkpoint, so it is parsed as a literal (with ``[...] * N + [...]``), never evaluated."""
    spec = parse_config_literal(spec_text, flag)
    try:
        spec = extend_conv_spec(spec)
    except Exception as error:  # noqa: BLE001 - any malformed structure
        raise ConfigurationError(f"{flag} must be a list of (hidden size, kernel width) pairs, got {spec_text!r}: {error}")
    if len(spec) == 0:
        raise ConfigurationError(f"{flag} must describe at least one layer, got {spec_text!r}")
    layers = []
    for width, kernel, residual in spec:
        if residual not in (0, 1):
            raise ConfigurationError(f"{flag}: only residual=1 (previous layer) is supported, got {residual} in {spec_text!r}")
        width = growth_dim if growth_dim is not None else width
        if type(width) is not int or type(kernel) is not int:
            raise ConfigurationError(f"{flag}: hidden sizes and kernel widths must be integers, got {(width, kernel)} in {spec_text!r}")
        if width <= 0 or kernel <= 0:
            raise ConfigurationError(f"{flag}: hidden sizes and kernel widths must be positive, got {(width, kernel)}")
        layers.append((width, kernel))
    return layers


class SmallEmbedding(nn.Module):
    """Sec. 4.2: a token embedding of width E (the bottleneck) projected to the model width d0
    by a linear transformation ("project each word back to the original embedding dimension").
    Reading: the positions are added after the projection, at width d0."""

    def __init__(self, num_embeddings: int, bottleneck_dim: int, embed_dim: int, padding_idx: int):
        super().__init__()
        self.tokens = Embedding(num_embeddings, bottleneck_dim, padding_idx)
        self.project = weight_normed_linear(bottleneck_dim, embed_dim)
        self.padding_idx = padding_idx
        self.embedding_dim = embed_dim

    @property
    def weight(self):
        return self.tokens.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.project(self.tokens(tokens))


def build_side(stack, args, side: str, growth: int, make_layer, make_conv) -> Tuple[list, List[int], int]:
    """One side of a ConvS2S ``stack`` (built with the placeholder spec): its token embeddings (small ones,
    Sec. 4.2) and its layers ``make_layer(in_dim, width, kernel)``, returned in order with the widths of the
    top block (what dense attention reads) and the output width.

    Dense: layer i adds ``growth`` times its width d (Eq. 6/7); a summary layer (Sec. 3.3) is
    ``make_conv(in_dim, d0, kernel)`` with the kernel of the layer below it, or a linear one.
    Residual (ConvS2S): fc1 from the embedding to the first width, then per layer a projection of
    the residual where the width changes."""
    dropout, stack.dense = args.dropout, not getattr(args, f"no_dense_{side}")
    layers = layer_spec(getattr(args, f"{side}_layers"), f"--{side}-layers", args.growth_dim)
    if not stack.dense and args.residual_dim is not None:
        # A residual side in a dense model (the Table 2 ablations) has the residual BASE model's width, not
        # the growth size: "based on the residual connected BASE-4L model, DenseENC-4L only makes encoder
        # side dense" and the 4-layer models have "roughly the same number of parameters". Sec. 4.2 also says
        # "both DenseENC-4L and DenseDEC-4L use hidden size 128", read as the dense side's growth size: a
        # residual side of 128 leaves the two 18% and 9% smaller than BASE-4L (examples/dense_nmt/README.md).
        layers = [(args.residual_dim, kernel) for _, kernel in layers]
    stack.embed_dim = embed_dim = getattr(args, f"{side}_embed_dim")
    vocabulary, pad = len(stack.dictionary), stack.dictionary.pad()
    stack.embed_tokens = (Embedding(vocabulary, embed_dim, pad) if args.embed_bottleneck_dim is None
                          else SmallEmbedding(vocabulary, args.embed_bottleneck_dim, embed_dim, pad))
    if stack.dense:
        stack.input_projection = stack.residual_projections = None
        return build_dense_stack(
            stack, [growth * width for width, _ in layers], embed_dim, args.summary_every,
            lambda index, in_dim: make_layer(in_dim, *layers[index]),
            lambda index, in_dim: make_conv(in_dim, embed_dim, layers[index][1])
            if args.summary_layer == "conv" else SummaryLayer(in_dim, embed_dim, dropout))
    stack.summaries = nn.ModuleDict()
    stack.input_projection = Linear(embed_dim, layers[0][0], dropout=dropout)  # ConvS2S's fc1
    stack.residual_projections, built, stack.layer_input_widths, previous = nn.ModuleList(), [], [], layers[0][0]
    for width, kernel in layers:
        stack.residual_projections.append(Linear(previous, width) if previous != width else None)
        built.append(make_layer(previous, width, kernel))
        stack.layer_input_widths.append(previous)
        previous = width
    return built, [width for width, _ in layers], previous


def run_residual(x: Tensor, projections, apply_layer) -> List[Tensor]:
    """ConvS2S's residual stack over ``x`` (after fc1): each layer's output, ``apply_layer(index, x)``."""
    states = []
    for index, projection in enumerate(projections):
        residual = x if projection is None else projection(x)
        x = (apply_layer(index, x) + residual) * math.sqrt(0.5)
        states.append(x)
    return states


class DenseFConvEncoder(FConvEncoder):
    """ConvS2S encoder with a dense (Eq. 6) or residual stack and the keys/values of dense attention.

    Output ``encoder_out``: ``(keys, values)``, each ``(batch, sources, src_len, d0)``: one source
    (the top layer, Gehring et al.'s multi-step attention; or the mixed projection of all layers of
    the top block, DenseAtt-1) or one per layer of the top block (DenseAtt-2). Keys are
    ``L_i(h_i)`` (zero at padding), values ``(keys + e) * sqrt(1/2)`` with ``e`` the input embedding.
    """

    def __init__(self, args, dictionary):
        super().__init__(dictionary, embed_dim=args.encoder_embed_dim, max_positions=args.max_source_positions,
                         convolutions=_PLACEHOLDER_SPEC, dropout=args.dropout)
        del self.fc1, self.fc2, self.projections, self.convolutions, self.residuals
        self.dense_attention = args.dense_attention

        def conv(in_dim: int, out_dim: int, kernel: int):
            return ConvTBC(in_dim, out_dim * 2, kernel, dropout=args.dropout, padding=kernel // 2 if kernel % 2 else 0)

        self.layer_convolutions = nn.ModuleList()  # first: checkpoints' parameters keep their order
        convolutions, top_block, _ = build_side(self, args, "encoder", 1, conv, conv)
        self.layer_convolutions.extend(convolutions)
        # L_i of Eq. 9/10 (ConvS2S's fc2 for the top layer when dense attention is off)
        sources = top_block[-1:] if self.dense_attention == "none" else top_block
        self.source_projections = nn.ModuleList(Linear(width, self.embed_dim) for width in sources)
        self.num_sources = len(sources) if self.dense_attention == "2" else 1

    def convolve(self, conv, x: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """Conv + GLU (Eq. 5) over ``src_len x batch x C``, padding zeroed first as ConvS2S does; a
        linear summary layer (Sec. 3.3) is a projection."""
        if isinstance(conv, SummaryLayer):
            return conv(x)
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.t().unsqueeze(-1), 0)
        x = self.dropout_module(x)
        kernel = conv.kernel_size[0]
        if kernel % 2 == 0:
            x = F.pad(x, (0, 0, 0, 0, (kernel - 1) // 2, kernel // 2))
        return F.glu(conv(x), dim=2)

    def forward(self, src_tokens, src_lengths=None, **unused):
        embedded = self.dropout_module(self.embed_tokens(src_tokens) + self.embed_positions(src_tokens))
        padding_mask = src_tokens.eq(self.padding_idx)
        if not padding_mask.any():
            padding_mask = None
        x = embedded.transpose(0, 1)  # the states the attention may read, src_len x batch x C: the top block
        if self.dense:
            states = run_dense(
                x, len(self.layer_convolutions),
                lambda index, features: [self.convolve(self.layer_convolutions[index], features, padding_mask)],  # Eq. 6
                self.summaries, lambda summary, features: self.convolve(summary, features, padding_mask),
            ).top_block()
        else:
            states = run_residual(self.input_projection(x), self.residual_projections,
                                  lambda index, x: self.convolve(self.layer_convolutions[index], x, padding_mask))
        if self.dense_attention == "none":
            states = states[-1:]
        keys = []
        for projection, state in zip(self.source_projections, states):
            key = projection(state.transpose(0, 1))
            if padding_mask is not None:
                key = key.masked_fill(padding_mask.unsqueeze(-1), 0)
            keys.append(GradMultiply.apply(key, 1.0 / (2.0 * self.num_attention_layers)))
        if self.dense_attention == "2":
            keys = torch.stack(keys, dim=1)  # Eq. 10: one source per layer
        else:
            keys = torch.stack(keys, dim=0).sum(dim=0, keepdim=True).transpose(0, 1)  # Eq. 9: L([{h_i}])
        # Eq. 9/10 values L(.) + L(h0). Reading: as multi-step attention (Fig. 3a), the key plus the
        # input embedding, scaled by sqrt(1/2) - the same parameters for DenseAtt-1 and -2, as the
        # paper states ("while maintaining the same number of parameters").
        values = (keys + embedded.unsqueeze(1)) * math.sqrt(0.5)
        return {"encoder_out": (keys, values), "encoder_padding_mask": padding_mask}


class DenseFConvDecoder(FConvDecoder):
    """ConvS2S decoder with a dense (Eq. 7) or residual stack; every layer attends the encoder
    (multi-step / DenseAtt-1 / DenseAtt-2, whichever the encoder prepared).

    Incremental decoding: each layer's ``LinearizedConvolution`` buffers its last k inputs (a dense
    layer's: the concatenation it reads), reordered by fairseq with every sub-module's
    ``reorder_incremental_state``; fairseq reorders the encoder's keys/values itself.
    """

    def __init__(self, args, dictionary):
        embed_dim, dropout, out_embed_dim = args.decoder_embed_dim, args.dropout, args.decoder_out_embed_dim
        super().__init__(dictionary, embed_dim=embed_dim, out_embed_dim=out_embed_dim,
                         max_positions=args.max_target_positions, convolutions=_PLACEHOLDER_SPEC, attention=True,
                         dropout=dropout, share_embed=False)
        del self.fc1, self.fc2, self.fc3, self.projections, self.convolutions, self.attention, self.residuals

        def causal_conv(in_dim, out_dim, kernel):
            return LinearizedConv1d(in_dim, 2 * out_dim, kernel, padding=kernel - 1, dropout=dropout)

        def layer(in_dim, width, kernel):  # Eq. 7: a dense layer adds its hidden state z (d) and attention value a (d)
            conv = causal_conv(in_dim, width, kernel)
            return conv, DenseConvAttention(width, embed_dim, residual=args.no_dense_decoder)

        self.convolutions, self.attention = nn.ModuleList(), nn.ModuleList()  # first, as in the encoder
        built, _, top_width = build_side(self, args, "decoder", 2, layer, causal_conv)
        self.convolutions.extend(conv for conv, _ in built)
        self.attention.extend(attention for _, attention in built)
        # Sec. 3.1: "the output of the decoder is a linear transformation of the concatenation of
        # all layers" (of the top block with summary layers); ConvS2S's fc2 for a residual stack.
        self.fc2 = Linear(top_width, out_embed_dim)
        if args.share_input_output_embed:
            token_table = self.embed_tokens.weight
            if token_table.size(1) != out_embed_dim:
                raise ConfigurationError(
                    f"--share-input-output-embed needs the softmax width {out_embed_dim} to equal the token "
                    f"embedding width {token_table.size(1)}")
            self.fc3 = nn.Linear(out_embed_dim, len(dictionary))
            self.fc3.weight = token_table
        else:
            self.fc3 = Linear(out_embed_dim, len(dictionary), dropout=dropout)

    def convolve(self, conv, x: Tensor, incremental_state) -> Tensor:
        """Causal conv + GLU over ``batch x tgt x C`` (one position per call when incremental); a
        linear summary layer (Sec. 3.3) is a projection, a conv one buffers its input as a layer does."""
        if isinstance(conv, SummaryLayer):
            return conv(x)
        x = self.dropout_module(x)
        if incremental_state is None:
            return F.glu(conv(x.transpose(0, 1)), dim=2).transpose(0, 1)
        return F.glu(conv(x, incremental_state), dim=2)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        keys, values = encoder_out["encoder_out"]
        padding_mask = encoder_out["encoder_padding_mask"]
        positions = self.embed_positions(prev_output_tokens, incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        target_embedding = self.dropout_module(self.embed_tokens(prev_output_tokens) + positions)

        layer_weights = []  # summed: the layers' mean attention weights, for --print-alignment

        def apply_layer(index: int, features: Tensor):
            z = self.convolve(self.convolutions[index], features, incremental_state)
            a, weights = self.attention[index](z, target_embedding, keys, values, padding_mask)
            if not self.training and self.need_attn:
                layer_weights.append(weights / len(self.attention))
            return z, a  # Eq. 7: [z_l, a_l] join a dense stack; a residual layer outputs a (z added, as ConvS2S)

        if self.dense:
            x = run_dense(target_embedding, len(self.convolutions), apply_layer, self.summaries,
                          lambda summary, features: self.convolve(summary, features, incremental_state)).concat()
        else:
            x = run_residual(self.input_projection(target_embedding), self.residual_projections,
                             lambda index, x: apply_layer(index, x)[1])[-1]
        x = self.fc3(self.dropout_module(self.fc2(x)))
        # as fairseq's Transformer decoder: fairseq's --print-alignment reads extra["attn"][0]
        return x, {"attn": [sum(layer_weights) if layer_weights else None]}


@register_model("dense_fconv", dataclass=DenseFConvConfig)
class DenseFConvModel(FlagsOfConfig, FConvModel):
    """DenseNMT (Shen et al. 2018) on fairseq's ConvS2S."""

    @classmethod
    def build_model(cls, args, task):
        args = dense_args(args, dense_fconv, DenseFConvConfig, ("encoder_embed_path", "decoder_embed_path"),
                          softmax_dim="decoder_out_embed_dim")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ConfigurationError(
                f"--encoder-embed-dim {args.encoder_embed_dim} and --decoder-embed-dim {args.decoder_embed_dim} "
                "must be equal: the attention adds the target embedding to the query it compares with the keys")
        return cls(DenseFConvEncoder(args, task.source_dictionary), DenseFConvDecoder(args, task.target_dictionary))


@register_model_architecture("dense_fconv", "dense_fconv")
def dense_fconv(args):
    """Defaults: DenseNMT-4L-2's structure (Sec. 4.2) at ConvS2S's default width.

    Paper: Sec. 3.3, summary layers "summarize the features for all previous layers and project back
    to the embedding size". Reading: a convolution layer of the stack (the kernel width of the layer
    below it, GLU; causal in the decoder), not a position-wise linear projection: it is what gives
    DenseNMT-En-De-15 "20% fewer parameters" than ConvS2S (Sec. 5.4, see :func:`dense_fconv_wmt_en_de`);
    ``--summary-layer linear`` keeps the other reading."""
    fconv_base_architecture(args)
    fill_defaults(args, DenseFConvConfig)


@register_model_architecture("dense_fconv", "dense_fconv_iwslt_de_en")
def dense_fconv_iwslt_de_en(args):
    """DenseNMT-4L-2 (Sec. 4.2, Table 1): 4-layer encoder and decoder, embedding size 256, hidden
    (growth) size 128 "in order to keep the model size consistent" with BASE-4L (256 everywhere),
    DenseAtt-2, no summary layers; ``--dense-attention 1`` gives DenseNMT-4L-1."""
    set_defaults(args, encoder_layers="[(128, 3)] * 4", decoder_layers="[(128, 3)] * 4",
                 residual_dim=256)  # BASE-4L's width, for the Table 2 ablations
    fconv_iwslt_de_en(args)  # embedding 256
    dense_fconv(args)


@register_model_architecture("dense_fconv", "dense_fconv_iwslt_de_en_8l")
def dense_fconv_iwslt_de_en_8l(args):
    """DenseNMT-8L-2 (Sec. 4.2): 8 layers each side, growth 96 (BASE-8L: 192), embedding 256.
    Reading: summary layers with sumlen = 5 (one after layer 4; "in practice, we set sumlen as 5 or
    6", Sec. 3.3), linear ones: Sec. 4.2 wants the model about BASE-8L's size, and with IWSLT14
    vocabularies it has 1.10 times BASE-8L's parameters with linear summary layers, 1.30 with conv
    ones, 1.33 without (see examples/dense_nmt/README.md). No single summary-layer reading gives both
    this preset's "similar number of parameters" and En-De-15's "20% fewer parameters" than ConvS2S;
    each preset takes the one that reproduces its own."""
    set_defaults(args, encoder_layers="[(96, 3)] * 8", decoder_layers="[(96, 3)] * 8",
                 residual_dim=192, summary_layer="linear", summary_every=5)  # BASE-8L's width
    dense_fconv_iwslt_de_en(args)


@register_model_architecture("dense_fconv", "dense_fconv_wmt_en_de")
def dense_fconv_wmt_en_de(args):
    """DenseNMT-En-De-15 (Sec. 4.2): Gehring et al.'s best WMT14 En-De model (``fconv_wmt_en_de``:
    9 x (512, 3), 4 x (1024, 3), 2 x (2048, 1), embedding 768) with dense connections, DenseAtt-2 and
    sumlen = 6; "the hidden number in each layer is 1/4 that of the original model, while the
    kernel size maintains the same". Reading: the 15 layers are convolution layers; the two
    summary layers (after layers 5 and 10) come on top, as convolution layers (k = 3, GLU): 0.794 of
    ``fconv_wmt_en_de``'s parameters with 40k vocabularies, the paper's "20% fewer" (linear summary
    layers: 0.661)."""
    layers = "[(128, 3)] * 9 + [(256, 3)] * 4 + [(512, 1)] * 2"
    set_defaults(args, encoder_layers=layers, decoder_layers=layers, summary_every=6)
    fconv_wmt_en_de(args)
    dense_fconv(args)

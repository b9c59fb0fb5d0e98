"""The configuration of the layer-fusion Transformer: its flags as one fairseq dataclass
(:class:`FusionTransformerConfig`), the derived defaults, and :func:`check_fusion_args`, the one
function that checks their values and combinations."""

import dataclasses
import re
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Dict, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models.transformer import TransformerConfig

from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.modules import FUSION_FUNCTIONS, LAYER_ATTENTION_KINDS, SURFACE_FUSION_KINDS
from fusion_fairseq.modules.aggregation_node import AGGREGATION_FUNCTIONS, AGGREGATION_RESIDUALS
from fusion_fairseq.modules.layer_aggregation import AGGREGATION_STRATEGIES, DENSE_CONNECTION_READINGS
from fusion_fairseq.modules.multiway_dense_connection import MUDD_VARIANTS
from fusion_fairseq.modules.hyper_connection import HYPER_CONNECTION_KINDS, SINKHORN_ORDERS
from fusion_fairseq.modules.surface_fusion import SURFACE_FUSION_VARIANTS

from fusion_fairseq.config_fields import (
    INTEGER, POSITIVE_INT, PROBABILITY, check_values, field_defaults, fill_defaults, flag, flag_of, real,
    warn_idle_flags,
)

# Reading: the paper uses tau = 1 (hard) and 5 (soft). Below 0.01 the surface logits, and their
# gradients, are scaled by more than 100: tau = 1e-30 trained into NaN gradients.
MIN_SURFACE_FUSION_TAU = 0.01


# fairseq's Transformer flags that are probabilities
PROBABILITIES = ("dropout", "attention_dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop")


def transformer_flags() -> list:
    """fairseq's Transformer flags as the flat fields of fairseq's legacy ``TransformerModel``
    (``encoder.embed_dim`` as ``encoder_embed_dim``), for ``dataclasses.make_dataclass``.
    Reading: flat, not a subclass of fairseq's nested ``TransformerConfig``, because the legacy model
    reads them flat and every checkpoint of the plugin stores them under these names. fairseq's parser
    takes any float for the dropouts and layer drops: they are checked as probabilities at build time
    (a bad --dropout is named as itself, not as the --fusion-dropout it sets)."""

    def flat(config, prefix=""):
        for item in dataclasses.fields(config):
            if item.name.startswith("_"):
                continue
            if isinstance(item.type, type) and issubclass(item.type, FairseqDataclass):
                yield from flat(item.type, prefix + item.name + "_")
                continue
            default = item.default if item.default_factory is dataclasses.MISSING else item.default_factory()
            if isinstance(default, str):  # ${model.decoder.embed_dim}: the sibling field decoder_embed_dim
                default = re.sub(r"\$\{model\.(\w+)\.(\w+)\}", r"${.\1_\2}", default)
            metadata = dict(item.metadata)
            if prefix + item.name in PROBABILITIES:
                metadata["values"] = PROBABILITY
            yield prefix + item.name, item.type, field(default=default, metadata=metadata)

    return list(flat(TransformerConfig))


TransformerFlags = make_dataclass("TransformerFlags", transformer_flags(), bases=(FairseqDataclass,),
                                  namespace={"fairseqs_flags": True})


def sides_metadata(text: str) -> Dict[str, dict]:
    """The field metadata of the structural flags --NAME-encoder and --NAME-decoder: ``text`` with {} the side."""
    return {side: {"help": text.format(side), "structural": True} for side in ("encoder", "decoder")}


FUSE_HELP = sides_metadata("fuse all {} layers (h0 included) by average pooling, a single-hidden-layer FNN, or multi-hop "
                           "self-attention (MLRF Sec. 3.2); 'none' keeps the top layer")
DENSEFORMER_HELP = sides_metadata("DenseFormer (Pagliardini et al. 2024): after each {} layer, a learned depth-weighted "
                                  "average of the embedding and every earlier layer output, starting as the identity")
HYPER_CONNECTIONS_HELP = sides_metadata(
    "replace the {}'s residual connections by hyper-connections over --hyper-connections-rate streams: static or "
    "dynamic (Zhu et al. 2025), or dynamic with doubly stochastic stream mixing (manifold: mHC, Xie et al. 2025)")
MUDD_HELP = sides_metadata(
    "MUDDFormer (Xiao et al. 2025): the {}'s layers read their query, key, value and residual from their own dynamic "
    "dense aggregates of the embedding and every earlier layer output, starting as the identity")
AGGREGATE_HELP = sides_metadata("wire the {} layers by dense connection (Eq. 4), linear combination (Eq. 5), iterative "
                                "(Eqs. 6-7) or hierarchical aggregation (Fig. 2)")


@dataclass
class FusionTransformerConfig(TransformerFlags):
    """The flags of ``--arch fusion_transformer``: fairseq's Transformer's and the fusion ones, with
    the defaults of the plain architecture (no fusion). Paper defaults:

    * MLRF (Wang et al. 2018): 4 hops, da = 4d and df = 2d (the ratios of the paper's IWSLT
      setting, d=256, da=1024, df=512), fusion dropout = --dropout.
    * Deep representations (Dou et al. 2018): AGG with sigmoid and residuals from all inputs (the
      paper's choice, Table 4); vanilla self-attention (k = 1); dense connection as Eq. 4 followed
      by a LayerNorm without parameters (see :class:`DenseConnection` for the readings of Eq. 4).
    * Encoder layer fusion (Liu et al. 2021): DropConnect 0.3 on layer-attention weights; tau 1
      for hard and 5 for soft SurfaceFusion (Sec. 4.1); lambda 0.8 (their Ro-En, base-size setting).
    """

    # --- MLRF (Wang et al., COLING 2018) ---------------------------------------------------------
    fuse_encoder: ChoiceEnum(FUSION_FUNCTIONS) = field(default="none", metadata=FUSE_HELP["encoder"])
    fuse_decoder: ChoiceEnum(FUSION_FUNCTIONS) = field(default="none", metadata=FUSE_HELP["decoder"])
    fusion_hops: int = flag(4, "number of attention hops nhop of self-attention fusion (MLRF Eq. 5)",
                            values=POSITIVE_INT, structural=True)
    fusion_attn_dim: Optional[int] = flag(
        None, "inner size da of the attention FNN of self-attention fusion (MLRF Eq. 5; default 4d)",
        values=POSITIVE_INT, structural=True)
    fusion_ffn_dim: Optional[int] = flag(
        None, "hidden units df of the fusion FNN (FNN fusion and after the hops; default 2d)",
        values=POSITIVE_INT, structural=True)
    fusion_independent_w1: bool = flag(False, "one W1 per layer in self-attention fusion (MLRF Table 3, '+ indep. W1')",
                                       structural=True)
    fusion_no_embedding_layer: bool = flag(False, "do not fuse the embedding layer h0 (MLRF Table 4 ablation)",
                                           structural=True)
    fusion_no_layer_embedding: bool = flag(
        False, "no layer embedding in self-attention and FNN fusion (MLRF Eq. 4, Table 4 ablation)", structural=True)
    fusion_no_layernorm: bool = flag(False, "skip the layer normalisation after the fusion layer", structural=True)
    fusion_dropout: Optional[float] = flag(None, "dropout on the hidden units of the fusion FNNs (default: --dropout)",
                                           values=PROBABILITY)

    # --- deep representations (Dou et al., EMNLP 2018) ---------------------------------------------
    aggregate_encoder: ChoiceEnum(AGGREGATION_STRATEGIES) = field(default="none", metadata=AGGREGATE_HELP["encoder"])
    aggregate_decoder: ChoiceEnum(AGGREGATION_STRATEGIES) = field(default="none", metadata=AGGREGATE_HELP["decoder"])
    dense_connection: ChoiceEnum(DENSE_CONNECTION_READINGS) = flag(
        "layernorm", "reading of Eq. 4 for --aggregate-* dense: Eq. 4 followed by a LayerNorm without parameters "
        "(default), Eq. 4 to the letter (the sum of the accumulated states, doubling every layer), or the sum or the "
        "mean of the layers' own outputs", structural=True)
    aggregation_fn: ChoiceEnum(AGGREGATION_FUNCTIONS) = flag(
        "sigmoid", "the function F inside the aggregation node AGG (Table 4; paper: sigmoid)", structural=True)
    aggregation_residual: ChoiceEnum(AGGREGATION_RESIDUALS) = flag(
        "all", "which inputs of AGG have a residual connection to its output (Table 4; paper: all)", structural=True)
    multi_layer_attention: int = flag(
        1, "self-attention of every layer l > K attends to its K nearest lower layers, the K - 1 below its input "
        "with attention models of their own, merged by AGG (Eq. 8); 1 is the vanilla self-attention",
        values=POSITIVE_INT, structural=True)

    # --- encoder layer fusion (Liu et al., ICLR 2021) ------------------------------------------------
    layer_attention: ChoiceEnum(LAYER_ATTENTION_KINDS) = flag(
        "none", "give each decoder layer its own source memory S_m = sum_n W_mn (x) X_n over the encoder embedding "
        "layer and all encoder layers: one scalar per (m, n) (coarse) or element-wise weights (fine), softmax over "
        "encoder layers (Liu et al. 2021 Sec. 3.2)", structural=True)
    layer_attention_dropconnect: float = flag(
        0.3, "DropConnect probability on the layer-attention weights (paper: 0.3)", values=PROBABILITY)
    mask_encoder_layer: Optional[int] = flag(
        None, "analysis: zero the layer-attention weight of encoder layer N (0 = embedding) and renormalise the "
        "others; use at generation time with --model-overrides \"{'mask_encoder_layer': N}\"", values=INTEGER)
    surface_fusion: ChoiceEnum(SURFACE_FUSION_KINDS) = flag(
        "none", "fuse the output distribution with a surface attention over the source word embeddings: hard "
        "(Eq. 6) or soft (Eq. 7) fusion (Liu et al. 2021 Sec. 4.1)", structural=True)
    surface_fusion_lambda: float = flag(0.8, "interpolation weight lambda of hard fusion (Eq. 6), in [0, 1]",
                                        values=real(0.0, 1.0, high_included=True))
    surface_fusion_tau: Optional[float] = flag(
        None, f"softmax temperature tau of the surface distribution (Eq. 5), finite and >= {MIN_SURFACE_FUSION_TAU} "
        "(a smaller one scales the surface logits and their gradients by more than 100, an infinite one makes the "
        "distribution uniform); default 1 for hard and 5 for soft fusion, as in the paper",
        values=real(MIN_SURFACE_FUSION_TAU, float("inf")))
    surface_fusion_variant: ChoiceEnum(SURFACE_FUSION_VARIANTS) = flag(
        "paper", "paper: SurfaceFusion as the paper's text describes it (default); released: as the authors' "
        "released code trains it (query and keys detached, one head, a shared residual FFN on decoder output and "
        "surface vector, dropout on the embedding values)", structural=True)

    # --- today's layer fusion ----------------------------------------------------------------------
    denseformer_encoder: bool = field(default=False, metadata=DENSEFORMER_HELP["encoder"])
    denseformer_decoder: bool = field(default=False, metadata=DENSEFORMER_HELP["decoder"])
    denseformer_dilation: int = flag(
        1, "dilation k of DenseFormer: the average after layer i weighs only the outputs X_j with j = i mod k "
        "(Pagliardini et al. 2024, 'kxp-DenseFormer')", values=POSITIVE_INT, structural=True)
    denseformer_period: int = flag(1, "period p of DenseFormer: an average follows only layers p, 2p, ...",
                                   values=POSITIVE_INT, structural=True)
    mudd_encoder: bool = field(default=False, metadata=MUDD_HELP["encoder"])
    mudd_decoder: bool = field(default=False, metadata=MUDD_HELP["decoder"])
    mudd_variant: ChoiceEnum(MUDD_VARIANTS) = flag(
        "paper", "paper: MUDD's weight generators with hidden size 4(i+1) after layer i, as the paper sizes them "
        "(default); released: that size rounded up past the next multiple of 64, as the authors' released "
        "configurations", structural=True)
    hyper_connections_encoder: ChoiceEnum(HYPER_CONNECTION_KINDS) = field(
        default="none", metadata=HYPER_CONNECTIONS_HELP["encoder"])
    hyper_connections_decoder: ChoiceEnum(HYPER_CONNECTION_KINDS) = field(
        default="none", metadata=HYPER_CONNECTIONS_HELP["decoder"])
    hyper_connections_rate: int = flag(
        4, "expansion rate n of hyper-connections: the number of residual streams (Zhu et al. 2025; paper: 4)",
        values=POSITIVE_INT, structural=True)
    hyper_connections_sinkhorn_order: ChoiceEnum(SINKHORN_ORDERS) = flag(
        "columns-first", "order of mHC's Sinkhorn-Knopp normalisation: columns-first, Eq. 9 of the paper (the rows of "
        "the stream mix sum exactly to one), or rows-first (the order of checkpoints trained before this option)",
        structural=True)
    hyper_connections_no_output_rescale: bool = flag(
        False, "keep fairseq's initialisation of the sublayers' output projections; by default static and dynamic "
        "hyper-connections divide its std by sqrt(n) (Zhu et al. 2025, Sec. 4)")
    hyper_connections_decay_static: bool = flag(
        False, "apply --weight-decay to the static hyper-connection weights too; by default they carry no weight "
        "decay (Zhu et al. 2025, Sec. 4) under --optimizer adam_with_overrides (fairseq's optimizers decay them)")


# The defaults that depend on other flags.
DERIVED_DEFAULTS = {
    "fusion_attn_dim": lambda args: 4 * args.encoder_embed_dim,
    "fusion_ffn_dim": lambda args: 2 * args.encoder_embed_dim,
    "fusion_dropout": lambda args: args.dropout,
    "surface_fusion_tau": lambda args: 5.0 if args.surface_fusion == "soft" else 1.0,
}


def idle_fusion_flags(args) -> Dict[str, tuple]:
    """{flag: (what it acts on, the setting that leaves it out)} of the fusion flags that do nothing in the
    configuration ``args``."""
    def sides(name):
        values = [getattr(args, f"{name}_{side}") for side in ("encoder", "decoder")]
        return set(values), f"{flag_of(name)}-encoder/{flag_of(name)}-decoder are {values[0]}/{values[1]}"

    (fuse, fusion), (aggregate, aggregation) = sides("fuse"), sides("aggregate")
    (denseformer, denseformers), (mudd, mudds), (hyper, hypers) = (
        sides("denseformer"), sides("mudd"), sides("hyper_connections"))
    surface = f"--surface-fusion is {args.surface_fusion}"
    no_nodes = "only iterative and hierarchical aggregation and multi-layer attention have aggregation nodes"
    lacking = [  # (the feature is absent, the setting that leaves it out, {flag: what it acts on})
        ("sa" not in fuse, fusion, {
            "fusion_hops": "only self-attention fusion (--fuse-encoder/--fuse-decoder sa) has hops",
            "fusion_attn_dim": "only self-attention fusion has an attention FNN (Eq. 5)",
            "fusion_independent_w1": "only self-attention fusion has W1 (Eq. 5)"}),
        (not fuse & {"fnn", "sa"}, fusion, {
            "fusion_ffn_dim": "only FNN and self-attention fusion have a fusion FNN",
            "fusion_no_layer_embedding": "only self-attention and FNN fusion read the layer embedding",
            "fusion_dropout": "only FNN and self-attention fusion have a fusion FNN"}),
        (fuse == {"none"}, fusion, dict.fromkeys(("fusion_no_embedding_layer", "fusion_no_layernorm"),
                                                 "it acts on layer fusion")),
        ("dense" not in aggregate, aggregation, {"dense_connection": "it reads dense aggregation"}),
        (not aggregate & {"iterative", "hierarchical"} and args.multi_layer_attention <= 1, aggregation,
         dict.fromkeys(("aggregation_fn", "aggregation_residual"), no_nodes)),
        (args.layer_attention == "none", "--layer-attention is none",
         {"layer_attention_dropconnect": "it drops layer-attention weights"}),
        (args.surface_fusion != "hard", surface,
         {"surface_fusion_lambda": "only hard SurfaceFusion (Eq. 6) interpolates"}),
        (args.surface_fusion == "none", surface, {"surface_fusion_tau": "it is SurfaceFusion's temperature",
                                                  "surface_fusion_variant": "it changes SurfaceFusion"}),
        (denseformer == {False}, denseformers, dict.fromkeys(("denseformer_dilation", "denseformer_period"),
                                                             "it thins DenseFormer's averages")),
        (mudd == {False}, mudds, {"mudd_variant": "it sizes MUDD's weight generators"}),
        (hyper == {"none"}, hypers, {"hyper_connections_rate": "it sets the streams of hyper-connections"}),
        ("manifold" not in hyper, hypers,
         {"hyper_connections_sinkhorn_order": "only manifold hyper-connections normalise their stream mix"}),
        (not hyper & {"static", "dynamic"}, hypers, {
            "hyper_connections_no_output_rescale": "only static and dynamic hyper-connections rescale the output "
                                                   "projections",
            "hyper_connections_decay_static": "only static and dynamic hyper-connections have static weights"}),
    ]
    return {flag: (acts_on, setting) for absent, setting, flags in lacking if absent for flag, acts_on in flags.items()}


def decoder_dims_as_integers(args) -> None:
    """--decoder-input-dim and --decoder-output-dim as integers: their default names another field, so fairseq's
    parser keeps a value the user gives as text (fairseq's own Transformer converts it in its build_model)."""
    for name in ("decoder_input_dim", "decoder_output_dim"):
        value = getattr(args, name)
        if isinstance(value, str):
            number = int(value) if value.strip().isdecimal() else value
            message = POSITIVE_INT.error(flag_of(name), number, repr(value))
            if message:
                raise ConfigurationError(message)
            setattr(args, name, number)


def fill_fusion_defaults(args) -> None:
    """The fusion flags the user left unset, after fairseq's Transformer architecture filled its own."""
    decoder_dims_as_integers(args)
    fill_defaults(args, FusionTransformerConfig)
    for name, derive in DERIVED_DEFAULTS.items():  # in field order: surface_fusion_tau reads surface_fusion
        if getattr(args, name, None) is None:
            setattr(args, name, derive(args))


def check_fusion_args(args, architecture_values: Optional[Dict[str, Any]] = None) -> None:
    """Raise ``ConfigurationError`` naming the flag, the value and what is allowed; warn about the flags
    :func:`idle_fusion_flags` names whose value is not ``architecture_values``' (what the
    architecture gives them where the user sets nothing: a preset's value, or one derived from the other flags;
    by default ``fusion_transformer``'s)."""
    # every value's type before any comparison; a hydra config's model (its _name, no fairseq-train --arch) is
    # told of a bad value by the name it wrote, model.FIELD
    from_hydra = getattr(args, "_name", None) and not getattr(args, "arch", None)
    named = (lambda field: f"model.{field}") if from_hydra else flag_of
    check_values(args, FusionTransformerConfig, name=named, derived=DERIVED_DEFAULTS)
    reads_every_layer = chosen(args, "fuse_encoder", "fuse_decoder", "layer_attention", "aggregate_encoder",
                               "aggregate_decoder", "denseformer_encoder", "denseformer_decoder",
                               "mudd_encoder", "mudd_decoder", "multi_layer_attention")
    if reads_every_layer and (args.encoder_layerdrop > 0 or args.decoder_layerdrop > 0):
        raise ConfigurationError("layer fusion needs every layer's output: --encoder-layerdrop/--decoder-layerdrop "
                                 f"must be 0 with {' '.join(reads_every_layer)}")
    for name in ("encoder_layerdrop", "decoder_layerdrop", "encoder_layers_to_keep", "decoder_layers_to_keep"):
        if getattr(args, name, None):  # the stacks call their layers by index, past fairseq's LayerDropModuleList
            raise ConfigurationError(f"{named(name)} {getattr(args, name)!r}: fusion_transformer runs every layer it "
                                     "builds (no LayerDrop); leave it unset, or train fairseq's transformer")
    if args.encoder_embed_dim != args.decoder_embed_dim:
        widths = f"--encoder-embed-dim ({args.encoder_embed_dim}) == --decoder-embed-dim ({args.decoder_embed_dim})"
        if args.fuse_encoder in ("sa", "fnn") and args.fuse_decoder in ("sa", "fnn") \
                and not args.fusion_no_layer_embedding:
            raise ConfigurationError(
                f"--fuse-encoder {args.fuse_encoder} and --fuse-decoder {args.fuse_decoder} share one layer "
                f"embedding, which needs {widths}; or pass --fusion-no-layer-embedding")
        if args.layer_attention != "none":
            raise ConfigurationError(f"--layer-attention needs {widths}")
        if args.surface_fusion != "none":
            raise ConfigurationError("--surface-fusion reads source word embeddings through the target output "
                                     f"projection, which needs {widths}")
    for side in ("encoder", "decoder"):
        check_side(args, side)
    source_memory = chosen(args, "layer_attention", "fuse_encoder", "aggregate_encoder", "denseformer_encoder",
                           "mudd_encoder", "hyper_connections_encoder")
    if getattr(args, "no_cross_attention", False) and source_memory:
        raise ConfigurationError(
            f"--no-cross-attention removes the decoder's attention to the source memory that "
            f"{' and '.join(source_memory)} builds: it would get no gradient and the output would ignore the source; "
            "drop one of them")
    if args.layer_attention != "none" and args.fuse_encoder != "none":
        raise ConfigurationError(
            f"--layer-attention {args.layer_attention} and --fuse-encoder {args.fuse_encoder} both define the "
            "decoder's source memory (per-layer mixtures vs one fused memory); choose one of them")
    layer = args.mask_encoder_layer
    if layer is not None and args.layer_attention == "none":
        raise ConfigurationError(f"--mask-encoder-layer {layer} masks a layer-attention weight, which needs "
                                 "--layer-attention coarse or fine")
    if layer is not None and not 0 <= layer <= args.encoder_layers:
        raise ConfigurationError(f"--mask-encoder-layer {layer} does not exist: the encoder has layers 0 (embedding) "
                                 f"to {args.encoder_layers}")
    output_dim = getattr(args, "decoder_output_dim", None) or args.decoder_embed_dim
    if args.surface_fusion != "none" and output_dim != args.decoder_embed_dim:
        raise ConfigurationError(
            f"--surface-fusion {args.surface_fusion} joins the decoder's output with source word embeddings before "
            f"the output projection, which needs --decoder-output-dim ({output_dim}) == --decoder-embed-dim "
            f"({args.decoder_embed_dim})")
    if args.surface_fusion != "none" and getattr(args, "adaptive_softmax_cutoff", None):
        raise ConfigurationError(
            f"--surface-fusion {args.surface_fusion} projects the surface attention with the full output "
            f"matrix; --adaptive-softmax-cutoff {args.adaptive_softmax_cutoff} replaces it: use one of them")
    if architecture_values is None:
        architecture_values = {**field_defaults(FusionTransformerConfig),
                               **{name: derive(args) for name, derive in DERIVED_DEFAULTS.items()}}
    warn_idle_flags(args, idle_fusion_flags(args), architecture_values)


def check_side(args, side: str) -> None:
    """The encoder's or the decoder's checks of :func:`check_fusion_args`: one output representation and one
    wiring per side, and what each needs of the side's layers."""
    both = chosen(args, f"aggregate_{side}", f"fuse_{side}")
    if len(both) == 2:
        raise ConfigurationError(
            f"{both[0]} and {both[1]} both define the {side}'s output representation; choose one per side (they "
            f"combine across sides, e.g. --aggregate-encoder with --fuse-decoder)")
    wirings = chosen(args, f"denseformer_{side}", f"hyper_connections_{side}", f"mudd_{side}",
                     f"aggregate_{side}")
    if len(wirings) > 1:
        raise ConfigurationError(f"{' and '.join(wirings)} both wire the {side}'s layers (which representation "
                                 "enters each layer); choose one per side")
    layers, k = getattr(args, f"{side}_layers"), args.multi_layer_attention
    if wirings and layers == 0:
        raise ConfigurationError(f"{wirings[0]} wires the {side}'s layers, and --{side}-layers is 0: allowed "
                                 "with at least one layer")
    if k > 1 and layers <= k:
        raise ConfigurationError(f"--multi-layer-attention {k} attends the {k} layers below a layer, so it needs "
                                 f"more than {k} layers; --{side}-layers is {layers}")
    heads = getattr(args, f"{side}_attention_heads")
    if args.aggregation_fn == "attention" and getattr(args, f"{side}_embed_dim") % heads:
        raise ConfigurationError(f"--aggregation-fn attention needs --{side}-embed-dim divisible by its "
                                 f"{heads} heads")
    if getattr(args, f"denseformer_{side}") and args.denseformer_period > layers:
        raise ConfigurationError(f"--denseformer-period {args.denseformer_period} leaves no {side} layer averaged: "
                                 f"--{side}-layers is {layers}")
    last_averaged = args.denseformer_period * (layers // args.denseformer_period)
    if getattr(args, f"denseformer_{side}") and args.denseformer_dilation > last_averaged:
        # the average after layer i reads X_j, j = i mod k: for i < k, X_i alone
        raise ConfigurationError(
            f"--denseformer-dilation {args.denseformer_dilation} leaves every {side} average reading only its own "
            f"layer's output: the averages follow layers up to {last_averaged} (--{side}-layers {layers}, "
            f"--denseformer-period {args.denseformer_period}); allowed: at most {last_averaged}")
    if getattr(args, f"mudd_{side}") and k > 1:
        raise ConfigurationError(
            f"--mudd-{side} and --multi-layer-attention {k}: multi-layer attention reads single lower-layer states, "
            "MUDD's layers read four aggregates of them; choose one of them")
    if k > 1 and side == "decoder" and getattr(args, "cross_self_attention", False):
        raise ConfigurationError(f"--multi-layer-attention {k} attends the decoder's lower layers over the target "
                                 "only and does not support --cross-self-attention; drop one of them")
    if getattr(args, f"mudd_{side}") and side == "decoder" and getattr(args, "cross_self_attention", False):
        raise ConfigurationError("--mudd-decoder gives the self-attention keys and values of the target only and "
                                 "does not support --cross-self-attention; drop one of them")
    kind = getattr(args, f"hyper_connections_{side}")
    flag = f"--hyper-connections-{side} {kind}"
    if kind != "none" and k > 1:
        raise ConfigurationError(
            f"{flag} and --multi-layer-attention {k}: multi-layer attention reads single lower-layer states, "
            "hyper-connected layers hold several streams; choose one of them")
    if kind == "manifold" and args.hyper_connections_rate < 2:
        raise ConfigurationError(f"{flag} needs --hyper-connections-rate of at least 2 (one stream has nothing "
                                 f"to mix), got {args.hyper_connections_rate}")
    if kind != "none" and side == "decoder" and getattr(args, "cross_self_attention", False):
        raise ConfigurationError(
            f"{flag} runs fairseq's decoder sublayers one by one, with the self-attention over the target "
            "only, and does not support --cross-self-attention; drop one of them")


def chosen(args, *names) -> list:
    """``--flag value`` (``--flag`` for a switch) of each of ``names`` that is set to something other than off."""
    given = [(flag_of(name), getattr(args, name)) for name in names]
    return [flag if value is True else f"{flag} {value}" for flag, value in given
            if value not in ("none", False) and (flag, value) != ("--multi-layer-attention", 1)]

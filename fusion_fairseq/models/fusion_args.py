"""The command-line flags of the layer-fusion Transformer, and their validation.

One table (``POSITIVE_INT_FLAGS`` and the choice flags) serves both argparse, so that the CLI
rejects bad values with the flag's name, and :func:`check_fusion_args`, so that configurations
built in code or read from a checkpoint get the same errors.
"""

import argparse
import logging
import sys

from fusion_fairseq.modules import FUSION_FUNCTIONS, LAYER_ATTENTION_KINDS, SURFACE_FUSION_KINDS
from fusion_fairseq.modules.aggregation_node import AGGREGATION_FUNCTIONS, AGGREGATION_RESIDUALS
from fusion_fairseq.modules.layer_aggregation import AGGREGATION_STRATEGIES, DENSE_CONNECTION_READINGS
from fusion_fairseq.modules.surface_fusion import SURFACE_FUSION_VARIANTS
from fusion_fairseq.errors import ConfigurationError

POSITIVE_INT_FLAGS = {
    "fusion_hops": "--fusion-hops",
    "fusion_attn_dim": "--fusion-attn-dim",
    "fusion_ffn_dim": "--fusion-ffn-dim",
    "multi_layer_attention": "--multi-layer-attention",
}
CHOICE_FLAGS = {
    "fuse_encoder": ("--fuse-encoder", FUSION_FUNCTIONS),
    "fuse_decoder": ("--fuse-decoder", FUSION_FUNCTIONS),
    "layer_attention": ("--layer-attention", LAYER_ATTENTION_KINDS),
    "surface_fusion": ("--surface-fusion", SURFACE_FUSION_KINDS),
    "surface_fusion_variant": ("--surface-fusion-variant", SURFACE_FUSION_VARIANTS),
    "aggregate_encoder": ("--aggregate-encoder", AGGREGATION_STRATEGIES),
    "aggregate_decoder": ("--aggregate-decoder", AGGREGATION_STRATEGIES),
    "dense_connection": ("--dense-connection", DENSE_CONNECTION_READINGS),
    "aggregation_fn": ("--aggregation-fn", AGGREGATION_FUNCTIONS),
    "aggregation_residual": ("--aggregation-residual", AGGREGATION_RESIDUALS),
}


logger = logging.getLogger(__name__)

# Reading: the paper uses tau = 1 (hard) and 5 (soft). Below 0.01 the surface logits, and their
# gradients, are scaled by more than 100: tau = 1e-30 trained into NaN gradients.
MIN_SURFACE_FUSION_TAU = 0.01


def positive_int_error(flag, value):
    return f"{flag} must be a positive integer, got {value!r}"


def positive_int(flag):
    """argparse type: a positive integer, with an error naming ``flag`` and the value."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(positive_int_error(flag, text))
        if value <= 0:
            raise argparse.ArgumentTypeError(positive_int_error(flag, text))
        return value

    return parse


# Real-valued flags: (low, low included, high, high included, what is allowed), one table for
# argparse and for the checks of configurations built in code, read from a checkpoint or given by
# --model-overrides.
PROBABILITY = (0.0, True, 1.0, False, "in [0, 1)")
REAL_FLAGS = {
    "layer_attention_dropconnect": ("--layer-attention-dropconnect", PROBABILITY),
    "surface_fusion_lambda": ("--surface-fusion-lambda", (0.0, True, 1.0, True, "in [0, 1]")),
    "surface_fusion_tau": ("--surface-fusion-tau", (0.0, False, float("inf"), True, "> 0")),
    "fusion_dropout": ("--fusion-dropout", PROBABILITY),
}
DROPOUT_FLAGS = {"dropout": "--dropout", "attention_dropout": "--attention-dropout",
                 "activation_dropout": "--activation-dropout"}
LAYERDROP_FLAGS = {"encoder_layerdrop": "--encoder-layerdrop", "decoder_layerdrop": "--decoder-layerdrop"}
BOOLEAN_FLAGS = {
    "fusion_independent_w1": "--fusion-independent-w1",
    "fusion_no_embedding_layer": "--fusion-no-embedding-layer",
    "fusion_no_layer_embedding": "--fusion-no-layer-embedding",
    "fusion_no_layernorm": "--fusion-no-layernorm",
}


def real_value_error(flag, value, allowed):
    """None when ``value`` is a number in ``allowed``, else the message naming the flag, the
    value and what is allowed."""
    low, low_included, high, high_included, text = allowed
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"{flag} must be a number {text}, got {value!r}"
    above = low < value or (low_included and value == low)
    below = value < high or (high_included and value == high)
    return None if above and below else f"{flag} must be {text}, got {value!r}"


def real_in_range(flag, allowed):
    """argparse type for a real-valued flag: text that is no number, or a number out of
    ``allowed``, gets an error naming the flag, the value and what is allowed."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number {allowed[-1]}, got {text!r}") from None
        if real_value_error(flag, value, allowed):
            raise argparse.ArgumentTypeError(f"{flag} must be {allowed[-1]}, got {text!r}")
        return value

    return parse


def _probability(flag):
    return real_in_range(flag, PROBABILITY)


def tau_error(value):
    """The temperature bounds beyond "> 0" (see :data:`MIN_SURFACE_FUSION_TAU`), or None."""
    if value < MIN_SURFACE_FUSION_TAU:
        return (f"--surface-fusion-tau must be at least {MIN_SURFACE_FUSION_TAU} (smaller temperatures scale the "
                f"surface logits and their gradients by more than {1 / MIN_SURFACE_FUSION_TAU:g}), got {value!r}")
    if value == float("inf"):
        return (f"--surface-fusion-tau must be finite (an infinite temperature makes the surface distribution "
                f"uniform, whatever the source), got {value!r}")
    return None


def _tau(text):
    value = real_in_range(*REAL_FLAGS["surface_fusion_tau"])(text)
    if tau_error(value):
        raise argparse.ArgumentTypeError(tau_error(value))
    return value


def check_real_flags(args, table):
    """Raise ``ConfigurationError`` for the first value of ``table`` (dest -> (flag, allowed)) out of range."""
    for dest, (flag, allowed) in table.items():
        if hasattr(args, dest):
            message = real_value_error(flag, getattr(args, dest), allowed)
            if message:
                raise ConfigurationError(message)


def check_dropout_args(args):
    """--dropout, --attention-dropout and --activation-dropout in [0, 1), named, at build time
    (fairseq's own flags take any float and fail only in the first forward pass)."""
    check_real_flags(args, {dest: (flag, PROBABILITY) for dest, flag in DROPOUT_FLAGS.items()})


def add_fusion_args(parser):
    """Flags of every fusion family. Defaults come from the architecture functions."""
    add_mlrf_args(parser)
    add_deep_representation_args(parser)
    add_encoder_layer_fusion_args(parser)


def add_deep_representation_args(parser):
    """Layer aggregation and multi-layer attention flags (Dou et al., EMNLP 2018)."""
    for side in ("encoder", "decoder"):
        parser.add_argument(f"--aggregate-{side}", choices=AGGREGATION_STRATEGIES,
                            metavar="{" + ",".join(AGGREGATION_STRATEGIES) + "}",
                            help=f"wire the {side} layers by dense connection (Eq. 4), linear combination (Eq. 5), "
                            "iterative (Eqs. 6-7) or hierarchical aggregation (Fig. 2)")
    parser.add_argument("--dense-connection", choices=DENSE_CONNECTION_READINGS,
                        metavar="{" + ",".join(DENSE_CONNECTION_READINGS) + "}",
                        help="reading of Eq. 4 for --aggregate-* dense: Eq. 4 followed by a LayerNorm without "
                        "parameters (default), Eq. 4 to the letter (the sum of the accumulated states, doubling every "
                        "layer), or the sum or the mean of the layers' own outputs")
    parser.add_argument("--aggregation-fn", choices=AGGREGATION_FUNCTIONS, metavar="{sigmoid,relu,attention}",
                        help="the function F inside the aggregation node AGG (Table 4; paper: sigmoid)")
    parser.add_argument("--aggregation-residual", choices=AGGREGATION_RESIDUALS, metavar="{none,top,all}",
                        help="which inputs of AGG have a residual connection to its output (Table 4; paper: all)")
    parser.add_argument("--multi-layer-attention", type=positive_int("--multi-layer-attention"), metavar="K",
                        help="self-attention of every layer l > K attends to its K nearest lower layers with "
                        "separate attention models, merged by AGG (Eq. 8); 1 is the vanilla self-attention")


def add_encoder_layer_fusion_args(parser):
    """Layer attention and SurfaceFusion flags (Liu et al., ICLR 2021)."""
    parser.add_argument("--layer-attention", choices=LAYER_ATTENTION_KINDS, metavar="{none,coarse,fine}",
                        help="give each decoder layer its own source memory S_m = sum_n W_mn (x) X_n over the "
                        "encoder embedding layer and all encoder layers: one scalar per (m, n) (coarse) or "
                        "element-wise weights (fine), softmax over encoder layers (Liu et al. 2021 Sec. 3.2)")
    parser.add_argument("--layer-attention-dropconnect", type=_probability("--layer-attention-dropconnect"),
                        metavar="P", help="DropConnect probability on the layer-attention weights (paper: 0.3)")
    parser.add_argument("--mask-encoder-layer", type=int, metavar="N",
                        help="analysis: zero the layer-attention weight of encoder layer N (0 = embedding) and "
                        "renormalise the others; use at generation time with "
                        "--model-overrides \"{'mask_encoder_layer': N}\"")
    parser.add_argument("--surface-fusion", choices=SURFACE_FUSION_KINDS, metavar="{none,hard,soft}",
                        help="fuse the output distribution with a surface attention over the source word "
                        "embeddings: hard (Eq. 6) or soft (Eq. 7) fusion (Liu et al. 2021 Sec. 4.1)")
    parser.add_argument("--surface-fusion-lambda", type=real_in_range(*REAL_FLAGS["surface_fusion_lambda"]), metavar="L",
                        help="interpolation weight lambda of hard fusion (Eq. 6), in [0, 1]")
    parser.add_argument("--surface-fusion-tau", type=_tau, metavar="T",
                        help=f"softmax temperature tau of the surface distribution (Eq. 5), >= {MIN_SURFACE_FUSION_TAU}; "
                        "default 1 for hard and 5 for soft fusion, as in the paper")
    parser.add_argument("--surface-fusion-variant", choices=SURFACE_FUSION_VARIANTS, metavar="{paper,released}",
                        help="paper: SurfaceFusion as the paper's text describes it (default); released: as the "
                        "authors' released code trains it (query and keys detached, one head, a shared residual "
                        "FFN on decoder output and surface vector, dropout on the embedding values)")


def add_mlrf_args(parser):
    """MLRF flags (Wang et al., COLING 2018)."""
    for dest, (flag, choices) in list(CHOICE_FLAGS.items())[:2]:
        side = dest.split("_")[1]
        parser.add_argument(
            flag, choices=choices, metavar="{" + ",".join(choices) + "}",
            help=f"fuse all {side} layers (h0 included) by average pooling, a single-hidden-layer "
            f"FNN, or multi-hop self-attention (MLRF Sec. 3.2); 'none' keeps the top layer",
        )
    parser.add_argument("--fusion-hops", type=positive_int("--fusion-hops"), metavar="N",
                        help="number of attention hops nhop of self-attention fusion (MLRF Eq. 5)")
    parser.add_argument("--fusion-attn-dim", type=positive_int("--fusion-attn-dim"), metavar="N",
                        help="inner size da of the attention FNN of self-attention fusion (MLRF Eq. 5)")
    parser.add_argument("--fusion-ffn-dim", type=positive_int("--fusion-ffn-dim"), metavar="N",
                        help="hidden units df of the fusion FNN (FNN fusion and after the hops)")
    parser.add_argument("--fusion-independent-w1", action="store_true",
                        help="one W1 per layer in self-attention fusion (MLRF Table 3, '+ indep. W1')")
    parser.add_argument("--fusion-no-embedding-layer", action="store_true",
                        help="do not fuse the embedding layer h0 (MLRF Table 4 ablation)")
    parser.add_argument("--fusion-no-layer-embedding", action="store_true",
                        help="no layer embedding in self-attention and FNN fusion (MLRF Eq. 4, Table 4 ablation)")
    parser.add_argument("--fusion-no-layernorm", action="store_true",
                        help="skip the layer normalisation after the fusion layer")
    parser.add_argument("--fusion-dropout", type=_probability("--fusion-dropout"), metavar="P",
                        help="dropout on the hidden units of the fusion FNNs (default: --dropout)")


def check_fusion_args(args):
    """Raise ``ConfigurationError`` naming the flag, the value and what is allowed."""
    for dest, (flag, choices) in CHOICE_FLAGS.items():
        value = getattr(args, dest)
        if value not in choices:
            raise ConfigurationError(f"{flag} got {value!r}; allowed: {', '.join(choices)}")
    # every value's type before any comparison: --model-overrides can hand in text. The dropouts
    # first: --fusion-dropout defaults to --dropout, so a bad --dropout is named as itself.
    check_dropout_args(args)
    check_real_flags(args, REAL_FLAGS)
    check_real_flags(args, {dest: (flag, PROBABILITY) for dest, flag in LAYERDROP_FLAGS.items()})
    check_positive_ints(args, POSITIVE_INT_FLAGS)
    check_switches(args, BOOLEAN_FLAGS)
    reads_every_layer = [
        f"{flag} {getattr(args, dest)}"
        for dest, flag in (("fuse_encoder", "--fuse-encoder"), ("fuse_decoder", "--fuse-decoder"),
                           ("layer_attention", "--layer-attention"), ("aggregate_encoder", "--aggregate-encoder"),
                           ("aggregate_decoder", "--aggregate-decoder"))
        if getattr(args, dest) != "none"
    ] + ([f"--multi-layer-attention {args.multi_layer_attention}"] if args.multi_layer_attention > 1 else [])
    if reads_every_layer and (args.encoder_layerdrop > 0 or args.decoder_layerdrop > 0):
        raise ConfigurationError(
            "layer fusion needs every layer's output: --encoder-layerdrop/--decoder-layerdrop must be 0 "
            f"with {' '.join(reads_every_layer)}"
        )
    check_mlrf_args(args)
    check_deep_representation_args(args)
    check_encoder_layer_fusion_args(args)
    warn_unused_flags(args)


def _fusion_sides(args):
    return f"--fuse-encoder/--fuse-decoder are {args.fuse_encoder}/{args.fuse_decoder}"


def _aggregation_sides(args):
    return f"--aggregate-encoder/--aggregate-decoder are {args.aggregate_encoder}/{args.aggregate_decoder}"


def _fuses_with(args, *functions):
    return bool(set(functions) & {args.fuse_encoder, args.fuse_decoder})


def _has_aggregation_nodes(args):
    return bool({"iterative", "hierarchical"} & {args.aggregate_encoder, args.aggregate_decoder}) \
        or args.multi_layer_attention > 1


# dest -> (what reads it, whether this configuration does, the configuration that says it does not)
IDLE_FLAG_RULES = {
    "fusion_hops": ("only self-attention fusion (--fuse-encoder/--fuse-decoder sa) has hops",
                    lambda a: _fuses_with(a, "sa"), _fusion_sides),
    "fusion_attn_dim": ("only self-attention fusion has an attention FNN (Eq. 5)",
                        lambda a: _fuses_with(a, "sa"), _fusion_sides),
    "fusion_independent_w1": ("only self-attention fusion has W1 (Eq. 5)", lambda a: _fuses_with(a, "sa"), _fusion_sides),
    "fusion_ffn_dim": ("only FNN and self-attention fusion have a fusion FNN",
                       lambda a: _fuses_with(a, "fnn", "sa"), _fusion_sides),
    "fusion_dropout": ("only FNN and self-attention fusion have a fusion FNN",
                       lambda a: _fuses_with(a, "fnn", "sa"), _fusion_sides),
    "fusion_no_layer_embedding": ("only self-attention and FNN fusion read the layer embedding",
                                  lambda a: _fuses_with(a, "fnn", "sa"), _fusion_sides),
    "fusion_no_layernorm": ("it acts on layer fusion", lambda a: _fuses_with(a, "avg", "fnn", "sa"), _fusion_sides),
    "fusion_no_embedding_layer": ("it acts on layer fusion", lambda a: _fuses_with(a, "avg", "fnn", "sa"), _fusion_sides),
    "aggregation_fn": ("only iterative and hierarchical aggregation and multi-layer attention have aggregation nodes",
                       _has_aggregation_nodes, _aggregation_sides),
    "aggregation_residual": ("only iterative and hierarchical aggregation and multi-layer attention have aggregation "
                             "nodes", _has_aggregation_nodes, _aggregation_sides),
    "dense_connection": ("it reads dense aggregation", lambda a: "dense" in (a.aggregate_encoder, a.aggregate_decoder),
                         _aggregation_sides),
    "layer_attention_dropconnect": ("it drops layer-attention weights", lambda a: a.layer_attention != "none",
                                    lambda a: f"--layer-attention is {a.layer_attention}"),
    "surface_fusion_lambda": ("only hard SurfaceFusion (Eq. 6) interpolates", lambda a: a.surface_fusion == "hard",
                              lambda a: f"--surface-fusion is {a.surface_fusion}"),
    "surface_fusion_tau": ("it is SurfaceFusion's temperature", lambda a: a.surface_fusion != "none",
                           lambda a: f"--surface-fusion is {a.surface_fusion}"),
    "surface_fusion_variant": ("it changes SurfaceFusion", lambda a: a.surface_fusion != "none",
                               lambda a: f"--surface-fusion is {a.surface_fusion}"),
}


def architecture_default(args, dest):
    """The value the architecture gives ``dest`` by itself (its function of fairseq's
    ARCH_CONFIG_REGISTRY run on a copy of ``args`` without ``dest``), so that a preset's own
    value (e.g. mlrf_nist_zh_en's independent W1) is never taken for the user's."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    fill_defaults = ARCH_CONFIG_REGISTRY.get(getattr(args, "arch", None), ARCH_CONFIG_REGISTRY["fusion_transformer"])
    probe = argparse.Namespace(**{key: value for key, value in vars(args).items() if key != dest})
    fill_defaults(probe)
    return getattr(probe, dest)


def on_command_line(flag: str) -> bool:
    """Whether ``flag`` was typed on this process's command line (fairseq-train's): a value
    equal to the architecture's own is then the user's choice too."""
    return any(word == flag or word.startswith(flag + "=") for word in sys.argv[1:])


def unused_flags(args, rules):
    """The flags of ``rules`` (a table like :data:`IDLE_FLAG_RULES`) that do nothing in this
    configuration, each with the reason: those holding a value other than the architecture's own,
    and those typed on the command line. (A configuration read from a checkpoint holds every flag,
    at the architecture's value where the user gave none: no warning then.)"""
    unused = []
    for dest, (reader, in_use, configuration) in rules.items():
        value = getattr(args, dest)
        flag = "--" + dest.replace("_", "-")
        if in_use(args) or (value == architecture_default(args, dest) and not on_command_line(flag)):
            continue
        given = flag if isinstance(value, bool) else f"{flag} {value}"
        unused.append(f"{given}: {reader}, and {configuration(args)}")
    return unused


def warn_unused_flags(args, rules=IDLE_FLAG_RULES):
    """Warnings, not errors: a configuration with an idle flag still means what it says, and
    checkpoints trained with one must keep loading."""
    for text in unused_flags(args, rules):
        logger.warning("flag without effect: %s", text)


def check_deep_representation_args(args):
    for side in ("encoder", "decoder"):
        aggregate, fuse = getattr(args, f"aggregate_{side}"), getattr(args, f"fuse_{side}")
        if aggregate != "none" and fuse != "none":
            raise ConfigurationError(
                f"--aggregate-{side} {aggregate} and --fuse-{side} {fuse} both define the {side}'s output "
                f"representation; choose one per side (they combine across sides, e.g. --aggregate-encoder "
                f"with --fuse-decoder)"
            )
    if args.multi_layer_attention > 1:
        for side in ("encoder", "decoder"):
            layers = getattr(args, f"{side}_layers")
            if layers <= args.multi_layer_attention:
                raise ConfigurationError(
                    f"--multi-layer-attention {args.multi_layer_attention} attends the {args.multi_layer_attention} "
                    f"layers below a layer, so it needs more than {args.multi_layer_attention} layers; "
                    f"--{side}-layers is {layers}"
                )
    if args.aggregation_fn == "attention":
        for side in ("encoder", "decoder"):
            heads = getattr(args, f"{side}_attention_heads")
            if getattr(args, f"{side}_embed_dim") % heads:
                raise ConfigurationError(f"--aggregation-fn attention needs --{side}-embed-dim divisible by its {heads} heads")


def check_encoder_layer_fusion_args(args):
    if tau_error(args.surface_fusion_tau):
        raise ConfigurationError(tau_error(args.surface_fusion_tau))
    source_memory = [f"--{dest.replace('_', '-')} {getattr(args, dest)}"
                     for dest in ("layer_attention", "fuse_encoder", "aggregate_encoder")
                     if getattr(args, dest) != "none"]
    if getattr(args, "no_cross_attention", False) and source_memory:
        raise ConfigurationError(
            "--no-cross-attention removes the decoder's attention to the source memory that "
            f"{' and '.join(source_memory)} builds: it would get no gradient and the output would ignore the "
            "source; drop one of them"
        )
    if args.layer_attention != "none" and args.fuse_encoder != "none":
        raise ConfigurationError(
            f"--layer-attention {args.layer_attention} and --fuse-encoder {args.fuse_encoder} both define the "
            "decoder's source memory (per-layer mixtures vs one fused memory); choose one of them"
        )
    if args.mask_encoder_layer is not None:
        if type(args.mask_encoder_layer) is not int:
            raise ConfigurationError(f"--mask-encoder-layer must be an integer, got {args.mask_encoder_layer!r}")
        if args.layer_attention == "none":
            raise ConfigurationError(
                f"--mask-encoder-layer {args.mask_encoder_layer} masks a layer-attention weight, which needs "
                "--layer-attention coarse or fine"
            )
        if not 0 <= args.mask_encoder_layer <= args.encoder_layers:
            raise ConfigurationError(
                f"--mask-encoder-layer {args.mask_encoder_layer} does not exist: the encoder has layers "
                f"0 (embedding) to {args.encoder_layers}"
            )
    if args.layer_attention != "none" and args.encoder_embed_dim != args.decoder_embed_dim:
        raise ConfigurationError(
            f"--layer-attention needs --encoder-embed-dim ({args.encoder_embed_dim}) == "
            f"--decoder-embed-dim ({args.decoder_embed_dim})"
        )
    if args.surface_fusion != "none" and getattr(args, "adaptive_softmax_cutoff", None):
        raise ConfigurationError(
            f"--surface-fusion {args.surface_fusion} projects the surface attention with the full output "
            f"matrix; --adaptive-softmax-cutoff {args.adaptive_softmax_cutoff} replaces it: use one of them"
        )
    if args.surface_fusion != "none" and args.encoder_embed_dim != args.decoder_embed_dim:
        raise ConfigurationError(
            f"--surface-fusion reads source word embeddings through the target output projection, which needs "
            f"--encoder-embed-dim ({args.encoder_embed_dim}) == --decoder-embed-dim ({args.decoder_embed_dim})"
        )


def check_positive_ints(args, table):
    """Raise ``ConfigurationError`` for the first value of ``table`` (dest -> flag) that is no positive
    integer (e.g. text given by --model-overrides)."""
    for dest, flag in table.items():
        value = getattr(args, dest)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(positive_int_error(flag, value))


def check_switches(args, table):
    """Raise ``ConfigurationError`` for the first value of ``table`` (dest -> flag) that is not True or
    False: a text such as 'yes' from --model-overrides would otherwise read as True."""
    for dest, flag in table.items():
        if not isinstance(getattr(args, dest), bool):
            raise ConfigurationError(f"{flag} is a switch: True or False, got {getattr(args, dest)!r}")


def check_mlrf_args(args):
    with_layer_embedding = ("sa", "fnn")
    if args.fuse_encoder in with_layer_embedding and args.fuse_decoder in with_layer_embedding \
            and not args.fusion_no_layer_embedding:
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ConfigurationError(
                f"--fuse-encoder {args.fuse_encoder} and --fuse-decoder {args.fuse_decoder} share one layer "
                "embedding, which needs "
                f"--encoder-embed-dim ({args.encoder_embed_dim}) == --decoder-embed-dim ({args.decoder_embed_dim}); "
                "or pass --fusion-no-layer-embedding"
            )

"""The command-line flags of the layer-fusion Transformer, and their validation.

One table (``POSITIVE_INT_FLAGS`` and the choice flags) serves both argparse, so that the CLI
rejects bad values with the flag's name, and :func:`check_fusion_args`, so that configurations
built in code or read from a checkpoint get the same errors.
"""

import argparse

from fusion_fairseq.modules import FUSION_FUNCTIONS

POSITIVE_INT_FLAGS = {
    "fusion_hops": "--fusion-hops",
    "fusion_attn_dim": "--fusion-attn-dim",
    "fusion_ffn_dim": "--fusion-ffn-dim",
}
CHOICE_FLAGS = {
    "fuse_encoder": ("--fuse-encoder", FUSION_FUNCTIONS),
    "fuse_decoder": ("--fuse-decoder", FUSION_FUNCTIONS),
}


def positive_int_error(flag, value):
    return f"{flag} must be a positive integer, got {value!r}"


def _positive_int(flag):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(positive_int_error(flag, text))
        if value <= 0:
            raise argparse.ArgumentTypeError(positive_int_error(flag, text))
        return value

    return parse


def _probability(flag):
    def parse(text):
        value = float(text)
        if not 0.0 <= value < 1.0:
            raise argparse.ArgumentTypeError(f"{flag} must be in [0, 1), got {text!r}")
        return value

    return parse


def add_fusion_args(parser):
    """MLRF flags (Wang et al., COLING 2018). Defaults come from the architecture functions."""
    for dest, (flag, choices) in CHOICE_FLAGS.items():
        side = dest.split("_")[1]
        parser.add_argument(
            flag, choices=choices, metavar="{" + ",".join(choices) + "}",
            help=f"fuse all {side} layers (h0 included) by average pooling, a single-hidden-layer "
            f"FNN, or multi-hop self-attention (MLRF Sec. 3.2); 'none' keeps the top layer",
        )
    parser.add_argument("--fusion-hops", type=_positive_int("--fusion-hops"), metavar="N",
                        help="number of attention hops nhop of self-attention fusion (MLRF Eq. 5)")
    parser.add_argument("--fusion-attn-dim", type=_positive_int("--fusion-attn-dim"), metavar="N",
                        help="inner size da of the attention FNN of self-attention fusion (MLRF Eq. 5)")
    parser.add_argument("--fusion-ffn-dim", type=_positive_int("--fusion-ffn-dim"), metavar="N",
                        help="hidden units df of the fusion FNN (FNN fusion and after the hops)")
    parser.add_argument("--fusion-independent-w1", action="store_true",
                        help="one W1 per layer in self-attention fusion (MLRF Table 3, '+ indep. W1')")
    parser.add_argument("--fusion-no-embedding-layer", action="store_true",
                        help="do not fuse the embedding layer h0 (MLRF Table 4 ablation)")
    parser.add_argument("--fusion-no-layer-embedding", action="store_true",
                        help="no layer embedding in self-attention fusion (MLRF Eq. 4, Table 4 ablation)")
    parser.add_argument("--fusion-no-layernorm", action="store_true",
                        help="skip the layer normalisation after the fusion layer")
    parser.add_argument("--fusion-dropout", type=_probability("--fusion-dropout"), metavar="P",
                        help="dropout on the hidden units of the fusion FNNs (default: --dropout)")


def check_fusion_args(args):
    """Raise ``ValueError`` naming the flag, the value and what is allowed."""
    for dest, (flag, choices) in CHOICE_FLAGS.items():
        value = getattr(args, dest)
        if value not in choices:
            raise ValueError(f"{flag} got {value!r}; allowed: {', '.join(choices)}")
    for dest, flag in POSITIVE_INT_FLAGS.items():
        value = getattr(args, dest)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(positive_int_error(flag, value))
    if not 0.0 <= args.fusion_dropout < 1.0:
        raise ValueError(f"--fusion-dropout must be in [0, 1), got {args.fusion_dropout!r}")
    fusing = args.fuse_encoder != "none" or args.fuse_decoder != "none"
    if fusing and (args.encoder_layerdrop > 0 or args.decoder_layerdrop > 0):
        raise ValueError(
            "layer fusion needs every layer's output: --encoder-layerdrop/--decoder-layerdrop must be 0 "
            f"with --fuse-encoder {args.fuse_encoder} --fuse-decoder {args.fuse_decoder}"
        )
    if args.fuse_encoder == "sa" and args.fuse_decoder == "sa" and not args.fusion_no_layer_embedding:
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ValueError(
                "--fuse-encoder sa and --fuse-decoder sa share one layer embedding, which needs "
                f"--encoder-embed-dim ({args.encoder_embed_dim}) == --decoder-embed-dim ({args.decoder_embed_dim}); "
                "or pass --fusion-no-layer-embedding"
            )

#!/usr/bin/env python
"""The layer attention of multi-hop self-attention fusion, as in MLRF Figure 5 (Wang et al., COLING
2018, Sec. 4.8): one panel per hop; x-axis the words, y-axis the layers including the word
embedding layer l0; white is probability 1, black 0.

Decoder side (``--fuse-decoder sa``): ``extra["fusion_attn"]`` of the teacher-forced forward, one
column per decoder position; without ``--target``, of the beam-search translation. Encoder side
(``--fuse-encoder sa``): the encoder's ``fusion_weights``, one column per source word plus EOS.
Rows are l0..lL, or l1..lL for a checkpoint trained with ``--fusion-no-embedding-layer``.
"""

import os
import sys

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_lab.analysis import UsageError, checkpoint_setting, format_matrix, heatmap, load_model, positive, \
    pyplot, script_main, script_parser, sentence_pair, write_outputs  # noqa: E402

X_AXIS = {"predicted": "target word predicted at each position (fed: the previous word, EOS first)",
          "fed": "target word fed into the decoder at each position (EOS first)",
          "both": "target word fed -> word predicted at each position"}


PARSER = script_parser(__doc__, sentence=True, data_required=True)
PARSER.add_argument("--side", choices=("decoder", "encoder"), default="decoder",
                    help="which fusion layer to plot (default: decoder, MLRF Dec-SA)")
PARSER.add_argument("--xlabels", choices=tuple(X_AXIS), default=None,
                    help="decoder side: label each position with the word predicted there (default), "
                    "the word fed into the decoder, or 'fed->predicted'")
PARSER.add_argument("--beam", type=positive(int, "--beam"), default=None, help="beam size when translating (default 5)")


def hop_title(hop: int) -> str:
    return f"({chr(ord('a') + hop)}) Hop {hop + 1}"


def plot(weights, x_labels, y_labels, x_axis_label: str, suptitle: str):
    nhop, num_layers, length = weights.shape
    fig, axes = pyplot().subplots(nhop, 1, squeeze=False, layout="constrained", figsize=(
        max(4.0, 0.45 * length + 1.5) + 1.0, (0.32 * num_layers + 1.1) * nhop + 0.6))
    for hop, ax in enumerate(axes[:, 0]):
        image = heatmap(ax, weights[hop], x_labels, y_labels, cmap="gray", origin="lower", rotate_x=True,
                        title=hop_title(hop), ylabel="layer", xlabel=x_axis_label if hop == nhop - 1 else "")
    fig.suptitle(suptitle, fontsize=9)
    fig.colorbar(image, ax=list(axes[:, 0]), fraction=0.04, pad=0.02, shrink=0.6).set_label(
        "probability (white = 1, black = 0)", fontsize=8)
    return fig


@torch.no_grad()
def run(args) -> dict:
    if args.side == "encoder":  # the encoder's fusion reads the source alone
        given = [flag for flag, value in (("--target", args.target), ("--xlabels", args.xlabels), ("--beam", args.beam))
                 if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: the decoder side's; --side encoder plots the source alone")
    args.xlabels, args.beam = args.xlabels or "predicted", args.beam or 5
    model, cfg, task = load_model(args.path, args.data, args.user_dir)
    checkpoint_setting(cfg.model, "fuse", ("sa",), f"--side {args.side}", "there is no layer attention to plot",
                       side=args.side)
    fusion = getattr(model, args.side).output_fusion
    pair = sentence_pair(args, model, task, args.side == "decoder", beam=args.beam)
    first = 0 if fusion.include_embedding_layer else 1
    result = {"checkpoint": args.path, "side": args.side, "source_tokens": pair.source,
              "layer_labels": [f"l{first + i}" for i in range(fusion.function.num_layers)],
              "include_embedding_layer": bool(fusion.include_embedding_layer)}
    if args.side == "encoder":
        attn = model.encoder.fusion_weights(pair.src_tokens, pair.src_lengths)[:, 0]
        x_labels, x_axis_label = pair.source, "source word at each position (EOS appended)"
    else:
        attn = model(pair.src_tokens, pair.src_lengths, pair.prev_output_tokens)[1]["fusion_attn"][0]
        result.update(target_from=pair.target_from, target_tokens=pair.predicted[:-1],
                      predicted_tokens=pair.predicted, fed_tokens=pair.fed)
        x_labels = {"predicted": pair.predicted, "fed": pair.fed,
                    "both": [f"{f}->{p}" for f, p in zip(pair.fed, pair.predicted)]}[args.xlabels]
        x_axis_label = X_AXIS[args.xlabels]
    weights = attn.permute(1, 2, 0).float()  # (length, nhop, L) -> (nhop, L, length)
    result.update(x_labels=x_labels, x_axis_label=x_axis_label, shape=list(weights.shape), weights=weights.tolist())
    print(f"{args.side} self-attention fusion over layers, {weights.shape[0]} hops; source: "
          f"{' '.join(result['source_tokens'][:-1])}\nrows = layers, columns = {x_axis_label}")
    for hop, matrix in enumerate(weights):  # rows = layers, the top layer first as in the figure
        print(format_matrix(hop_title(hop), matrix.flip(0), result["layer_labels"][::-1], x_labels))
    side = "Dec" if args.side == "decoder" else "Enc"
    return write_outputs(args, result, plot(weights.numpy(), x_labels, result["layer_labels"], x_axis_label,
                                            f"{side}-SA ({weights.shape[0]} hops): {os.path.basename(args.path)}"))


main = script_main(PARSER.parse_args, run, "plot_fusion_attention.py", __name__)

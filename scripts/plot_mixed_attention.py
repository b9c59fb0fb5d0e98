#!/usr/bin/env python
"""The mixed attention of a layer-wise coordination model, as in He et al. (2018) Figure 4.

``--layer I`` is 1-based; the paper's Figure 4 shows layer 1, the lowest. Plotted: the layer's
mixed-attention weights (Eq. 3) averaged over heads, ``extra["mixed_attn"]`` of the decoder's
teacher-forced forward with ``alignment_layer=I-1``; without ``--target``, of the beam-search
translation (``--beam 6 --lenpen 1.1``, the paper's IWSLT setting). Rows: the target positions
(``fed->predicted``); columns: the source words (EOS appended) | the target positions. The future
target positions, which Eq. 3 masks, are exactly 0: hatched in the figure, ``-`` in the text.
"""

import os
import sys

import matplotlib.patches
import numpy as np
import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_fairseq.models.layerwise_coordination import LayerwiseCoordinationModel  # noqa: E402
from fusion_lab.analysis import UsageError, finite, format_matrix, heatmap, load_model, positive, pyplot, \
    script_main, script_parser, sentence_pair, write_outputs  # noqa: E402


def parse_args(argv=None):
    parser = script_parser(__doc__, sentence=True, data_required=True, out_required=False)
    parser.add_argument("--layer", required=True, type=int, metavar="I",
                        help="layer to plot, 1-based: 1 = the lowest layer (the paper's Figure 4), N = the top layer")
    parser.add_argument("--beam", type=positive(int, "--beam"), default=6, help="beam size when translating")
    parser.add_argument("--lenpen", type=finite("--lenpen"), default=1.1, help="length penalty when translating")
    parser.add_argument("--max-len", type=positive(int, "--max-len"), default=200,
                        help="when translating: at most this many target tokens (fairseq's max_len_b)")
    args = parser.parse_args(argv)
    args.out = args.out or f"mixed-attention-layer{args.layer}.png"
    return args


def plot(weights, mask, row_labels, column_labels, source_length: int, title: str):
    rows, columns = weights.shape
    fig, ax = pyplot().subplots(figsize=(max(5.0, 0.42 * columns + 2.5), max(3.0, 0.38 * rows + 2.0)),
                                layout="constrained")
    heatmap(ax, np.where(mask, np.nan, weights), column_labels, row_labels, rotate_x=True,  # masked cells blank
            colorbar="attention weight", ylabel="target position (token fed -> token predicted)",
            xlabel="source words (EOS appended)  |  target positions (tokens fed, </s> = start)",
            title=title + "\nred line: source | target; hatched: masked future target positions")
    for row in range(rows - 1):  # hatch the masked span of each row: the target positions after it
        ax.add_patch(matplotlib.patches.Rectangle((source_length + row + 0.5, row - 0.5), rows - row - 1, 1.0,
                                                  fill=False, hatch="///", edgecolor="0.8", linewidth=0.0))
    ax.axvline(source_length - 0.5, color="crimson", linewidth=2.0)  # source | target separator
    top = ax.secondary_xaxis("top")
    top.set_xticks([(source_length - 1) / 2.0, source_length + (columns - source_length - 1) / 2.0],
                   ["source", "target"], fontsize=9)
    top.tick_params(length=0)
    return fig


@torch.no_grad()
def run(args) -> dict:
    model, cfg, task = load_model(args.path, args.data, args.user_dir)
    if not isinstance(model, LayerwiseCoordinationModel):
        arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None) or "unknown"
        raise UsageError(f"--path {args.path}: the checkpoint's model is {type(model).__name__} (--arch {arch}), not "
                         "layerwise_coordination; mixed attention exists only in a layerwise_coordination checkpoint")
    num_layers, layer_index = len(model.decoder.layers), args.layer - 1
    if not all(getattr(layer, "mixed", True) for layer in model.decoder.layers):
        raise UsageError(f"--path {args.path}: the checkpoint was trained with --no-mixed-attention (Table 3 "
                         "ablation): its target side has a separate self-attention and source attention, no mixed "
                         "attention to plot")
    if not 1 <= args.layer <= num_layers:
        raise UsageError(f"--layer {args.layer}: out of range; the checkpoint has {num_layers} layers, allowed "
                         f"1..{num_layers} (1-based: 1 = the lowest layer)")
    pair = sentence_pair(args, model, task, beam=args.beam, lenpen=args.lenpen, max_len_a=0, max_len_b=args.max_len)
    encoder_out = model.encoder(pair.src_tokens, src_lengths=pair.src_lengths)
    _, extra = model.decoder(pair.prev_output_tokens, encoder_out=encoder_out, alignment_layer=layer_index)
    values = extra["mixed_attn"][0][0].float().numpy()
    source, predicted, fed = pair.source, pair.predicted, pair.fed
    row_labels = [f"{f}->{p}" for f, p in zip(fed, predicted)]
    mask = np.arange(len(source) + len(fed)) > len(source) + np.arange(len(fed))[:, None]  # Eq. 3: in row i, j > i
    result = {
        "checkpoint": args.path, "layer": args.layer, "layer_index": layer_index,
        "layer_numbering": "--layer is 1-based (1 = lowest layer); layer_index is the 0-based decoder alignment_layer",
        "num_layers": num_layers, "source_tokens": source, "target_tokens": predicted[:-1], "target_fed_tokens": fed,
        "predicted_tokens": predicted, "target_from": pair.target_from, "source_length": len(source),
        "target_length": len(fed), "row_labels": row_labels, "column_labels": source + fed,
        "shape": list(values.shape), "weights": values.tolist(), "masked": mask.tolist(),
        "source_mass": values[:, :len(source)].sum(axis=1).tolist(),
    }
    title = (f"mixed attention, layer {args.layer} of {num_layers} (1-based), averaged over heads; "
             f"source: {' '.join(source[:-1])}")
    cells = [["-" if masked else f"{v:.3f}" for v, masked in zip(*row)] for row in zip(values, mask)]
    print(format_matrix(f"{title}\nrows = target positions (token fed -> token predicted), columns = source words | "
                        "target positions; '-' = masked future position",
                        [row[:len(source)] + ["|"] + row[len(source):] for row in cells], row_labels,
                        source + ["|"] + fed, cell=str))
    return write_outputs(args, result, plot(
        values, mask, row_labels, source + fed, len(source),
        f"Mixed attention, layer {args.layer}/{num_layers}: {os.path.basename(args.path)}"))


main = script_main(parse_args, run, "plot_mixed_attention.py", __name__)

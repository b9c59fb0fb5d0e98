#!/usr/bin/env python
"""Plot the mixed attention of a layer-wise coordination model, as in He et al. (2018) Figure 4.

    python scripts/plot_mixed_attention.py --path CKPT --data DATA_BIN \\
        --source "zwei minuten später ..." [--target "two minutes later ..."] --layer 1 \\
        [--out fig.png] [--json weights.json]

``--layer I`` is 1-based: layer 1 is the lowest layer of the stack (its target positions read
the embeddings of the source and of the preceding target tokens), layer N the top one. The
paper's Figure 4 shows layer 1 ("the first layer of the decoder").

The target is teacher-forced through the decoder with fairseq's ``prev_output_tokens`` (EOS as
the start symbol, then the target words), after the source sentence has been encoded, and
``extra["mixed_attn"]`` of the decoder's forward with ``alignment_layer=I-1`` is plotted: the
layer's mixed-attention weights (Eq. 3) averaged over heads. Without ``--target`` the source is
first translated with beam search (``--beam``, ``--lenpen``; default 6 and 1.1, the paper's
IWSLT setting) and the hypothesis is plotted.

The matrix (Figure 4):

* rows: the target positions, one per token fed to the decoder -- the start symbol (``</s>``)
  and the target words; a row is labelled ``fed->predicted`` (``--row-labels`` changes that):
  the row of "happened" is where the model predicts the word after "happened";
* columns: the source words (EOS appended, as fairseq encodes the source) then the target
  positions, labelled with the token fed there; a vertical line separates the two parts;
* every row sums to 1 over the source columns and the target columns up to the row's own
  position. The later (future) target positions are masked by Eq. 3: their weight is exactly 0;
  in the figure they are left blank (hatched), in the text dump they print as ``-``.

The weights are printed as text (rows = target positions; ``|`` between source and target) and
``--json OUT`` writes them with their labels: ``weights[row][column]`` over
``columns = source_tokens + target_fed_tokens``, the masked future positions as 0.

Input text is split on whitespace (after ``--bpe subword_nmt --bpe-codes FILE`` when given) and
looked up in the task's (joined) dictionary. A word that is not in the dictionary is an error
naming the flag and the word; ``--allow-unk`` maps it to <unk> with a warning.

Exit status: 0 on success, 2 with a message naming the flag and its value on bad input (layer
out of range, a checkpoint that is not ``layerwise_coordination`` or was trained without mixed
attention, unknown word, empty sentence, missing file).
"""

import argparse
import os
import sys
from typing import List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.append(REPO_ROOT)

# fusion_fairseq.tools.analysis imports the plugin (registers the models; --user-dir is optional)
from fusion_fairseq.tools.analysis import (  # noqa: E402
    add_dpi_argument,
    finite,
    UsageError as PlotError,
    add_force_argument,
    add_text_input_arguments,
    add_user_dir_argument,
    beam_search,
    build_bpe,
    check_bpe_arguments,
    check_outputs,
    encode_sentence,
    load_model,
    positive,
    run_main,
    teacher_forced_input,
    token_strings,
    use_agg_backend,
    write_json,
)
from fusion_fairseq.models.layerwise_coordination import LayerwiseCoordinationModel  # noqa: E402

use_agg_backend()

import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

PROG = "plot_mixed_attention.py"
MASKED_TEXT = "-"


def parse_args(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot the mixed-attention weights of one layer of a layer-wise coordination model over "
        "source and target positions (He et al. 2018, Figure 4).",
    )
    parser.add_argument("--path", required=True, help="checkpoint file (fairseq-train output, layerwise_coordination)")
    parser.add_argument("--data", required=True, help="binarised data directory (for the joined dictionary)")
    parser.add_argument("--source", required=True, help="source sentence, tokens separated by spaces")
    parser.add_argument("--target", help="target sentence to teacher-force; default: translate --source with beam "
                        "search and plot the hypothesis")
    parser.add_argument("--layer", required=True, type=int, metavar="I",
                        help="layer to plot, 1-based: 1 = the lowest layer (the paper's Figure 4), N = the top layer")
    parser.add_argument("--out", help="PNG file to write (default: mixed-attention-layerI.png)")
    parser.add_argument("--json", metavar="OUT", help="also write the weights and labels as JSON")
    add_user_dir_argument(parser)
    add_text_input_arguments(parser)
    parser.add_argument("--row-labels", choices=("both", "fed", "predicted"), default="both",
                        help="label each target row 'fed->predicted' (default), with the token fed at that "
                        "position, or with the token predicted there")
    parser.add_argument("--beam", type=positive(int, "--beam"), default=6,
                        help="beam size when translating (default: 6, as the paper)")
    parser.add_argument("--lenpen", type=finite("--lenpen"), default=1.1,
                        help="length penalty when translating (default: 1.1, as the paper for IWSLT)")
    parser.add_argument("--max-len", type=int, default=200,
                        help="when translating: at most this many target tokens (fairseq's max_len_b; default: 200)")
    add_dpi_argument(parser)
    add_force_argument(parser)
    args = parser.parse_args(argv)
    check_bpe_arguments(parser, args)
    if args.beam < 1:
        parser.error(f"--beam must be a positive integer, got {args.beam}")
    if args.max_len < 1:
        parser.error(f"--max-len must be a positive integer, got {args.max_len}")
    if args.out is None:
        args.out = f"mixed-attention-layer{args.layer}.png"
    return args


# --------------------------------------------------------------------------------------------
# loading


def checkpoint_arch(cfg) -> str:
    model_cfg = cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None)
    return str(getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or "unknown")


def check_model(model, cfg, path: str) -> int:
    """The number of layers N of a layer-wise coordination model with mixed attention."""
    if not isinstance(model, LayerwiseCoordinationModel):
        raise PlotError(
            f"--path {path}: the checkpoint's model is {type(model).__name__} (--arch {checkpoint_arch(cfg)}), "
            "not layerwise_coordination; mixed attention exists only in a layerwise_coordination checkpoint"
        )
    layers = model.decoder.layers
    if not all(getattr(layer, "mixed", True) for layer in layers):
        raise PlotError(
            f"--path {path}: the checkpoint was trained with --no-mixed-attention (Table 3 ablation): its target "
            "side has a separate self-attention and source attention, no mixed attention to plot"
        )
    return len(layers)


def check_layer(layer: int, num_layers: int) -> int:
    """0-based index of the 1-based ``--layer``."""
    if not 1 <= layer <= num_layers:
        raise PlotError(
            f"--layer {layer}: out of range; the checkpoint has {num_layers} layers, allowed 1..{num_layers} "
            "(1-based: 1 = the lowest layer)"
        )
    return layer - 1


# --------------------------------------------------------------------------------------------
# text -> tokens


def translate(model, task, src_tokens: torch.Tensor, beam: int, lenpen: float, max_len: int = 200) -> torch.Tensor:
    """Best beam-search hypothesis (token ids ending with EOS)."""
    return beam_search(model, task, src_tokens, beam=beam, lenpen=lenpen, max_len_a=0, max_len_b=max_len)


# --------------------------------------------------------------------------------------------
# weights


def mixed_attention(model, src_tokens: torch.Tensor, tgt_tokens: torch.Tensor, layer_index: int) -> torch.Tensor:
    """``(len(tgt_tokens), len(src_tokens) + len(tgt_tokens))``: ``extra["mixed_attn"]`` of layer
    ``layer_index`` (0-based) for the target teacher-forced as ``[EOS] + tgt_tokens[:-1]``."""
    prev_output_tokens = teacher_forced_input(model, tgt_tokens)
    with torch.no_grad():
        encoder_out = model.encoder(src_tokens.unsqueeze(0), src_lengths=torch.tensor([src_tokens.numel()]))
        _, extra = model.decoder(prev_output_tokens, encoder_out=encoder_out, alignment_layer=layer_index)
    weights = extra.get("mixed_attn", [None])[0]
    if weights is None:
        raise PlotError(f"--layer {layer_index + 1}: the decoder's forward returned no extra['mixed_attn']")
    expected = (1, tgt_tokens.numel(), src_tokens.numel() + tgt_tokens.numel())
    if tuple(weights.shape) != expected:
        raise PlotError(f"--layer {layer_index + 1}: extra['mixed_attn'] has shape {tuple(weights.shape)}, "
                        f"expected {expected}")
    return weights[0].float()


def future_mask(target_length: int, source_length: int) -> np.ndarray:
    """True where Eq. 3 masks: target row i, target column j > i."""
    mask = np.zeros((target_length, source_length + target_length), dtype=bool)
    for row in range(target_length):
        mask[row, source_length + row + 1:] = True
    return mask


# --------------------------------------------------------------------------------------------
# output


def format_weights(weights: np.ndarray, mask: np.ndarray, row_labels: List[str], column_labels: List[str],
                   source_length: int, title: str) -> str:
    """Rows = target positions (top to bottom, as in the figure); columns = source | target."""
    width = max(6, max(len(label) for label in column_labels))
    row_label_width = max(len(label) for label in row_labels)

    def cells(values):
        return [MASKED_TEXT.rjust(width) if masked else f"{float(v):.3f}".rjust(width) for v, masked in values]

    header = [label.rjust(width) for label in column_labels]
    lines = [title, " " * row_label_width + " " + " ".join(header[:source_length]) + " | "
             + " ".join(header[source_length:])]
    for row, label in enumerate(row_labels):
        values = cells(zip(weights[row], mask[row]))
        lines.append(label.rjust(row_label_width) + " " + " ".join(values[:source_length]) + " | "
                     + " ".join(values[source_length:]))
    return "\n".join(lines)


ROW_AXIS_LABELS = {
    "both": "target position (token fed -> token predicted)",
    "fed": "target position (token fed)",
    "predicted": "target position (token predicted)",
}


def plot(weights: np.ndarray, mask: np.ndarray, row_labels: List[str], column_labels: List[str],
         source_length: int, out: str, title: str, dpi: int, row_axis_label: str = ROW_AXIS_LABELS["both"]):
    rows, columns = weights.shape
    fig_width = max(5.0, 0.42 * columns + 2.5)
    fig_height = max(3.0, 0.38 * rows + 2.0)
    fig, ax = plt.subplots(figsize=(fig_width, fig_height), layout="constrained")
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="white")  # masked future target positions stay blank
    image = ax.imshow(np.ma.masked_array(weights, mask=mask), cmap=cmap, vmin=0.0, vmax=1.0,
                      aspect="auto", interpolation="nearest")
    for row in range(rows):  # hatch the masked span of each row
        first = source_length + row + 1
        if first < columns:
            ax.add_patch(matplotlib.patches.Rectangle(
                (first - 0.5, row - 0.5), columns - first, 1.0, fill=False, hatch="///",
                edgecolor="0.8", linewidth=0.0,
            ))
    ax.axvline(source_length - 0.5, color="crimson", linewidth=2.0)  # source | target separator
    ax.set_xticks(range(columns))
    ax.set_xticklabels(column_labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(row_labels, fontsize=8)
    ax.set_ylabel(row_axis_label, fontsize=8)
    ax.set_xlabel("source words (EOS appended)  |  target positions (tokens fed, </s> = start)", fontsize=8)
    top = ax.secondary_xaxis("top")
    top.set_xticks([(source_length - 1) / 2.0, source_length + (columns - source_length - 1) / 2.0])
    top.set_xticklabels(["source", "target"], fontsize=9)
    top.tick_params(length=0)
    ax.set_title(title + "\nred line: source | target; hatched: masked future target positions", fontsize=9)
    colorbar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, shrink=0.8)
    colorbar.set_label("attention weight", fontsize=8)
    colorbar.ax.tick_params(labelsize=8)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def run(args) -> dict:
    check_outputs(args, [("--out", args.out), ("--json", args.json)], inputs=[("--path", args.path)])
    model, cfg, task = load_model(args.path, args.data, args.user_dir)
    num_layers = check_model(model, cfg, args.path)
    layer_index = check_layer(args.layer, num_layers)
    bpe = build_bpe(args)
    dictionary = task.source_dictionary
    src_tokens = encode_sentence(args.source, dictionary, "--source", bpe, args.allow_unk,
                                 max_tokens=model.encoder.max_positions())
    if args.target is not None:
        tgt_tokens = encode_sentence(args.target, task.target_dictionary, "--target", bpe, args.allow_unk,
                                     max_tokens=model.decoder.max_positions())
        target_from = "--target"
    else:
        tgt_tokens = translate(model, task, src_tokens, args.beam, args.lenpen, args.max_len)
        target_from = f"beam search (beam {args.beam}, lenpen {args.lenpen})"
    weights = mixed_attention(model, src_tokens, tgt_tokens, layer_index)

    source = token_strings(dictionary, src_tokens)
    predicted = token_strings(task.target_dictionary, tgt_tokens)
    fed = [task.target_dictionary[task.target_dictionary.eos()]] + predicted[:-1]
    row_labels = {"both": [f"{f}->{p}" for f, p in zip(fed, predicted)], "fed": fed,
                  "predicted": predicted}[args.row_labels]
    column_labels = source + fed
    mask = future_mask(len(fed), len(source))
    values = weights.numpy()
    result = {
        "checkpoint": args.path,
        "layer": args.layer,
        "layer_index": layer_index,
        "layer_numbering": "--layer is 1-based (1 = lowest layer); layer_index is the 0-based decoder alignment_layer",
        "num_layers": num_layers,
        "source_tokens": source,
        "target_tokens": predicted[:-1],
        "target_fed_tokens": fed,
        "predicted_tokens": predicted,
        "target_from": target_from,
        "source_length": len(source),
        "target_length": len(fed),
        "row_labels": row_labels,
        "column_labels": column_labels,
        "shape": list(values.shape),
        "weights": values.tolist(),
        "masked": mask.tolist(),
        "source_mass": values[:, :len(source)].sum(axis=1).tolist(),
    }
    title = (f"mixed attention, layer {args.layer} of {num_layers} (1-based), averaged over heads; "
             f"source: {' '.join(source[:-1])}")
    rows_are = ROW_AXIS_LABELS[args.row_labels].replace("target position", "target positions")
    print(format_weights(values, mask, row_labels, column_labels, len(source),
                         f"{title}\nrows = {rows_are}, columns = source words | target positions; "
                         f"'{MASKED_TEXT}' = masked future position"))
    plot(values, mask, row_labels, column_labels, len(source), args.out,
         f"Mixed attention, layer {args.layer}/{num_layers}: {os.path.basename(args.path)}", args.dpi,
         ROW_AXIS_LABELS[args.row_labels])
    print(f"wrote {args.out}")
    if args.json:
        write_json(args.json, result)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(run, parse_args(argv), PROG)


if __name__ == "__main__":
    sys.exit(main())

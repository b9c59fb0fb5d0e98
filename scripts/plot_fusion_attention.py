#!/usr/bin/env python
"""Plot the layer attention of multi-hop self-attention fusion, as in MLRF Figure 5.

Wang et al. (COLING 2018), Sec. 4.8: one panel per hop; the x-axis is the word sequence, the
y-axis the layer index including the word embedding layer l0; white is probability 1, black 0.

    python scripts/plot_fusion_attention.py --path CKPT --data DATA_BIN \\
        --source "w3 w17 w5" [--target "W5 W17 W3"] [--side decoder|encoder] --out fig.png

Decoder side (default; needs ``--fuse-decoder sa``): the target is teacher-forced through the
model with fairseq's ``prev_output_tokens`` (EOS, then the target words), and
``extra["fusion_attn"]`` of the decoder's forward is plotted. There is one column per decoder
position: the target words plus the final EOS, i.e. ``len(target) + 1`` columns. Column j is
labelled with the word *predicted* there (the j-th target word, EOS last); the word *fed* at
that position is the previous one (EOS first). ``--xlabels fed|both`` changes the labels. Without
``--target`` the source is translated first (beam 5) and the hypothesis is plotted.

Encoder side (``--side encoder``; needs ``--fuse-encoder sa``): one column per source position,
the source words plus the EOS fairseq appends, from the encoder's ``fusion_weights``.

Rows are the fused layers: l0..lL, or l1..lL when the checkpoint was trained with
``--fusion-no-embedding-layer`` (read from the fusion module's ``include_embedding_layer``).

Input text is split on whitespace (after ``--bpe subword_nmt --bpe-codes FILE`` when given) and
each token is looked up in the task's dictionary. A token that is not in the dictionary is an
error naming the token and the flag; with ``--allow-unk`` it is mapped to <unk> with a warning.

Besides the PNG, the weights are printed as text, one matrix per hop (rows = layers, top layer
first as in the figure; columns = words), and ``--json OUT`` writes them as
``weights[hop][layer][position]`` with layer 0 the lowest fused layer (see ``layer_labels``).

Exit status: 0 on success, 2 with a message naming the flag on bad input (missing fusion on the
requested side, unknown word, empty sentence, missing file).
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
from fusion_fairseq.modules import AverageFusion, FeedForwardFusion, MultiHopAttentionFusion  # noqa: E402

use_agg_backend()

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

PROG = "plot_fusion_attention.py"
FUSION_NAMES = {
    "none": "no fusion, the top layer only",
    "avg": "average-pooling fusion",
    "fnn": "single-hidden-layer FNN fusion",
    "sa": "multi-hop self-attention fusion",
}


def parse_args(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(
        description="Plot the hop-by-layer attention of self-attention layer fusion (MLRF Figure 5).",
    )
    parser.add_argument("--path", required=True, help="checkpoint file (fairseq-train output)")
    parser.add_argument("--data", required=True, help="binarised data directory (for the dictionaries)")
    parser.add_argument("--source", required=True, help="source sentence, tokens separated by spaces")
    parser.add_argument("--target", help="target sentence to teacher-force (decoder side); "
                        "default: translate --source with beam search and plot the hypothesis")
    parser.add_argument("--side", choices=("decoder", "encoder"), default="decoder",
                        help="which fusion layer to plot (default: decoder, MLRF Dec-SA)")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--json", metavar="OUT", help="also write the weights and labels as JSON")
    add_user_dir_argument(parser)
    add_text_input_arguments(parser)
    parser.add_argument("--xlabels", choices=("predicted", "fed", "both"), default="predicted",
                        help="decoder side: label each position with the word predicted there (default), "
                        "the word fed into the decoder, or 'fed->predicted'")
    parser.add_argument("--beam", type=positive(int, "--beam"), default=5,
                        help="beam size when translating (default: 5)")
    add_dpi_argument(parser)
    add_force_argument(parser)
    args = parser.parse_args(argv)
    check_bpe_arguments(parser, args)
    return args


# --------------------------------------------------------------------------------------------
# loading


def fusion_kind(fusion) -> str:
    """'none' / 'avg' / 'fnn' / 'sa' of a side's ``output_fusion`` (a LayerFusion or None)."""
    if fusion is None:
        return "none"
    function = getattr(fusion, "function", None)
    if isinstance(function, MultiHopAttentionFusion):
        return "sa"
    if isinstance(function, FeedForwardFusion):
        return "fnn"
    if isinstance(function, AverageFusion):
        return "avg"
    return type(function).__name__


def side_fusion(model, side: str):
    """The side's self-attention fusion module, or a PlotError saying what the checkpoint has."""
    module = getattr(model, side)
    if not hasattr(module, "output_fusion"):
        raise PlotError(
            f"--side {side}: the checkpoint's model ({type(model).__name__}) has no layer fusion; "
            f"a fusion_transformer checkpoint trained with --fuse-{side} sa is needed"
        )
    kind = fusion_kind(module.output_fusion)
    if kind != "sa":
        other = "encoder" if side == "decoder" else "decoder"
        other_kind = fusion_kind(getattr(getattr(model, other), "output_fusion", None))
        hint = f"; its {other} has --fuse-{other} sa, try --side {other}" if other_kind == "sa" else ""
        raise PlotError(
            f"--side {side}: the checkpoint's {side} uses --fuse-{side} {kind} "
            f"({FUSION_NAMES.get(kind, kind)}), which has no layer attention to plot; "
            f"a checkpoint trained with --fuse-{side} sa is needed{hint}"
        )
    return module.output_fusion


def layer_labels(fusion) -> List[str]:
    first = 0 if fusion.include_embedding_layer else 1
    return [f"l{first + i}" for i in range(fusion.function.num_layers)]


# --------------------------------------------------------------------------------------------
# text -> tokens


def translate(model, task, src_tokens: torch.Tensor, beam: int) -> torch.Tensor:
    """Best beam-search hypothesis (token ids ending with EOS)."""
    return beam_search(model, task, src_tokens, beam=beam)


# --------------------------------------------------------------------------------------------
# weights


def decoder_weights(model, src_tokens: torch.Tensor, tgt_tokens: torch.Tensor) -> torch.Tensor:
    """``(nhop, layers, len(tgt_tokens))`` from ``extra["fusion_attn"]`` of a teacher-forced
    forward; ``tgt_tokens`` ends with EOS and is fed as ``[EOS] + tgt_tokens[:-1]``."""
    prev_output_tokens = teacher_forced_input(model, tgt_tokens)
    with torch.no_grad():
        _, extra = model(src_tokens.unsqueeze(0), torch.tensor([src_tokens.numel()]), prev_output_tokens)
    attn = extra.get("fusion_attn")
    if attn is None:
        raise PlotError("--side decoder: the decoder's forward returned no extra['fusion_attn']")
    return attn[0].permute(1, 2, 0).float()  # (tgt_len, nhop, L) -> (nhop, L, tgt_len)


def encoder_weights(model, src_tokens: torch.Tensor) -> torch.Tensor:
    """``(nhop, layers, len(src_tokens))`` from the encoder's ``fusion_weights``."""
    with torch.no_grad():
        attn = model.encoder.fusion_weights(src_tokens.unsqueeze(0), torch.tensor([src_tokens.numel()]))
    return attn[:, 0].permute(1, 2, 0).float()  # (src_len, nhop, L) -> (nhop, L, src_len)


# --------------------------------------------------------------------------------------------
# output


def format_weights(weights, x_labels: List[str], y_labels: List[str], title: str) -> str:
    """One matrix per hop; rows = layers (top layer first, as in the figure), columns = words."""
    width = max(6, max(len(label) for label in x_labels))
    row_label_width = max(len(label) for label in y_labels)
    lines = [title]
    for hop, matrix in enumerate(weights):
        lines.append(f"({chr(ord('a') + hop)}) Hop {hop + 1}")
        lines.append(" " * row_label_width + " " + " ".join(label.rjust(width) for label in x_labels))
        for layer in reversed(range(len(y_labels))):
            values = " ".join(f"{float(v):.3f}".rjust(width) for v in matrix[layer])
            lines.append(y_labels[layer].rjust(row_label_width) + " " + values)
    return "\n".join(lines)


def plot(weights, x_labels: List[str], y_labels: List[str], x_axis_label: str, out: str, suptitle: str, dpi: int):
    nhop, num_layers, length = weights.shape
    fig_width = max(4.0, 0.45 * length + 1.5)
    panel_height = 0.32 * num_layers + 1.1
    fig, axes = plt.subplots(nhop, 1, figsize=(fig_width + 1.0, panel_height * nhop + 0.6), squeeze=False,
                             layout="constrained")
    image = None
    for hop in range(nhop):
        ax = axes[hop][0]
        image = ax.imshow(weights[hop], cmap="gray", vmin=0.0, vmax=1.0, origin="lower",
                          aspect="auto", interpolation="nearest")
        ax.set_title(f"({chr(ord('a') + hop)}) Hop {hop + 1}", fontsize=10)
        ax.set_yticks(range(num_layers))
        ax.set_yticklabels(y_labels, fontsize=8)
        ax.set_xticks(range(length))
        ax.set_xticklabels(x_labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
    axes[-1][0].set_xlabel(x_axis_label, fontsize=8)
    fig.suptitle(suptitle, fontsize=9)
    colorbar = fig.colorbar(image, ax=[row[0] for row in axes], fraction=0.04, pad=0.02, shrink=0.6)
    colorbar.set_label("probability (white = 1, black = 0)", fontsize=8)
    colorbar.ax.tick_params(labelsize=8)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def run(args) -> dict:
    check_outputs(args, [("--out", args.out), ("--json", args.json)], inputs=[("--path", args.path)])
    model, _, task = load_model(args.path, args.data, args.user_dir)
    fusion = side_fusion(model, args.side)
    bpe = build_bpe(args)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_tokens = encode_sentence(args.source, src_dict, "--source", bpe, args.allow_unk)
    result = {
        "checkpoint": args.path,
        "side": args.side,
        "source_tokens": token_strings(src_dict, src_tokens),
        "layer_labels": layer_labels(fusion),
        "include_embedding_layer": bool(fusion.include_embedding_layer),
    }
    if args.side == "encoder":
        weights = encoder_weights(model, src_tokens)
        x_labels = result["source_tokens"]
        x_axis_label = "source word at each position (EOS appended)"
        title = f"encoder self-attention fusion over layers, {weights.shape[0]} hops"
    else:
        if args.target is not None:
            tgt_tokens = encode_sentence(args.target, tgt_dict, "--target", bpe, args.allow_unk)
            result["target_from"] = "--target"
        else:
            tgt_tokens = translate(model, task, src_tokens, args.beam)
            result["target_from"] = f"beam search (beam {args.beam})"
        weights = decoder_weights(model, src_tokens, tgt_tokens)
        predicted = token_strings(tgt_dict, tgt_tokens)
        fed = [tgt_dict[tgt_dict.eos()]] + predicted[:-1]
        result["target_tokens"] = predicted[:-1]
        result["predicted_tokens"] = predicted
        result["fed_tokens"] = fed
        if args.xlabels == "predicted":
            x_labels = predicted
            x_axis_label = "target word predicted at each position (fed: the previous word, EOS first)"
        elif args.xlabels == "fed":
            x_labels = fed
            x_axis_label = "target word fed into the decoder at each position (EOS first)"
        else:
            x_labels = [f"{f}->{p}" for f, p in zip(fed, predicted)]
            x_axis_label = "target word fed -> word predicted at each position"
        title = f"decoder self-attention fusion over layers, {weights.shape[0]} hops"
    result["x_labels"] = x_labels
    result["x_axis_label"] = x_axis_label
    result["shape"] = list(weights.shape)
    result["weights"] = weights.tolist()

    title += f"; source: {' '.join(result['source_tokens'][:-1])}"
    print(format_weights(weights, x_labels, result["layer_labels"],
                         f"{title}\nrows = layers, columns = {x_axis_label}"))
    plot(weights.numpy(), x_labels, result["layer_labels"], x_axis_label, args.out,
         f"{'Dec' if args.side == 'decoder' else 'Enc'}-SA ({weights.shape[0]} hops): "
         f"{os.path.basename(args.path)}", args.dpi)
    print(f"wrote {args.out}")
    if args.json:
        write_json(args.json, result)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(run, parse_args(argv), PROG)


if __name__ == "__main__":
    sys.exit(main())

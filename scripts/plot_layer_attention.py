#!/usr/bin/env python
"""Plot the learned layer-attention weights W of a checkpoint, as in Liu et al. (ICLR 2021) Figure 1.

    python scripts/plot_layer_attention.py --path CKPT [--data DATA_BIN] --out fig.png [--json w.json]

Layer attention (``--layer-attention coarse|fine``, Sec. 3.2) gives decoder layer m the source
memory S_m = sum_n W_mn (x) X_n over the encoder layers n = 0..N (0 = the word-embedding layer,
"Emb"). The weights do not depend on the input, so no sentence is needed: they are read from the
model's ``decoder.layer_attention.weights()`` in eval mode (DropConnect off).

The map has one row per decoder layer 1..M and one column per encoder layer Emb, 1..N, so each row
sums to 1 (a softmax over encoder layers). ``fine`` has one weight per (m, n, d); as in the paper
("each weight is the averaged attention weights over all dimensions") each cell shows the mean over
the D dimensions, which still sums to 1 over n because every dimension's weights do. ``coarse`` has
one scalar per (m, n). ``--layout paper`` draws the transpose, as printed in the paper: decoder
layers on the x-axis, encoder layers on the y-axis with Emb at the bottom.

``--mask-encoder-layer N`` shows the weights with encoder layer N masked (Sec. 3.3: its weight set to
zero and the others renormalised), i.e. what ``--model-overrides "{'mask_encoder_layer': N}"``
gives at generation time.

Besides the PNG, the matrix is printed as text (rows = decoder layers, columns = encoder layers) and
``--json OUT`` writes it as ``weights[m][n]`` (m = decoder layer - 1, n = encoder layer, 0 = Emb);
``--per-dim`` adds ``weights_per_dim[m][n][d]`` for ``fine``.

``--data`` is the binarised data directory (for the dictionaries the model is built with); without
it the directory stored in the checkpoint is used.

Exit status: 0 on success, 2 with a message naming the flag on bad input (no such file, no layer
attention in the checkpoint, encoder layer out of range).
"""

import argparse
import os
import sys
import textwrap
from typing import List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.append(REPO_ROOT)

# fusion_fairseq.tools.analysis imports the plugin (registers the models; --user-dir is optional)
from fusion_fairseq.tools.analysis import (  # noqa: E402
    add_dpi_argument,
    UsageError as ScriptError,
    add_force_argument,
    add_user_dir_argument,
    check_outputs,
    load_checkpoint_state,
    model_args,
    model_from_state,
    run_main,
    use_agg_backend,
    write_json,
)

use_agg_backend()

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

PROG = "plot_layer_attention.py"
KIND_NAMES = {
    "coarse": "coarse-grained layer attention (one weight per decoder/encoder layer pair)",
    "fine": "fine-grained layer attention",
}


def parse_args(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(
        description="Plot the decoder-layer x encoder-layer weights of layer attention (Liu et al. 2021, Figure 1).",
    )
    parser.add_argument("--path", required=True, help="checkpoint file (fairseq-train output)")
    parser.add_argument("--data", help="binarised data directory (for the dictionaries); "
                        "default: the directory stored in the checkpoint")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--json", metavar="OUT", help="also write the matrix and labels as JSON")
    parser.add_argument("--per-dim", action="store_true",
                        help="fine: also write the per-dimension weights W[m][n][d] to --json")
    parser.add_argument("--mask-encoder-layer", type=int, metavar="N",
                        help="show the weights with encoder layer N (0 = Emb) masked and the others renormalised")
    parser.add_argument("--layout", choices=("rows-decoder", "paper"), default="rows-decoder",
                        help="rows-decoder (default): rows = decoder layers, columns = Emb,1..N; "
                        "paper: the transpose, as in Figure 1 (x = decoder layer, y = encoder layer, "
                        "Emb at the bottom)")
    add_user_dir_argument(parser)
    add_dpi_argument(parser)
    add_force_argument(parser)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------
# loading


def layer_attention_of(model, args, path: str):
    """The decoder's LayerAttention, or a ScriptError saying what the checkpoint has."""
    attention = getattr(model.decoder, "layer_attention", None)
    if attention is not None:
        return attention
    kind = getattr(args, "layer_attention", None)
    if kind is None:
        raise ScriptError(
            f"--path {path}: the checkpoint's model ({type(model).__name__}, arch "
            f"{getattr(args, 'arch', '?')}) has no layer attention; a fusion_transformer checkpoint trained "
            "with --layer-attention coarse or fine is needed"
        )
    raise ScriptError(
        f"--path {path}: the checkpoint was trained with --layer-attention {kind}, so it has no layer-attention "
        "weights to plot; a checkpoint trained with --layer-attention coarse or fine is needed"
    )


def check_mask_index(layer: Optional[int], num_encoder_layers: int, flag: str = "--mask-encoder-layer"):
    """The model's own message (``check_fusion_args``), raised before anything is built."""
    if layer is not None and not 0 <= layer <= num_encoder_layers:
        raise ScriptError(
            f"{flag} {layer} does not exist: the encoder has layers 0 (embedding) to {num_encoder_layers}"
        )


# --------------------------------------------------------------------------------------------
# weights and output


def encoder_labels(num_inputs: int) -> List[str]:
    return ["Emb"] + [str(n) for n in range(1, num_inputs)]


def decoder_labels(num_decoder_layers: int) -> List[str]:
    return [str(m) for m in range(1, num_decoder_layers + 1)]


def per_dim_weights(attention) -> torch.Tensor:
    """``(M, N+1, D or 1)`` normalised weights, DropConnect off."""
    was_training = attention.training
    attention.eval()
    try:
        with torch.no_grad():
            return attention.weights().float().cpu()
    finally:
        attention.train(was_training)


def format_matrix(matrix, dec_labels: List[str], enc_labels: List[str], title: str) -> str:
    width = max(6, max(len(label) for label in enc_labels) + 1)
    lines = [title, "dec\\enc" + "".join(label.rjust(width) for label in enc_labels) + "   sum"]
    for label, row in zip(dec_labels, matrix):
        lines.append(label.rjust(7) + "".join(f"{float(v):.3f}".rjust(width) for v in row) + f"{float(sum(row)):6.3f}")
    return "\n".join(lines)


def short_value(value: float) -> str:
    """``.15`` as printed in the paper's Figure 1; ``1.0`` when it rounds to 1."""
    text = f"{value:.2f}"
    return text[1:] if text.startswith("0.") else text


def plot(matrix: np.ndarray, dec_labels: List[str], enc_labels: List[str], layout: str, title: str, out: str,
         dpi: int):
    if layout == "paper":  # x = decoder layer, y = encoder layer with Emb at the bottom
        image_data, x_labels, y_labels = matrix.T, dec_labels, enc_labels
        x_name, y_name, origin = "Decoder Layer", "Encoder Layer", "lower"
    else:  # rows = decoder layers 1..M top to bottom, columns = Emb, 1..N
        image_data, x_labels, y_labels = matrix, enc_labels, dec_labels
        x_name, y_name, origin = "Encoder Layer", "Decoder Layer", "upper"
    rows, cols = image_data.shape
    width = max(4.6, 0.62 * cols + 2.4)
    title = "\n".join(textwrap.fill(line, width=int(width * 13)) for line in title.splitlines())
    fig, ax = plt.subplots(figsize=(width, 0.5 * rows + 1.4 + 0.14 * title.count("\n")), layout="constrained")
    vmin, vmax = float(matrix.min()), float(matrix.max())
    if vmax - vmin < 1e-6:
        vmin, vmax = vmin - 0.01, vmax + 0.01
    cmap = plt.get_cmap("Blues")
    image = ax.imshow(image_data, cmap=cmap, vmin=vmin, vmax=vmax, origin=origin, aspect="auto",
                      interpolation="nearest")
    for i in range(rows):
        for j in range(cols):
            value = float(image_data[i, j])
            shade = (value - vmin) / (vmax - vmin)
            ax.text(j, i, short_value(value), ha="center", va="center", fontsize=8,
                    color="white" if shade > 0.6 else "black")
    ax.set_xticks(range(cols))
    ax.set_xticklabels(x_labels, fontsize=8)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(y_labels, fontsize=8)
    ax.set_xlabel(x_name, fontsize=9)
    ax.set_ylabel(y_name, fontsize=9)
    ax.set_title(title, fontsize=8)
    colorbar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
    colorbar.set_label("weight", fontsize=8)
    colorbar.ax.tick_params(labelsize=7)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def run(args) -> dict:
    check_outputs(args, [("--out", args.out), ("--json", args.json)], inputs=[("--path", args.path)])
    overrides = {"mask_encoder_layer": None}  # the stored weights, whatever the checkpoint was saved with
    state = load_checkpoint_state(args.path, args.data, overrides, args.user_dir)
    margs = model_args(state)
    if args.mask_encoder_layer is not None:
        if getattr(margs, "layer_attention", "none") in ("coarse", "fine"):
            check_mask_index(args.mask_encoder_layer, margs.encoder_layers)
    model, _, _ = model_from_state(args.path, state)
    attention = layer_attention_of(model, margs, args.path)
    if args.mask_encoder_layer is not None:
        check_mask_index(args.mask_encoder_layer, attention.num_inputs - 1)
        attention.mask_layer(args.mask_encoder_layer)
    weights = per_dim_weights(attention)  # (M, N+1, D or 1)
    matrix = weights.mean(dim=-1)  # fine: mean over dimensions; coarse: the scalar itself
    num_decoder_layers, num_inputs, dims = weights.shape
    dec_labels, enc_labels = decoder_labels(num_decoder_layers), encoder_labels(num_inputs)

    kind = attention.kind
    if kind == "fine":
        what = f"fine-grained layer attention, mean over the {dims} dimensions of w[m,n,d]"
    else:
        what = "coarse-grained layer attention w[m,n]"
    masked = "" if args.mask_encoder_layer is None else \
        f"encoder layer {enc_labels[args.mask_encoder_layer]} masked (others renormalised)"
    title = what if not masked else f"{what}; {masked}"
    print(format_matrix(matrix.tolist(), dec_labels, enc_labels,
                        f"{title}: {args.path}\nrows = decoder layers 1..{num_decoder_layers}, columns = encoder "
                        f"layers (Emb = word-embedding layer 0); each row sums to 1 over encoder layers"))
    plot(matrix.numpy(), dec_labels, enc_labels, args.layout,
         "\n".join(filter(None, [what, masked, os.path.basename(args.path)])), args.out, args.dpi)
    print(f"wrote {args.out}")

    result = {
        "checkpoint": args.path,
        "kind": kind,
        "dims": dims,
        "cell_value": "mean over dimensions of w[m,n,d]" if kind == "fine" else "w[m,n]",
        "masked_layer": args.mask_encoder_layer,
        "decoder_labels": dec_labels,
        "encoder_labels": enc_labels,
        "weights": matrix.tolist(),
    }
    if kind == "fine":
        result["min_over_dims"] = weights.min(dim=-1).values.tolist()
        result["max_over_dims"] = weights.max(dim=-1).values.tolist()
        if args.per_dim:
            result["weights_per_dim"] = weights.tolist()
    if args.json:
        write_json(args.json, result)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(run, parse_args(argv), PROG)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The learned layer-attention weights W of a checkpoint, as in Liu et al. (ICLR 2021) Figure 1
(see examples/surface_fusion/README.md).

Sec. 3.2: S_m = sum_n W_mn (x) X_n, decoder layer m's source memory over the encoder layers
n = 0..N (0 = the word embeddings, "Emb"). The weights do not depend on the input: they are
``decoder.layer_attention.weights()`` in eval mode (DropConnect off). ``fine`` has one weight per
(m, n, d); as in the paper each cell is the mean over the D dimensions (still summing to 1 over n).
"""

import os
import sys
import textwrap

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_lab.analysis import checkpoint_setting, format_matrix, heatmap, load_model, pyplot, \
    script_main, script_parser, write_outputs  # noqa: E402

PARSER = script_parser(__doc__)
PARSER.add_argument("--per-dim", action="store_true",
                    help="fine: also write the per-dimension weights W[m][n][d] to --json")
PARSER.add_argument("--mask-encoder-layer", type=int, metavar="N",
                    help="show the weights with encoder layer N (0 = Emb) masked and the others renormalised")
PARSER.add_argument("--layout", choices=("rows-decoder", "paper"), default="rows-decoder",
                    help="rows-decoder: rows = decoder layers, columns = Emb,1..N; paper: the transpose, as in "
                    "Figure 1 (Emb at the bottom)")


def plot(matrix, dec_labels, enc_labels, layout: str, title: str):
    paper = layout == "paper"  # x = decoder layer, y = encoder layer with Emb at the bottom
    data, x_labels, y_labels = (matrix.T, dec_labels, enc_labels) if paper else (matrix, enc_labels, dec_labels)
    x_name, y_name, origin = ("Decoder", "Encoder", "lower") if paper else ("Encoder", "Decoder", "upper")
    rows, cols = data.shape
    width = max(4.6, 0.62 * cols + 2.4)
    title = "\n".join(textwrap.fill(line, width=int(width * 13)) for line in title.splitlines())
    fig, ax = pyplot().subplots(figsize=(width, 0.5 * rows + 1.4 + 0.14 * title.count("\n")), layout="constrained")
    heatmap(ax, data, x_labels, y_labels, vmin=float(matrix.min()), vmax=float(matrix.max()), origin=origin,
            colorbar="weight", annotate=lambda value: f"{value:.2f}".removeprefix("0"),  # ".15" as in Figure 1
            xlabel=f"{x_name} Layer", ylabel=f"{y_name} Layer", title=title)
    return fig


def run(args) -> dict:
    masked = args.mask_encoder_layer  # None: the stored weights, whatever the checkpoint was saved with
    model, cfg, _ = load_model(args.path, args.data, args.user_dir, {"mask_encoder_layer": masked})
    checkpoint_setting(cfg.model, "layer-attention", ("coarse", "fine"), f"--path {args.path}",
                       "there are no layer-attention weights to plot")
    attention = model.decoder.layer_attention
    weights = attention.weights().detach().float()  # (M, N+1, D or 1); load_model set eval mode: no DropConnect
    matrix = weights.mean(dim=-1)  # fine: mean over dimensions; coarse: the scalar itself
    num_decoder_layers, num_inputs, dims = weights.shape
    dec_labels = [str(m) for m in range(1, num_decoder_layers + 1)]
    enc_labels = ["Emb"] + [str(n) for n in range(1, num_inputs)]
    fine = attention.kind == "fine"
    what = (f"fine-grained layer attention, mean over the {dims} dimensions of w[m,n,d]" if fine
            else "coarse-grained layer attention w[m,n]")
    masking = "" if masked is None else f"encoder layer {enc_labels[masked]} masked (others renormalised)"
    print(format_matrix(f"{'; '.join(filter(None, [what, masking]))}: {args.path}\nrows = decoder layers "
                        f"1..{num_decoder_layers}, columns = encoder layers (Emb = word-embedding layer 0); each row "
                        "sums to 1 over encoder layers", torch.cat([matrix, matrix.sum(dim=1, keepdim=True)], dim=1),
                        dec_labels, enc_labels + ["sum"], corner="dec\\enc"))
    result = {"checkpoint": args.path, "kind": attention.kind, "dims": dims,
              "cell_value": "mean over dimensions of w[m,n,d]" if fine else "w[m,n]", "masked_layer": masked,
              "decoder_labels": dec_labels, "encoder_labels": enc_labels, "weights": matrix.tolist()}
    if fine and args.per_dim:
        result["weights_per_dim"] = weights.tolist()
    figure = plot(matrix.numpy(), dec_labels, enc_labels, args.layout,
                  "\n".join(filter(None, [what, masking, os.path.basename(args.path)])))
    return write_outputs(args, result, figure)


main = script_main(PARSER.parse_args, run, "plot_layer_attention.py", __name__)

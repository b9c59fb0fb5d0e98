#!/usr/bin/env python
"""Embedding analyses of Liu et al. (ICLR 2021): singular-value spectra (Figures 3 and 4) and the
cosine similarity of aligned source/target word embeddings (Table 3).

spectrum (Figures 3-4):

    python scripts/embedding_analysis.py spectrum --path A [--path B ...] [--label LA --label LB] \\
        [--data DATA_BIN] [--which encoder,decoder,output] [--split-by-attention] [--x-axis index|fraction] \\
        [--threshold 0.1] --out fig.png [--json out.json]

  For each embedding matrix E (|V| x d; rows = words): the singular values s_1 >= ... >= s_k of E
  (k = min(|V|, d)), divided by the largest, s_i / s_1, so the curve starts at 1 and decreases.
  As in the paper ("the singular values are normalized by dividing them by the largest value and
  their log scale values are reported"), the y-axis is logarithmic and the x-axis is the index of
  the singular value, 1..k (``--x-axis fraction`` scales it to (0, 1] to compare matrices of
  different widths). A slowly decaying curve (more uniform singular values) is a more expressive
  embedding. Matrices: ``encoder`` (source word embeddings), ``decoder`` (target input
  embeddings), ``output`` (the decoder's output projection). Matrices that are one tensor in the
  model (``--share-all-embeddings``, ``--share-decoder-input-output-embed``) are analysed once and
  labelled e.g. ``encoder=decoder=output``. The SVD is of the raw matrix (no centring), every row
  included (special symbols and fairseq's padding words too; the <pad> row is zero and changes no
  singular value).

  ``--split-by-attention`` (Figure 3; needs ``--layer-attention fine``): the dimensions of the
  encoder embedding layer are ordered by the top decoder layer's attention to it, w_{M,0,d}
  (``--attention-decoder-layer`` to pick another m), and split into two equal halves, the more and
  the less attended dimensions; a random half (``--seed``) is the reference. The three
  |V| x d/2 sub-matrices are analysed like the others.

  Summary printed per curve (and in ``--json``):
    * ``auc``: the area under the normalised curve with the index scaled to [0, 1], i.e. the mean
      of s_i / s_1 over i = 1..k (1 for a flat spectrum, 1/k when one direction has everything);
    * ``index_below``: the first index i (1-based) with s_i / s_1 < ``--threshold`` (default 0.1),
      ``null`` if none is; ``fraction_below`` = that index / k.
    * ``min``: s_k / s_1.

cosine (Table 3):

    python scripts/embedding_analysis.py cosine --path CKPT [--path B ...] [--label ...] [--data DATA_BIN] \\
        --dict bilingual.txt [--target-embedding input|output] [--json out.json]

  ``--dict``: one ``source_word target_word`` pair per line (whitespace-separated; blank lines and
  lines starting with ``#`` are skipped; repeated pairs count once). For each pair the cosine
  similarity of the source word's row of the encoder embeddings and the target word's row of the
  decoder input embeddings (``--target-embedding output``: the output projection) is computed;
  pairs with a word missing from its dictionary (it maps to <unk>) are skipped and counted. Printed:
  the mean over all pairs used ("All") and over the pairs whose two words differ ("Non-Shared"), as
  in Table 3, and how many pairs were used. Works with separate dictionaries and with a joined
  dictionary and shared embeddings (then both rows come from the one matrix).

``--data`` is the binarised data directory (for the dictionaries the model is built with); without
it the directory stored in each checkpoint is used. Exit status: 0 on success, 2 with a message
naming the flag on bad input.
"""

import argparse
import math
import os
import sys
from typing import Dict, List, Optional, Tuple

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
    model_from_state,
    run_main,
    use_agg_backend,
    write_json,
)

use_agg_backend()

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PROG = "embedding_analysis.py"
MATRICES = ("encoder", "decoder", "output")


def parse_args(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(
        description="Singular-value spectra (Liu et al. 2021, Figures 3-4) and aligned-word cosine similarity "
        "(Table 3) of a checkpoint's embeddings.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub):
        sub.add_argument("--path", action="append", required=True,
                         help="checkpoint file; repeat to compare several checkpoints")
        sub.add_argument("--label", action="append", help="name of each --path in the output (same order)")
        sub.add_argument("--data", help="binarised data directory (for the dictionaries); "
                         "default: the directory stored in each checkpoint")
        sub.add_argument("--json", metavar="OUT", help="also write the results as JSON")
        add_user_dir_argument(sub)
        add_force_argument(sub)

    spectrum = commands.add_parser("spectrum", help="normalised singular values of embedding matrices (Figs. 3-4)")
    common(spectrum)
    spectrum.add_argument("--which", help="comma-separated matrices among encoder, decoder, output "
                          "(default: all three; none with --split-by-attention)")
    spectrum.add_argument("--split-by-attention", action="store_true",
                          help="Figure 3: more / less attended halves of the encoder embedding dimensions by "
                          "w[M,0,d] of fine-grained layer attention, and a random half")
    spectrum.add_argument("--attention-decoder-layer", type=int, metavar="M",
                          help="decoder layer (1-based) whose weights order the dimensions (default: the top one)")
    spectrum.add_argument("--seed", type=int, default=1, help="seed of the random half (default: 1)")
    spectrum.add_argument("--x-axis", choices=("index", "fraction"), default="index",
                          help="index: 1..k as in the paper (default); fraction: index / k")
    spectrum.add_argument("--threshold", type=float, default=0.1,
                          help="report the first index where s_i / s_1 falls below this (default: 0.1)")
    spectrum.add_argument("--out", required=True, help="PNG file to write")
    add_dpi_argument(spectrum)

    cosine = commands.add_parser("cosine", help="mean cosine similarity of aligned word embeddings (Table 3)")
    common(cosine)
    cosine.add_argument("--dict", required=True, help="bilingual dictionary: 'source_word target_word' per line")
    cosine.add_argument("--target-embedding", choices=("input", "output"), default="input",
                        help="target rows from the decoder input embeddings (default) or the output projection")

    args = parser.parse_args(argv)
    if args.label is not None and len(args.label) != len(args.path):
        parser.error(f"--label was given {len(args.label)} times for {len(args.path)} --path; give one per --path")
    if args.command == "spectrum" and not 0.0 < args.threshold < 1.0:
        parser.error(f"--threshold must be in (0, 1), got {args.threshold}")
    return args


# --------------------------------------------------------------------------------------------
# loading


def load_model(path: str, data: Optional[str], user_dir: Optional[str] = None):
    """``(model, cfg, task)``; without ``data`` the directory stored in the checkpoint is used."""
    state = load_checkpoint_state(path, data, user_dir=user_dir, checkpoint_name=path)
    return model_from_state(path, state)


def labels_for(args) -> List[str]:
    if args.label:
        return list(args.label)
    names = [os.path.basename(path) for path in args.path]
    if len(set(names)) < len(names):  # checkpoint_best.pt of two runs: add the directory
        names = [os.path.join(os.path.basename(os.path.dirname(os.path.abspath(p))), n)
                 for p, n in zip(args.path, names)]
    return names


def embedding_matrices(model) -> Dict[str, torch.Tensor]:
    """encoder / decoder / output weight tensors of a fairseq encoder-decoder model (those it has)."""
    matrices = {}
    encoder_embed = getattr(getattr(model, "encoder", None), "embed_tokens", None)
    decoder = getattr(model, "decoder", None)
    decoder_embed = getattr(decoder, "embed_tokens", None)
    output = getattr(decoder, "output_projection", None)
    if encoder_embed is not None:
        matrices["encoder"] = encoder_embed.weight
    if decoder_embed is not None:
        matrices["decoder"] = decoder_embed.weight
    if output is not None and getattr(output, "weight", None) is not None:
        matrices["output"] = output.weight
    return matrices


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.data_ptr() == b.data_ptr())


def group_tied(names: List[str], matrices: Dict[str, torch.Tensor]) -> List[Tuple[str, torch.Tensor]]:
    """[(name, tensor)] with tensors that are one parameter merged, e.g. ('encoder=decoder', E)."""
    groups: List[Tuple[List[str], torch.Tensor]] = []
    for name in names:
        for group in groups:
            if same_tensor(group[1], matrices[name]):
                group[0].append(name)
                break
        else:
            groups.append(([name], matrices[name]))
    return [("=".join(group_names), tensor) for group_names, tensor in groups]


# --------------------------------------------------------------------------------------------
# spectrum


def normalised_singular_values(matrix: torch.Tensor) -> torch.Tensor:
    """s_i / s_1, sorted from largest to smallest (float64)."""
    values = torch.linalg.svdvals(matrix.detach().double().cpu())
    values, _ = torch.sort(values, descending=True)
    if values.numel() == 0 or values[0] <= 0:
        raise ScriptError("the matrix is zero: its singular values cannot be normalised")
    return values / values[0]


def spectrum_summary(values: torch.Tensor, threshold: float) -> Dict:
    below = (values < threshold).nonzero()
    index = int(below[0]) + 1 if below.numel() else None
    k = values.numel()
    return {
        "k": k,
        "auc": float(values.mean()),
        "index_below": index,
        "fraction_below": None if index is None else index / k,
        "min": float(values[-1]),
    }


def attention_split(model, path: str, decoder_layer: Optional[int], seed: int):
    """(more, less, random) dimension indices of the encoder embedding, by w[m, 0, d]."""
    attention = getattr(model.decoder, "layer_attention", None)
    if attention is None or attention.kind != "fine":
        having = "no layer attention" if attention is None else f"--layer-attention {attention.kind}"
        raise ScriptError(
            f"--split-by-attention: {path} has {having}; the dimensions are ordered by the per-dimension weights "
            "of a checkpoint trained with --layer-attention fine"
        )
    attention.eval()
    with torch.no_grad():
        weights = attention.weights().float()  # (M, N+1, D)
    num_decoder_layers = weights.size(0)
    m = num_decoder_layers if decoder_layer is None else decoder_layer
    if not 1 <= m <= num_decoder_layers:
        raise ScriptError(
            f"--attention-decoder-layer {m} does not exist: the decoder has layers 1 to {num_decoder_layers}"
        )
    order = torch.argsort(weights[m - 1, 0], descending=True, stable=True)
    half = order.numel() // 2
    generator = torch.Generator().manual_seed(seed)
    random = torch.randperm(order.numel(), generator=generator)[:half]
    return m, order[:half], order[-half:], torch.sort(random).values


def run_spectrum(args) -> Dict:
    which = args.which
    if which is None:
        names = [] if args.split_by_attention else list(MATRICES)
    else:
        names = [name.strip() for name in which.split(",") if name.strip()]
        for name in names:
            if name not in MATRICES:
                raise ScriptError(f"--which {which}: unknown matrix {name!r}; choose from {', '.join(MATRICES)}")
    if not names and not args.split_by_attention:
        raise ScriptError(f"--which {which!r}: no matrix to analyse")

    curves = []
    for path, label in zip(args.path, labels_for(args)):
        model, _, _ = load_model(path, args.data, args.user_dir)
        matrices = embedding_matrices(model)
        for name in names:
            if name not in matrices:
                raise ScriptError(f"--which {name}: {path} ({type(model).__name__}) has no {name} embedding matrix")
        entries = [(name, tensor, None) for name, tensor in group_tied(names, matrices)]
        if args.split_by_attention:
            m, more, less, random = attention_split(model, path, args.attention_decoder_layer, args.seed)
            encoder = matrices["encoder"]
            for name, dims in ((f"more attended (w[{m},Emb,d])", more), (f"less attended (w[{m},Emb,d])", less),
                               ("random dims", random)):
                entries.append((name, encoder[:, dims], dims.tolist()))
        for name, tensor, dims in entries:
            values = normalised_singular_values(tensor)
            curve = {"checkpoint": path, "label": label, "matrix": name, "shape": list(tensor.shape),
                     "normalized": values.tolist(), **spectrum_summary(values, args.threshold)}
            if dims is not None:
                curve["dims"] = dims
            curves.append(curve)

    print(f"normalised singular values s_i/s_1 of the embedding matrices (rows = words); auc = mean of s_i/s_1 "
          f"(area under the curve, index scaled to [0,1]); below{args.threshold:g} = first index i with "
          f"s_i/s_1 < {args.threshold:g}")
    label_width = max([len("checkpoint")] + [len(c["label"]) for c in curves])
    matrix_width = max(len(c["matrix"]) for c in curves)
    print(f"{'checkpoint':<{label_width}}  {'matrix':<{matrix_width}}  {'shape':>11}  {'auc':>6}  "
          f"{'below' + format(args.threshold, 'g'):>9}  {'min':>8}")
    for c in curves:
        below = "none" if c["index_below"] is None else f"{c['index_below']}/{c['k']}"
        shape = "x".join(map(str, c["shape"]))
        print(f"{c['label']:<{label_width}}  {c['matrix']:<{matrix_width}}  {shape:>11}  {c['auc']:6.3f}  "
              f"{below:>9}  {c['min']:8.2e}")

    plot_spectrum(curves, args)
    print(f"wrote {args.out}")
    result = {"threshold": args.threshold, "x_axis": args.x_axis, "curves": curves}
    if args.json:
        write_json(args.json, result)
    return result


def plot_spectrum(curves: List[Dict], args):
    fig, ax = plt.subplots(figsize=(5.6, 3.8), layout="constrained")
    several = len({c["checkpoint"] for c in curves}) > 1
    styles = ["-", "--", ":", "-."]
    checkpoints = list(dict.fromkeys(c["checkpoint"] for c in curves))
    for c in curves:
        k = c["k"]
        xs = [(i + 1) / k for i in range(k)] if args.x_axis == "fraction" else list(range(1, k + 1))
        label = f"{c['label']}: {c['matrix']}" if several else c["matrix"]
        ax.plot(xs, c["normalized"], styles[checkpoints.index(c["checkpoint"]) % len(styles)], label=label,
                linewidth=1.4)
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    low = min(min(c["normalized"]) for c in curves)
    if low > 0.02:  # a decade or so: label some minor ticks too
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda value, _: f"{value:g}" if round(value / 10 ** math.floor(math.log10(value) + 1e-9)) in (2, 5) else ""))
    ax.set_xlabel("Index of Singular Value" + (" / k" if args.x_axis == "fraction" else ""), fontsize=9)
    ax.set_ylabel("normalised singular value s_i / s_1 (log scale)", fontsize=8)
    title = "Singular values of the embeddings"
    if not several:
        title += f": {curves[0]['label']}"
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="major", linewidth=0.3)
    ax.tick_params(which="both", labelsize=7)
    ax.legend(fontsize=7)
    fig.savefig(args.out, dpi=args.dpi)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# cosine


def read_bilingual_dict(path: str) -> Tuple[List[Tuple[str, str]], int]:
    """Distinct (source, target) pairs in file order, and the number of pair lines read."""
    if not os.path.isfile(path):
        raise ScriptError(f"--dict {path}: no such file")
    pairs, seen, lines = [], set(), 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 2:
                raise ScriptError(
                    f"--dict {path}, line {number}: expected 'source_word target_word', got {line.strip()!r}"
                )
            lines += 1
            pair = (fields[0], fields[1])
            if pair not in seen:
                seen.add(pair)
                pairs.append(pair)
    if not pairs:
        raise ScriptError(f"--dict {path}: no word pairs")
    return pairs, lines


def aligned_cosine(model, task, pairs: List[Tuple[str, str]], target_embedding: str, dict_path: str) -> Dict:
    matrices = embedding_matrices(model)
    target_name = "decoder" if target_embedding == "input" else "output"
    if "encoder" not in matrices or target_name not in matrices:
        missing = "encoder" if "encoder" not in matrices else target_name
        raise ScriptError(f"--path: the model ({type(model).__name__}) has no {missing} embedding matrix")
    source, target = matrices["encoder"], matrices[target_name]
    if source.size(1) != target.size(1):
        raise ScriptError(f"--target-embedding {target_embedding}: source ({source.size(1)}) and target "
                          f"({target.size(1)}) embeddings have different widths")
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    used, src_oov, tgt_oov = [], [], []
    for src_word, tgt_word in pairs:
        src_index, tgt_index = src_dict.index(src_word), tgt_dict.index(tgt_word)
        missing = False
        if src_index == src_dict.unk():
            src_oov.append(src_word)
            missing = True
        if tgt_index == tgt_dict.unk():
            tgt_oov.append(tgt_word)
            missing = True
        if not missing:
            used.append((src_word, tgt_word, src_index, tgt_index))
    if not used:
        raise ScriptError(
            f"--dict {dict_path}: none of its {len(pairs)} pairs has both words in the dictionaries "
            f"(source: {len(src_dict)} types, target: {len(tgt_dict)} types)"
        )
    with torch.no_grad():
        src_rows = source.detach().float()[torch.tensor([u[2] for u in used])]
        tgt_rows = target.detach().float()[torch.tensor([u[3] for u in used])]
        cosines = F.cosine_similarity(src_rows, tgt_rows, dim=-1)
    non_shared = [i for i, u in enumerate(used) if u[0] != u[1]]
    return {
        "shared_embeddings": same_tensor(source, target),
        "joined_dictionary": src_dict is tgt_dict or src_dict.symbols == tgt_dict.symbols,
        "target_embedding": target_embedding,
        "pairs": len(pairs),
        "used": len(used),
        "skipped": len(pairs) - len(used),
        "source_oov": len(src_oov),
        "target_oov": len(tgt_oov),
        "oov_examples": (src_oov + tgt_oov)[:10],
        "all": float(cosines.mean()),
        "non_shared": float(cosines[non_shared].mean()) if non_shared else None,
        "non_shared_used": len(non_shared),
        "per_pair": [{"source": u[0], "target": u[1], "cosine": float(c)} for u, c in zip(used, cosines)],
    }


def run_cosine(args) -> Dict:
    pairs, lines = read_bilingual_dict(args.dict)
    rows = []
    for path, label in zip(args.path, labels_for(args)):
        model, _, task = load_model(path, args.data, args.user_dir)
        row = aligned_cosine(model, task, pairs, args.target_embedding, args.dict)
        rows.append({"checkpoint": path, "label": label, **row})

    target_rows = "decoder input embeddings" if args.target_embedding == "input" else "output projection"
    print(f"cosine similarity of aligned source/target word embeddings (source: encoder embeddings, target: "
          f"{target_rows}); --dict {args.dict}: {lines} pair lines, {len(pairs)} distinct pairs")
    print("All = mean over the pairs used; Non-Shared = mean over the pairs whose two words differ")
    width = max(10, max(len(r["label"]) for r in rows))
    print(f"{'checkpoint':<{width}}  {'All':>6}  {'Non-Shared':>10}  {'used':>6}  {'non-shared':>10}  "
          f"{'OOV skipped':>11}  embeddings")
    for r in rows:
        non_shared = "n/a" if r["non_shared"] is None else f"{r['non_shared']:.3f}"
        kind = "shared" if r["shared_embeddings"] else "separate"
        print(f"{r['label']:<{width}}  {r['all']:6.3f}  {non_shared:>10}  {r['used']:>6}  {r['non_shared_used']:>10}  "
              f"{r['skipped']:>11}  {kind}")
        if r["skipped"]:
            print(f"  {r['label']}: skipped {r['skipped']} of {r['pairs']} pairs with an out-of-vocabulary word "
                  f"({r['source_oov']} source, {r['target_oov']} target words), "
                  f"e.g. {', '.join(r['oov_examples'][:5])}")
    result = {"dict": args.dict, "pair_lines": lines, "pairs": len(pairs), "rows": rows}
    if args.json:
        write_json(args.json, result)
    return result


def run(args) -> Dict:
    inputs = [("--path", path) for path in args.path] + [("--dict", getattr(args, "dict", None))]
    check_outputs(args, [("--out", getattr(args, "out", None)), ("--json", args.json)], inputs)
    return run_spectrum(args) if args.command == "spectrum" else run_cosine(args)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return run_main(run, args, f"{PROG} {args.command}")


if __name__ == "__main__":
    sys.exit(main())

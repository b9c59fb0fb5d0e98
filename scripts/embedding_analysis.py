"""Embedding analyses of Liu et al. (ICLR 2021): singular-value spectra (Figures 3 and 4) and the cosine similarity
of aligned source/target word embeddings (Table 3); see examples/surface_fusion/README.md.

spectrum: for each embedding matrix E (|V| x d, rows = words, every row included, no centring) the singular values
s_i / s_1 on a log scale as in the paper; a slowly decaying curve is a more expressive embedding. Tied matrices are
analysed once (``encoder=decoder=output``). ``--split-by-attention`` (Figure 3): the encoder embedding's dimensions
ordered by the top decoder layer's weight w_{M,0,d} and split into the more and the less attended half, beside a
random half.

cosine (Table 3): for each ``--dict`` pair, the cosine of the source word's encoder embedding and the target word's
decoder embedding; "All" is the mean over the pairs used, "Non-Shared" over the pairs whose two words differ.
"""

import argparse
import math
import os
import sys

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_lab.analysis import UsageError, checkpoint_arguments, checkpoint_setting, format_matrix, \
    load_model, pyplot, script_main, write_outputs  # noqa: E402

MATRICES = ("encoder", "decoder", "output")
THRESHOLD = 0.1  # index_below: the first i with s_i / s_1 below it


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    spectrum = checkpoint_arguments(commands.add_parser("spectrum", help="normalised singular values (Figs. 3-4)"),
                                    paths=2)
    cosine = checkpoint_arguments(commands.add_parser("cosine", help="cosine of aligned word embeddings (Table 3)"),
                                  paths=2, out_required=None)
    for sub in (spectrum, cosine):
        sub.add_argument("--label", action="append", help="name of each --path in the output (same order)")
    spectrum.add_argument("--which", help="comma-separated matrices among encoder, decoder, output "
                          "(default: all three; none with --split-by-attention)")
    spectrum.add_argument("--split-by-attention", action="store_true",
                          help="Figure 3: more / less attended halves of the encoder embedding dimensions by "
                          "w[M,0,d] of fine-grained layer attention, and a random half")
    spectrum.add_argument("--x-axis", choices=("index", "fraction"), default="index",
                          help="index: 1..k as in the paper (default); fraction: index / k")
    cosine.add_argument("--dict", required=True, help="bilingual dictionary: 'source_word target_word' per line")
    cosine.add_argument("--target-embedding", choices=("input", "output"), default="input",
                        help="target rows from the decoder input embeddings (default) or the output projection")
    return parser.parse_args(argv)


def checkpoints(args):
    """``(path, label, model, cfg, task)`` of each ``--path`` in turn; the label is ``--label``, else the file
    name, with its directory where two are alike (checkpoint_best.pt of two runs)."""
    if args.label is not None and len(args.label) != len(args.path):
        raise UsageError(f"--label was given {len(args.label)} times for {len(args.path)} --path; give one per --path")
    labels = args.label or [os.path.basename(path) for path in args.path]
    if len(set(labels)) < len(labels) and not args.label:
        labels = [os.path.join(os.path.basename(os.path.dirname(os.path.abspath(p))), n)
                  for p, n in zip(args.path, labels)]
    for path, label in zip(args.path, labels):
        yield (path, label, *load_model(path, args.data, args.user_dir))


def embedding_matrices(model, path: str, needed) -> dict[str, torch.Tensor]:
    """The encoder / decoder / output weight tensors of a fairseq encoder-decoder model; an error
    when one of ``needed`` is missing."""
    decoder = getattr(model, "decoder", None)
    modules = {"encoder": getattr(getattr(model, "encoder", None), "embed_tokens", None),
               "decoder": getattr(decoder, "embed_tokens", None), "output": getattr(decoder, "output_projection", None)}
    matrices = {name: module.weight for name, module in modules.items() if getattr(module, "weight", None) is not None}
    for name in needed:
        if name not in matrices:
            raise UsageError(f"--path {path}: the model ({type(model).__name__}) has no {name} embedding matrix")
    return matrices


def spectrum_curve(matrix: torch.Tensor) -> dict:
    """s_i / s_1 from largest to smallest (float64) and its summary: ``auc``, their mean (1 for a
    flat spectrum); ``index_below``, the first i with s_i / s_1 < THRESHOLD; ``min``, s_k / s_1."""
    values = torch.linalg.svdvals(matrix.detach().double().cpu())  # in descending order
    if values.numel() == 0 or values[0] <= 0:
        raise UsageError("the matrix is zero: its singular values cannot be normalised")
    values = values / values[0]
    below = (values < THRESHOLD).nonzero()
    index = int(below[0]) + 1 if below.numel() else None
    return {"shape": list(matrix.shape), "normalized": values.tolist(), "k": values.numel(),
            "auc": float(values.mean()), "index_below": index,
            "fraction_below": None if index is None else index / values.numel(), "min": float(values[-1])}


def attention_split(model, cfg, path: str):
    """``[(name, dimensions)]`` of the more and the less attended half of the encoder embedding's dimensions,
    by w[M, 0, d] of the top decoder layer M, and of a random half, the same on every run."""
    checkpoint_setting(cfg.model, "layer-attention", ("fine",), f"--split-by-attention: --path {path}",
                       "there are no per-dimension weights to order the dimensions by")
    weights = model.decoder.layer_attention.weights().detach().float()  # (M, N+1, D); eval mode: no DropConnect
    order = torch.argsort(weights[-1, 0], descending=True, stable=True)
    half = order.numel() // 2
    random = torch.randperm(order.numel(), generator=torch.Generator().manual_seed(1))[:half]
    m = weights.size(0)
    return [(f"more attended (w[{m},Emb,d])", order[:half]), (f"less attended (w[{m},Emb,d])", order[-half:]),
            ("random dims", torch.sort(random).values)]


def run_spectrum(args) -> dict:
    which = args.which if args.which is not None else "" if args.split_by_attention else ",".join(MATRICES)
    names = [name.strip() for name in which.split(",") if name.strip()]
    for name in names:
        if name not in MATRICES:
            raise UsageError(f"--which {which}: unknown matrix {name!r}; choose from {', '.join(MATRICES)}")
    if not names and not args.split_by_attention:
        raise UsageError(f"--which {which!r}: no matrix to analyse")

    curves = []
    for path, label, model, cfg, _ in checkpoints(args):
        matrices = embedding_matrices(model, path, names + ["encoder"] * args.split_by_attention)
        tied = {}  # the matrices that are one parameter (one memory) are analysed once, e.g. as 'encoder=decoder'
        for name in names:
            tied.setdefault(matrices[name].data_ptr(), []).append(name)
        entries = [("=".join(group), matrices[group[0]], {}) for group in tied.values()]
        if args.split_by_attention:
            entries += [(name, matrices["encoder"][:, dims], {"dims": dims.tolist()})
                        for name, dims in attention_split(model, cfg, path)]
        curves += [{"checkpoint": path, "label": label, "matrix": name, **spectrum_curve(tensor), **dims}
                   for name, tensor, dims in entries]

    title = (f"normalised singular values s_i/s_1 of the embedding matrices (rows = words); auc = mean of s_i/s_1 "
             f"(area under the curve, index scaled to [0,1]); below{THRESHOLD:g} = first index i with "
             f"s_i/s_1 < {THRESHOLD:g}")
    print(format_matrix(title, [[c["matrix"], "x".join(map(str, c["shape"])), f"{c['auc']:.3f}", "none" if
                                 c["index_below"] is None else f"{c['index_below']}/{c['k']}", f"{c['min']:.2e}"]
                                for c in curves], [c["label"] for c in curves],
                        ["matrix", "shape", "auc", f"below{THRESHOLD:g}", "min"], cell=str, corner="checkpoint"))
    return write_outputs(args, {"threshold": THRESHOLD, "x_axis": args.x_axis, "curves": curves},
                         plot_spectrum(curves, args.x_axis))


def plot_spectrum(curves: list[dict], x_axis: str):
    fig, ax = pyplot().subplots(figsize=(5.6, 3.8), layout="constrained")
    checkpoints = list(dict.fromkeys(c["checkpoint"] for c in curves))
    several = len(checkpoints) > 1
    styles = ["-", "--", ":", "-."]
    for c in curves:
        xs = [i / (c["k"] if x_axis == "fraction" else 1) for i in range(1, c["k"] + 1)]
        ax.plot(xs, c["normalized"], styles[checkpoints.index(c["checkpoint"]) % len(styles)], linewidth=1.4,
                label=f"{c['label']}: {c['matrix']}" if several else c["matrix"])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter("{x:g}")
    if min(min(c["normalized"]) for c in curves) > 0.02:  # a decade or so: label the minor ticks 2 and 5 too
        ax.yaxis.set_minor_formatter(lambda value, _: f"{value:g}" if round(
            value / 10 ** math.floor(math.log10(value) + 1e-9)) in (2, 5) else "")
    ax.set_xlabel("Index of Singular Value" + (" / k" if x_axis == "fraction" else ""), fontsize=9)
    ax.set_ylabel("normalised singular value s_i / s_1 (log scale)", fontsize=8)
    ax.set_title("Singular values of the embeddings" + ("" if several else f": {curves[0]['label']}"), fontsize=9)
    ax.grid(True, which="major", linewidth=0.3)
    ax.tick_params(which="both", labelsize=7)
    ax.legend(fontsize=7)
    return fig


def read_bilingual_dict(path: str) -> tuple[list[tuple[str, str]], int]:
    """Distinct (source, target) pairs in file order, and the number of pair lines read."""
    if not os.path.isfile(path):
        raise UsageError(f"--dict {path}: no such file")
    pairs, lines = {}, 0  # a dict keeps the first occurrence's order
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 2:
                raise UsageError(f"--dict {path}, line {number}: expected 'source_word target_word', got "
                                 f"{line.strip()!r}")
            lines += 1
            pairs[tuple(fields)] = None
    pairs = list(pairs)
    if not pairs:
        raise UsageError(f"--dict {path}: no word pairs")
    return pairs, lines


def aligned_cosine(model, path: str, task, pairs: list[tuple[str, str]], args) -> dict:
    target_name = "decoder" if args.target_embedding == "input" else "output"
    matrices = embedding_matrices(model, path, ["encoder", target_name])
    source, target = matrices["encoder"], matrices[target_name]
    if source.size(1) != target.size(1):
        raise UsageError(f"--target-embedding {args.target_embedding}: source ({source.size(1)}) and target "
                         f"({target.size(1)}) embeddings have different widths")
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_oov = [s for s, _ in pairs if s not in src_dict]
    tgt_oov = [t for _, t in pairs if t not in tgt_dict]
    used = [(s, t) for s, t in pairs if s in src_dict and t in tgt_dict]
    if not used:
        raise UsageError(f"--dict {args.dict}: none of its {len(pairs)} pairs has both words in the dictionaries "
                         f"(source: {len(src_dict)} types, target: {len(tgt_dict)} types)")
    cosines = torch.cosine_similarity(source.detach().float()[[src_dict.index(s) for s, _ in used]],
                                      target.detach().float()[[tgt_dict.index(t) for _, t in used]], dim=-1)
    non_shared = [i for i, (s, t) in enumerate(used) if s != t]
    return {"shared_embeddings": source.data_ptr() == target.data_ptr(),
            "joined_dictionary": src_dict is tgt_dict or src_dict.symbols == tgt_dict.symbols,
            "target_embedding": args.target_embedding, "pairs": len(pairs), "used": len(used),
            "skipped": len(pairs) - len(used), "source_oov": len(src_oov), "target_oov": len(tgt_oov),
            "oov_examples": (src_oov + tgt_oov)[:10], "all": float(cosines.mean()),
            "non_shared": float(cosines[non_shared].mean()) if non_shared else None,
            "non_shared_used": len(non_shared),
            "per_pair": [{"source": s, "target": t, "cosine": float(c)} for (s, t), c in zip(used, cosines)]}


def run_cosine(args) -> dict:
    pairs, lines = read_bilingual_dict(args.dict)
    rows = [{"checkpoint": path, "label": label, **aligned_cosine(model, path, task, pairs, args)}
            for path, label, model, _, task in checkpoints(args)]
    target_rows = "decoder input embeddings" if args.target_embedding == "input" else "output projection"
    print(f"cosine similarity of aligned source/target word embeddings (source: encoder embeddings, target: "
          f"{target_rows}); --dict {args.dict}: {lines} pair lines, {len(pairs)} distinct pairs")
    print(format_matrix("All = mean over the pairs used; Non-Shared = mean over the pairs whose two words differ",
                        [[f"{r['all']:.3f}", "n/a" if r["non_shared"] is None else f"{r['non_shared']:.3f}",
                          str(r["used"]), str(r["non_shared_used"]), str(r["skipped"]),
                          "shared" if r["shared_embeddings"] else "separate"] for r in rows],
                        [r["label"] for r in rows], ["All", "Non-Shared", "used", "non-shared", "OOV skipped",
                                                     "embeddings"], cell=str, corner="checkpoint"))
    for r in rows:
        if r["skipped"]:
            print(f"  {r['label']}: skipped {r['skipped']} of {r['pairs']} pairs with an out-of-vocabulary word "
                  f"({r['source_oov']} source, {r['target_oov']} target words), "
                  f"e.g. {', '.join(r['oov_examples'][:5])}")
    return write_outputs(args, {"dict": args.dict, "pair_lines": lines, "pairs": len(pairs), "rows": rows})


main = script_main(parse_args, lambda args: run_spectrum(args) if args.command == "spectrum" else run_cosine(args),
                   lambda args: f"embedding_analysis.py {args.command}", __name__)

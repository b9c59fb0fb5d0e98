#!/usr/bin/env python
"""Mask one encoder layer at a time in layer attention and measure the change in BLEU and output length, as in Liu
et al. (ICLR 2021) Sec. 3.3, Figure 2 (see examples/surface_fusion/README.md). Unknown flags are passed to every
fairseq-generate run.

For each encoder layer n = 0 ("Emb") .. N, and once unmasked, the real ``fairseq-generate`` runs with
``--model-overrides "{'mask_encoder_layer': n}"``, which zeroes layer n's layer-attention weight and renormalises
the others. ``--required-batch-size-multiple 1`` comes before the forwarded flags, which may override it: with a
larger multiple this fairseq drops a last, smaller batch. Per run: fairseq-generate's own ``BLEU4`` line, sacreBLEU
of the H- against the T- strings, tokens per H- string and the mean hypothesis score, which tells masked and unmasked
runs apart even when the strings coincide; changes are 100 * (masked - unmasked) / unmasked percent. Exit status 1
when a run fails.
"""

import glob
import os
import re
import subprocess
import sys

import sacrebleu

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_fairseq.checkpoint_safety import stored_model_config  # noqa: E402
from fusion_fairseq.cli import user_dir as plugin_user_dir  # noqa: E402
from fusion_lab.analysis import ReportedError, UsageError, checkpoint_setting, finite, format_matrix, \
    number, positive, pyplot, read_checkpoint, run_parallel, script_main, script_parser, write_outputs  # noqa: E402
from fusion_lab.common import python_module_command, refuse_existing_output, write_file  # noqa: E402

BLEU_LINE = re.compile(r"^Generate \S+ with beam=\d+: .*?\bBLEU4? = ([0-9.]+)", re.MULTILINE)
LOADED_LINE = re.compile(r"loaded ([0-9,]+) examples from: (.+?)\s*$", re.MULTILINE)
FORBIDDEN_FORWARDED = {
    "--quiet": "the H-/T- lines are needed",
    "--model-overrides": "the script sets it per run",
    "--results-path": "the script reads fairseq-generate's standard output",
    "--nbest": "the average length is over the best hypothesis only",
    "--score-reference": "Figure 2 is of the beam search's translations, not of the references' scores",
    "--sampling": "Figure 2 is of the beam search's translations",
    "--prefix-size": "the translations would start with the references' first tokens",
    "--match-source-len": "the translations' length is one of the measures",
}


def parse_args(argv: list[str] | None = None):
    parser = script_parser(__doc__, allow_abbrev=False, data_required=True, out_required=False, user_dir=False)
    parser.add_argument("--gen-subset", default="test", help="subset to translate (default: test)")
    parser.add_argument("--beam", type=positive(int, "--beam"), default=4, help="beam size (default: 4, Ro-En)")
    parser.add_argument("--lenpen", type=finite("--lenpen"), default=1.0, help="length penalty (default: 1.0, Ro-En)")
    parser.add_argument("--remove-bpe", nargs="?", const="@@ ", default=None, metavar="SYMBOL",
                        help="remove BPE before scoring and counting length (as fairseq-generate; default '@@ ')")
    parser.add_argument("--layers", help="comma-separated encoder layers to mask, 0 = Emb (default: all, 0..N)")
    parser.add_argument("--metric", choices=("bleu", "sacrebleu"), default="bleu",
                        help="score of the performance panel: fairseq's BLEU4 line (default) or sacrebleu on H/T")
    parser.add_argument("--jobs", type=positive(int, "--jobs"), default=1, help="fairseq-generate runs at a time")
    parser.add_argument("--keep-outputs", metavar="DIR",
                        help="save each run's fairseq-generate output as DIR/generate-{none,Emb,1,..}.txt")
    parser.add_argument("--timeout", type=positive(float, "--timeout"), default=None,
                        help="seconds per fairseq-generate run")
    args, forwarded = parser.parse_known_args(argv)
    for flag in forwarded:
        name = flag.split("=", 1)[0]
        if name in FORBIDDEN_FORWARDED:
            parser.error(f"{name} cannot be passed to fairseq-generate here: {FORBIDDEN_FORWARDED[name]}")
    args.forwarded = forwarded
    return args


def layers_to_mask(spec: str | None, num_encoder_layers: int) -> list[int]:
    if spec is None:
        return list(range(num_encoder_layers + 1))
    items = ["0" if item.strip().lower() == "emb" else item.strip() for item in spec.split(",")]
    for item in items:
        if not re.fullmatch(r"-?\d+", item):
            raise UsageError(f"--layers {spec}: {item!r} is not an encoder layer index (0 = Emb .. "
                             f"{num_encoder_layers})")
        if not 0 <= int(item) <= num_encoder_layers:  # the model's own message (check_fusion_args)
            raise UsageError(f"--layers {spec}: --mask-encoder-layer {int(item)} does not exist: the encoder has "
                             f"layers 0 (embedding) to {num_encoder_layers}")
    return list(dict.fromkeys(map(int, items)))


def layer_label(layer: int | None) -> str:
    return "none" if layer is None else ("Emb" if layer == 0 else str(layer))


def run_generate(args, layer: int | None) -> dict:
    command = [*python_module_command("fairseq_cli.generate"), args.data, "--user-dir", plugin_user_dir(),
               "--path", args.path, "--gen-subset", args.gen_subset, "--beam", str(args.beam),
               "--lenpen", str(args.lenpen), "--model-overrides", repr({"mask_encoder_layer": layer})]
    if args.remove_bpe is not None:
        command += ["--remove-bpe", args.remove_bpe]
    command += ["--required-batch-size-multiple", "1", *args.forwarded]  # the last of a flag given twice counts
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if args.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise ReportedError(f"fairseq-generate (mask {layer_label(layer)}) ran past --timeout {args.timeout}s")
    if args.keep_outputs:  # a directory, made if missing
        os.makedirs(args.keep_outputs, exist_ok=True)
        write_file(os.path.join(args.keep_outputs, f"generate-{layer_label(layer)}.txt"), result.stdout)
    if result.returncode != 0:
        raise ReportedError(f"fairseq-generate (mask {layer_label(layer)}) failed with exit status "
                            f"{result.returncode}:\n  {' '.join(command)}\n{result.stderr[-3000:]}")
    scores = parse_generate_output(result.stdout, result.stderr, args.gen_subset)
    print(f"  mask {layer_label(layer):>4}: BLEU {number(scores['bleu'], '.2f')}, avg len {scores['avg_len']:.3f}",
          flush=True)
    return {**scores, "command": command}


def parse_generate_output(stdout: str, stderr: str, subset: str) -> dict:
    hypotheses, targets = {}, {}  # sentence id -> (score, H- string) / T- string
    for line in stdout.splitlines():
        fields = line.split("\t") + [""]
        if line.startswith("H-"):
            hypotheses[int(fields[0][2:])] = (float(fields[1]), fields[2])
        elif line.startswith("T-"):
            targets[int(fields[0][2:])] = fields[1]
    ids = sorted(hypotheses)
    strings = [hypotheses[i][1] for i in ids]
    scored = ids and all(i in targets for i in ids)  # force: tokenised text on purpose, no warning
    sacrebleu_score = sacrebleu.corpus_bleu(strings, [[targets[i] for i in ids]], force=True).score if scored else None
    match = BLEU_LINE.search(stdout)
    return {"bleu": float(match.group(1)) if match else None, "sacrebleu": sacrebleu_score,
            "avg_len": sum(len(h.split()) for h in strings) / len(ids) if ids else 0.0,
            "avg_score": sum(hypotheses[i][0] for i in ids) / len(ids) if ids else None, "sentences": len(ids),
            "subset_size": next((int(count.replace(",", "")) for count, path in LOADED_LINE.findall(
                stdout + "\n" + stderr) if os.path.basename(path).startswith(subset + ".")), None),
            "hypotheses": strings}


COLUMNS = {"BLEU": ("bleu", ".2f"), "dBLEU%": ("bleu_change_pct", "+.2f"), "sacreBLEU": ("sacrebleu", ".2f"),
           "dsacre%": ("sacrebleu_change_pct", "+.2f"), "avg len": ("avg_len", ".3f"),
           "dlen%": ("len_change_pct", "+.2f"), "avg score": ("avg_score", ".4f"), "sents": ("sentences", "d")}


def plot(rows: list[dict], metric: str, title: str):
    masked = [row for row in rows if row["layer"] is not None]
    colors = pyplot().get_cmap("viridis")([i / max(1, len(masked) - 1) for i in range(len(masked))])
    metric_name = "BLEU (fairseq BLEU4)" if metric == "bleu" else "BLEU (sacrebleu)"
    panels = [(f"{metric}_change_pct", f"(a) Model performance: {metric_name}"),
              ("len_change_pct", "(b) Length of output")]
    fig, axes = pyplot().subplots(1, 2, figsize=(max(7.0, 1.1 * len(masked) + 4.0), 3.4), layout="constrained")
    for ax, (key, panel_title) in zip(axes, panels):
        values = [row[key] for row in masked]
        heights = [0.0 if v is None else v for v in values]
        bars = ax.bar(range(len(masked)), heights, color=colors, edgecolor="black", linewidth=0.5)
        ax.bar_label(bars, ["n/a" if value is None else f"{value:+.1f}%" for value in values], padding=2, fontsize=7)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(masked)), [row["masked"] for row in masked], fontsize=8)
        ax.set_xlabel("masked encoder layer", fontsize=8)
        ax.set_ylabel("relative change to unmasked (%)", fontsize=8)
        ax.yaxis.set_major_formatter("{x:g}%")
        ax.tick_params(labelsize=7)
        ax.set_title(panel_title, fontsize=9)
        if any(v is None for v in values):
            ax.text(0.5, 0.04, "n/a: the unmasked value is 0", transform=ax.transAxes, ha="center", fontsize=7)
        low, high = min(heights + [0.0]), max(heights + [0.0])
        pad = 0.15 * (high - low) or 1.0
        ax.set_ylim(low - pad, high + pad)
    fig.suptitle(title, fontsize=8)
    return fig


def table_row(layer: int | None, result: dict, base: dict, gen_subset: str) -> dict:
    """The scores of a run and their change relative to the unmasked ``base``."""
    if result["subset_size"] is not None and result["sentences"] != result["subset_size"]:
        print(f"warning: mask {layer_label(layer)}: fairseq-generate returned {result['sentences']} hypotheses "
              f"for {result['subset_size']} sentences of --gen-subset {gen_subset}", file=sys.stderr)
    row = {"layer": layer, "masked": layer_label(layer)}
    for key in ("bleu", "sacrebleu", "avg_len"):  # changes in percent, n/a against an unmasked value 0
        value, reference = result[key], base[key]
        change = None if value is None or not reference else 100.0 * (value - reference) / reference
        row.update({key: value, "len_change_pct" if key == "avg_len" else f"{key}_change_pct": change})
    return {**row, "avg_score": result["avg_score"], "sentences": result["sentences"],
            "identical_to_unmasked": layer is not None and result["hypotheses"] == base["hypotheses"],
            "command": result["command"]}


def run(args) -> dict:
    if args.keep_outputs:  # its earlier generate-*.txt are replaced only with --force
        if os.path.exists(args.keep_outputs) and not os.path.isdir(args.keep_outputs):
            raise UsageError(f"--keep-outputs {args.keep_outputs} is a file; give a directory")
        for earlier in sorted(glob.glob(os.path.join(glob.escape(args.keep_outputs), "generate-*.txt"))):
            refuse_existing_output("--keep-outputs", earlier, args.force, UsageError)
    if not os.path.isdir(args.data):
        raise UsageError(f"--data {args.data}: no such directory")
    config = stored_model_config(read_checkpoint(args.path))
    kind = checkpoint_setting(config, "layer-attention", ("coarse", "fine"), f"--path {args.path}",
                              "there is no layer-attention weight to mask")
    num_encoder_layers = int(config.encoder_layers)
    runs: list[int | None] = [None] + layers_to_mask(args.layers, num_encoder_layers)
    results = run_parallel(lambda layer: run_generate(args, layer), runs, args.jobs)
    rows = [table_row(layer, results[layer], results[None], args.gen_subset) for layer in runs]
    print(format_matrix(f"encoder-layer masking ({kind}-grained layer attention, encoder layers Emb.."
                        f"{num_encoder_layers}): {args.path}\n--gen-subset {args.gen_subset}, beam {args.beam}, "
                        f"lenpen {args.lenpen}, remove-bpe {args.remove_bpe!r}; BLEU = fairseq-generate's BLEU4 "
                        "line, sacreBLEU = sacrebleu on the H-/T- lines;\navg len = mean tokens per H- line; "
                        "d...% = relative change to the unmasked run",
                        [[number(row[key], spec) for key, spec in COLUMNS.values()] for row in rows],
                        [row["masked"] for row in rows], list(COLUMNS), cell=str, corner="masked"))
    result = {"checkpoint": args.path, "data": args.data, "gen_subset": args.gen_subset, "beam": args.beam,
              "lenpen": args.lenpen, "remove_bpe": args.remove_bpe, "layer_attention": kind,
              "encoder_layers": num_encoder_layers, "metric": args.metric,
              "bleu_source": "fairseq-generate's final 'BLEU4 = ' line",
              "sacrebleu_source": "sacrebleu.corpus_bleu on the H-/T- strings (13a tokenisation)", "rows": rows}
    title = (f"Relative changes when masking one encoder layer: {os.path.basename(args.path)} ({kind}-grained layer "
             f"attention), {args.gen_subset}, beam {args.beam}")
    return write_outputs(args, result, plot(rows, args.metric, title) if args.out else None)


main = script_main(parse_args, run, "mask_encoder_layers.py", __name__)

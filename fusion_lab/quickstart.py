"""The main job: a vanilla Transformer vs. MLRF (Both-FNN-SA) at the same size and budget.

The synthetic corpus of :mod:`fusion_lab.synthetic` -> one joint subword-nmt BPE ->
``fairseq-preprocess --joined-dictionary`` (or ``--data DIR``, the output of ``corpus prepare``, which did
these stages) -> ``fairseq-train`` of each model with the same dimensions, updates, batch and schedule ->
``fairseq-generate``, scored as ``corpus evaluate`` scores, then a table of BLEU, parameters and speeds.
Everything goes under ``--out``, a folder of quickstart's own (a folder holding anything else is refused
without ``--force``); a re-run overwrites only the files it wrote. Stages, outputs and options:
examples/README.md.

Why a peak learning rate of 1e-3: at 2e-3 or 3e-3 the MLRF model's self-attention fusion over
decoder layers puts ~99% of its weight on the two lowest layers (h0, h1) within ~200 updates and
stays on a language-model plateau (valid loss ~4.2) for hundreds of updates; at 1e-3 both learn.
"""

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections import defaultdict
from types import SimpleNamespace

from fusion_fairseq.cli import user_dir
from fusion_fairseq.config_fields import INTEGER, PROBABILITY, Values, argparse_type, flag_of, real
from fusion_lab import corpus
from fusion_lab.analysis import markdown_rows, number, run_parallel
from fusion_lab.common import (BATCHES_IN_THREAD, FAIRSEQ_GENERATE_WRITES, FAIRSEQ_TRAIN_WRITES, claim_out_dir,
                               folder_without_links, make_own_folder, non_negative_int, positive_int, write_file)

# name -> (arch, description, fusion flags); fgla and surface_fusion feed examples/surface_fusion/analyses.sh.
MODELS = {
    "transformer": ("transformer", "fairseq's Transformer", []),
    "mlrf": ("fusion_transformer", "MLRF Both-FNN-SA", ["--fuse-encoder", "fnn", "--fuse-decoder", "sa"]),
    "fgla": ("fusion_transformer", "fine-grained layer attention", ["--layer-attention", "fine"]),
    "surface_fusion": ("fusion_transformer", "SurfaceFusion (hard, lambda 0.8)",
                       ["--surface-fusion", "hard", "--surface-fusion-lambda", "0.8"]),
}
MLRF_FLAGS = ("fusion_hops", "fusion_attn_dim", "fusion_ffn_dim")  # left to fusion_transformer's defaults unless given
# fairseq-train seeds numpy with --seed, which takes nothing outside [0, 2**32 - 1]
SEED = Values("must be an integer in [0, 2**32 - 1]", lambda value: type(value) is int and 0 <= value < 2**32, int)


def log(message=""):
    print(message, flush=True)


def stage(number, title):
    log(f"\n=== [{number}/5] {title}")


def model_flags(args, name):
    arch, _, fusion = MODELS[name]
    flags = ["--arch", arch, "--dropout", args.dropout, "--share-all-embeddings"]
    for side in ("encoder", "decoder"):
        flags += [f"--{side}-layers", args.layers, f"--{side}-embed-dim", args.embed_dim,
                  f"--{side}-ffn-embed-dim", args.ffn_dim, f"--{side}-attention-heads", args.heads]
    if arch == "fusion_transformer":
        flags += ["--user-dir", user_dir(), *fusion]
    if name == "mlrf":
        flags += [x for key in MLRF_FLAGS if getattr(args, key) is not None for x in (flag_of(key), getattr(args, key))]
    return [str(f) for f in flags]


class TrainProgress:
    """Turns fairseq's json log lines into one progress line per interval; keeps the table's numbers."""

    INFO = re.compile(r"\|\s*INFO\s*\|\s*(\S+)\s*\|\s*(.*)$")
    SHOWN = {"train_inner": "update {num_updates}/{max_update}  epoch {epoch}  loss {loss}  {wps} tok/s  "
                            "({elapsed:.0f}s)",
             "valid": "epoch {epoch} valid loss {valid_loss} ppl {valid_ppl}  (update {valid_num_updates}, "
                      "{elapsed:.0f}s)"}  # the progress lines of fairseq's json log lines

    def __init__(self, name, max_update, verbose):
        self.name, self.max_update, self.verbose = name, max_update, verbose
        self.params, self.epochs, self.start = None, [], time.time()  # epochs: the train summaries

    def __call__(self, line):
        if self.verbose:
            log(f"    {line}")
        match = self.INFO.search(line)
        if not match:
            if "Traceback" in line or "Error" in line:
                log(f"  [{self.name}] {line}")
            return
        tag, message = match.groups()
        params = re.search(r"num\. (?:shared )?model params:\s*([\d,]+)", message)
        if params:
            self.params = int(params.group(1).replace(",", ""))
            log(f"  [{self.name}] {self.params:,} parameters")
        try:
            stats = json.loads(message) if message.startswith("{") else None
        except ValueError:
            stats = None
        if stats is not None and tag == "train":
            self.epochs.append(stats)
        elif stats is not None and tag in self.SHOWN:
            values = defaultdict(lambda: None, stats, max_update=self.max_update, elapsed=time.time() - self.start)
            log(f"  [{self.name}] " + self.SHOWN[tag].format_map(values))

    def train_tokens_per_second(self):
        """Target tokens per second over all epochs (each epoch's wps and wpb; its updates from num_updates)."""
        tokens = seconds = previous_updates = 0
        for stats in self.epochs:
            updates = int(float(stats["train_num_updates"])) - previous_updates
            previous_updates += updates
            epoch_tokens, wps = float(stats["train_wpb"]) * updates, float(stats["train_wps"])
            if wps > 0:
                tokens, seconds = tokens + epoch_tokens, seconds + epoch_tokens / wps
        return tokens / seconds if seconds else None


def train(args, name, dirs, env):
    save_dir = os.path.join(dirs.checkpoints, name)
    folder_without_links(save_dir, FAIRSEQ_TRAIN_WRITES)
    for stale in ("checkpoint_best.pt", "checkpoint_last.pt"):  # our own files of an earlier run: start afresh
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(save_dir, stale))
    flags = [
        dirs.bin, *model_flags(args, name),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", args.lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", args.warmup_updates,
        "--warmup-init-lr", "1e-07", "--weight-decay", "0.0001",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", args.max_tokens, "--max-update", args.max_update,
        "--seed", args.seed, *BATCHES_IN_THREAD, "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--log-format", "json", "--log-interval", args.log_interval or max(10, args.max_update // 10),
        "--skip-invalid-size-inputs-valid-test",
        # fairseq's batch_by_size drops a last, partial batch that is not a multiple of this (default 8)
        "--required-batch-size-multiple", "1", *(["--cpu"] if args.cpu else []),
    ]
    progress = TrainProgress(name, args.max_update, args.verbose)
    cpu = corpus.run_fairseq("train", flags, os.path.join(dirs.logs, f"train-{name}.log"), env, progress)
    wall = time.time() - progress.start
    log(f"  [{name}] trained in {wall:.0f}s (CPU time {cpu:.0f}s) -> {save_dir}")
    best, last = (os.path.join(save_dir, f"checkpoint_{which}.pt") for which in ("best", "last"))
    checkpoint = best if os.path.isfile(best) else last
    return {"checkpoint": checkpoint, "params": progress.params, "train_wps": progress.train_tokens_per_second(),
            "train_seconds": wall, "train_cpu_seconds": cpu}


def generate(args, name, dirs, checkpoint, env):
    """fairseq-generate on the test split: the output file and fairseq's sentences/s."""
    results_dir, log_path = os.path.join(dirs.logs, f"generate-{name}"), os.path.join(dirs.logs, f"generate-{name}.log")
    started = time.time()
    folder_without_links(results_dir, FAIRSEQ_GENERATE_WRITES)
    corpus.run_fairseq("generate", [
        dirs.bin, "--path", checkpoint, "--gen-subset", "test", "--beam", args.beam, "--remove-bpe",
        "--batch-size", args.batch_size, *BATCHES_IN_THREAD,  # fairseq's length limits, as corpus evaluate
        "--required-batch-size-multiple", "1", "--user-dir", user_dir(), *(["--cpu"] if args.cpu else []),
        "--results-path", results_dir], log_path, env)
    generated = os.path.join(results_dir, "generate-test.txt")
    # the summary line goes to the log (stderr), or into the results file
    speeds = re.findall(r"Translated [\d,]+ sentences .*\(([\d.]+) sentences/s",
                        "\n".join(corpus.read_lines(log_path) + corpus.read_lines(generated)))
    log(f"  [{name}] translated the test split in {time.time() - started:.0f}s -> {generated}")
    return generated, float(speeds[-1]) if speeds else None


#: what quickstart writes into --out
OUT_NAMES = ("raw", "bpe", "data-bin", "checkpoints", "logs", "results.md", "results.json")
TABLE_COLUMNS = ("model", "method", "BLEU", "params", "train tok/s", "decode sent/s")


def format_table(rows):
    return "\n".join(markdown_rows(TABLE_COLUMNS, [(r["model"], r["description"], number(r["bleu"], ".2f"),
                                                    number(r["params"], ","), number(r["train_wps"], ",.0f"),
                                                    number(r["decode_sps"], ".1f")) for r in rows], left=2, pad=True))


def build_parser():
    p = corpus.Parser(  # a bad value: one line naming the flag, the value and what is allowed
        prog="fusion-fairseq-quickstart", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train fairseq's Transformer and MLRF (Both-FNN-SA) at the same size and budget on a "
        "synthetic corpus (default) or on the output of corpus prepare (--data), then compare BLEU and speed.")
    p.add_argument("--out", default="quickstart_out", help="output directory (an earlier run's files are overwritten)")
    p.add_argument("--force", action="store_true", help="write into an --out that holds files quickstart did not write "
                   "(its own outputs there are replaced; other files are kept)")
    g = p.add_argument_group("data")
    g.add_argument("--data", help="the --dest folder of `python -m fusion_lab.corpus prepare` (its data-bin "
                   "and recipe.env); default: generate the synthetic corpus")
    for split, size in (("train", 12000), ("valid", 300), ("test", 300)):
        g.add_argument(f"--{split}-size", type=positive_int, default=size, help=f"synthetic {split} pairs")
    g.add_argument("--lexicon-seed", type=argparse_type(INTEGER), default=0, help="seed of the synthetic vocabulary")
    g.add_argument("--bpe-merges", type=positive_int, default=1000, help="joint BPE merges of the synthetic corpus")
    g = p.add_argument_group("models (the same for both)")
    g.add_argument("--models", default="transformer,mlrf", help="comma-separated subset of: " + ", ".join(MODELS))
    for name, default, text in (("--layers", 3, "encoder and decoder layers"), ("--embed-dim", 128, None),
                                ("--ffn-dim", 512, None), ("--heads", 4, None)):
        g.add_argument(name, type=positive_int, default=default, help=text)
    g.add_argument("--dropout", type=argparse_type(PROBABILITY), default=0.1)
    g.add_argument("--fusion-hops", type=positive_int, help="MLRF hops (default: 4)")
    g.add_argument("--fusion-attn-dim", type=positive_int, help="MLRF da (default: 4 x embed-dim)")
    g.add_argument("--fusion-ffn-dim", type=positive_int, help="MLRF df (default: 2 x embed-dim)")
    g = p.add_argument_group("budget (the same for both)")
    g.add_argument("--max-update", type=positive_int, default=600)
    g.add_argument("--max-tokens", type=positive_int, default=2048, help="batch size in tokens")
    g.add_argument("--lr", type=argparse_type(real(0.0, float("inf"), low_included=False)), default=0.001, help="peak learning rate of the inverse-sqrt schedule")
    g.add_argument("--warmup-updates", type=positive_int, default=150)
    g.add_argument("--seed", type=argparse_type(SEED), default=1, help="seed of the synthetic sentences and of training")
    g.add_argument("--beam", type=positive_int, default=5)
    g.add_argument("--batch-size", type=positive_int, default=128, help="sentences per batch in fairseq-generate")
    g = p.add_argument_group("run")
    g.add_argument("--jobs", type=non_negative_int, default=0, help="models trained (and decoded) at the same time "
                   "(0: one per CPU core without a GPU, else 1)")
    g.add_argument("--threads", type=non_negative_int, default=0, help="OMP/MKL threads of each fairseq process "
                   "(0: cores / jobs when jobs > 1, else torch's default)")
    g.add_argument("--cpu", action="store_true", help="pass --cpu to fairseq (default: GPU when there is one)")
    g.add_argument("--log-interval", type=non_negative_int, default=0, help="updates between progress lines (0: max-update/10)")
    g.add_argument("--verbose", action="store_true", help="echo every fairseq log line")
    return p


SYNTHETIC_FLAGS = ("train_size", "valid_size", "test_size", "lexicon_seed", "bpe_merges")


def check_args(args):
    """The models to train; values out of range are refused naming the flag."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise SystemExit(f"error: --models: unknown {unknown} (choose from {', '.join(MODELS)})")
    twice = sorted({m for m in models if models.count(m) > 1})
    if twice:  # each model trains in a folder of its name: two at once would remove each other's checkpoints
        raise SystemExit(f"error: --models {args.models}: {', '.join(twice)} given twice; name each model once")
    if args.embed_dim % args.heads:
        raise SystemExit(f"error: --embed-dim {args.embed_dim} is not divisible by --heads {args.heads}")
    # MLRF's flags are read only by the mlrf model: warned about without it
    given = {flag_of(name): getattr(args, name) for name in MLRF_FLAGS if getattr(args, name) is not None}
    if given and "mlrf" not in models:
        print(f"warning: flag without effect: {', '.join(f'{name} {value}' for name, value in given.items())}: only "
              f"the mlrf model reads it, and --models is {','.join(models)}", file=sys.stderr)
    return models


def prepared_data(directory):
    """Stage 1 of --data: the recipe.env of ``corpus prepare --dest DIRECTORY`` (languages, casing, references)."""
    data_bin = os.path.join(directory, "data-bin")
    recipe = corpus.read_recipe_env(data_bin)
    references = [recipe.get(f"{kind}_REF_test", "") for kind in ("RAW", "TOK")]
    if not ("SRC" in recipe and "TGT" in recipe and all(map(os.path.isfile, references))):
        raise SystemExit(f"error: --data {directory}: expected the --dest folder of `python -m fusion_lab."
                         "corpus prepare` (its data-bin/recipe.env names the test references); run that first (your "
                         "own text: corpus prepare text --from DIR --src L --tgt L --dest OUT, then --data OUT)")
    stage(1, f"data: {data_bin} ({recipe['SRC']} -> {recipe['TGT']}), BPE'd and binarised by corpus prepare")
    return recipe


def prepare_synthetic(args, dirs):
    """Stages 1 to 3: the synthetic corpus, its joint BPE, fairseq-preprocess; its recipe as corpus prepare's."""
    from fusion_lab.synthetic import write_corpus

    stage(1, "data: synthetic corpus (src -> tgt)")
    langs = ("src", "tgt")
    write_corpus(dirs.raw, args.train_size, args.valid_size, args.test_size, args.seed, args.lexicon_seed, *langs)
    text = {split: {lang: corpus.read_lines(os.path.join(dirs.raw, f"{split}.{lang}")) for lang in langs}
            for split in corpus.SPLITS}
    for split in text:
        log(f"  {split:5s}: {len(text[split]['src']):,} sentence pairs -> {dirs.raw}/{split}.{{src,tgt}}")
    stage(2, f"joint BPE (subword-nmt, {args.bpe_merges} merges)")
    codes = os.path.join(dirs.bpe, "codes")
    os.makedirs(dirs.bpe, exist_ok=True)
    bpe = corpus.learn_and_apply_bpe(text, *langs, args.bpe_merges, codes)
    corpus.write_splits(bpe, dirs.bpe, langs)
    words, pieces = (sum(len(line.split()) for line in t["train"]["tgt"]) for t in (text, bpe))
    log(f"  {args.bpe_merges} merges -> {codes}; train.tgt: {words:,} words -> {pieces:,} subwords")
    stage(3, "fairseq-preprocess --joined-dictionary")
    corpus.binarise(dirs.bpe, dirs.bin, *langs, log_path=os.path.join(dirs.logs, "preprocess.log"))
    types = len(corpus.read_lines(os.path.join(dirs.bin, "dict.src.txt")))
    log(f"  joined dictionary: {types:,} types (+4 specials) -> {dirs.bin}")
    test = os.path.join(dirs.raw, "test.tgt")  # the synthetic text is tokenised already: its own tokenised reference
    return {"SRC": "src", "TGT": "tgt", "RAW_REF_test": test, "TOK_REF_test": test}


def train_and_test(args, models, jobs, dirs, env, recipe):
    """Stages 4 and 5: train every model, decode the test split and score it as ``corpus evaluate``
    does; the table's rows."""
    parallel = f", {jobs} at a time with {env.get('OMP_NUM_THREADS', 'default')} thread(s) each" if jobs > 1 else ""
    stage(4, f"fairseq-train {' and '.join(models)}: {args.layers}+{args.layers} layers, d={args.embed_dim}, "
          f"FFN {args.ffn_dim}, {args.max_update} updates of <= {args.max_tokens} tokens{parallel}")
    for name in models:
        log(f"  [{name}] {MODELS[name][1]} (--arch {MODELS[name][0]})")
    trained = run_parallel(lambda name: train(args, name, dirs, env), models, jobs)
    stage(5, f"fairseq-generate (beam {args.beam}, --remove-bpe) on the test split + sacreBLEU, tokenised BLEU")
    generated = run_parallel(lambda name: generate(args, name, dirs, trained[name]["checkpoint"], env), models, jobs)
    lowercase, compound_split = (recipe.get(key) == "1" for key in ("LOWERCASE", "COMPOUND_SPLIT"))
    rows = []
    for name in models:
        results, decode_sps = generated[name]
        log(f"  [{name}] scores -> {os.path.dirname(results)}/scores.json")
        scores = corpus.score(results, os.path.dirname(results), recipe["TGT"], recipe["RAW_REF_test"],
                              recipe["TOK_REF_test"], lowercase, compound_split)
        rows.append({"model": name, "arch": MODELS[name][0], "description": MODELS[name][1],
                     "bleu": scores["sacrebleu"], **trained[name], "decode_sps": decode_sps, "scores": scores})
    return rows


def main(argv=None):
    """Console entry point ``fusion-fairseq-quickstart``: the whole job."""
    import torch

    parser = build_parser()
    args = parser.parse_args(argv)
    started = time.time()
    models = check_args(args)
    # the synthetic corpus's flags are read only without --data: warned about beside it
    given = {flag_of(name): getattr(args, name) for name in SYNTHETIC_FLAGS
             if getattr(args, name) != parser.get_default(name)}
    if args.data and given:
        print(f"warning: flag without effect: {', '.join(f'{name} {value}' for name, value in given.items())}: only "
              f"the synthetic corpus reads it, and --data {args.data} gives the corpus", file=sys.stderr)
    out = os.path.abspath(args.out)
    if args.data and os.path.realpath(args.data) == os.path.realpath(out):
        raise SystemExit(f"fusion-fairseq-quickstart: error: --data {args.data} is --out {args.out} (through links): "
                         "the quickstart writes its checkpoints, logs and stamp there; give another --out")
    recipe = prepared_data(args.data) if args.data else None
    dirs = SimpleNamespace(out=out, bin=os.path.join(args.data or out, "data-bin"),  # --data: corpus prepare's
                           **{name: os.path.join(out, name) for name in ("raw", "bpe", "checkpoints", "logs")})
    claim_out_dir(out, OUT_NAMES, "fusion-fairseq quickstart", args.force, "quickstart",
                  lambda message: SystemExit(f"fusion-fairseq-quickstart: error: {message}"))
    make_own_folder(dirs.logs)  # a link named logs went with the claim; the logs replace links, never follow them
    cpus = len(os.sched_getaffinity(0))
    # Without a GPU one model per core, one thread each: OpenMP threads fighting over the cores are many times slower.
    jobs = args.jobs or (1 if torch.cuda.is_available() else max(1, min(len(models), cpus)))
    if not args.threads and jobs > 1:
        args.threads = max(1, cpus // jobs)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    recipe = recipe or prepare_synthetic(args, dirs)
    rows = train_and_test(args, models, jobs, dirs, env, recipe)
    table, wall = format_table(rows), time.time() - started
    log(f"\n=== results on {args.data or 'the synthetic'} test set ({recipe['SRC']} -> {recipe['TGT']}), "
        f"{args.max_update} updates each, total wall time {wall:.0f}s\n")
    log(table)
    corpus.write_lines(os.path.join(dirs.out, "results.md"), [table])
    write_file(os.path.join(dirs.out, "results.json"),
               json.dumps({"args": vars(args), "wall_seconds": wall, "models": rows}, indent=2))
    log(f"\nwritten: {dirs.out}/results.md, {dirs.out}/results.json (logs and hypotheses in {dirs.logs})")


if __name__ == "__main__":
    main()

"""One benchmark for all methods: translation quality at a matched size and an identical budget.

``python scripts/compare_methods.py`` (this module's :func:`main`) trains fairseq's vanilla
``transformer`` and one headline configuration of every paper implemented by the plugin on
Multi30k De->En (train / val, four test sets), with the *same* data (one joint BPE, one joined
dictionary), optimiser, learning-rate schedule, batch size, update budget and seeds, then writes

* ``results.json`` -- every setting, every run (per seed: sacreBLEU, tokenised BLEU, parameters,
  updates, training time, device), per method the mean / sample std / min / max over seeds, and the
  learning curves;
* ``results.md`` -- the same as tables, with which runs are done, pending or in progress, the
  device(s) and the budget;
* ``learning_curves.png`` -- validation NLL (bits per target token) against updates, one line per
  method, the mean over the seeds available at each point.

The methods are the rows of :data:`METHODS` (``--methods`` picks a subset). Widths are common
(``--width``, default 3+3 layers, d=256, FFN 1024, 4 heads; ``--small``: d=128, FFN 512); the two
models that have no N+M encoder-decoder depth get the free size parameter that their papers use to
match the baseline chosen so that their parameter count is closest to the vanilla Transformer's
(:func:`match_parameter`): the depth of the layer-wise coordination stack, and the growth dimension
of the dense Transformer.

Resumable. Every (method, seed) run lives in ``OUT/runs/METHOD/seedS/``. A finished run has the
marker ``done.json`` (holding its test BLEU) and is never retrained; an unfinished run resumes from
its ``checkpoints/checkpoint_last.pt`` (fairseq restores it by itself in the same ``--save-dir``,
mid-epoch included), so the table can be produced in pieces over many invocations. A run whose stored
settings differ from the ones asked for is refused (use another ``--out``). A lock file per run keeps
two invocations on one ``--out`` from training the same run. Runs are ordered seed-major, so the
first pieces are a complete one-seed comparison.

Each step of a run is one worker process: ``python -m fusion_fairseq.tools.comparison _train RUN_DIR
UPDATES`` trains with fairseq-train's own code in-process up to UPDATES; ``_evaluate RUN_DIR BUDGET``
translates and scores every test set with the best and the averaged checkpoint exactly as
``scripts/evaluate.sh`` does (fairseq-generate, beam 5, ``--remove-bpe``, then
``scripts/recipe_tool.py`` hyps / detok / bleu: detokenised sacreBLEU against the raw reference and
tokenised BLEU against the Moses-tokenised reference, case-insensitive as the data are lowercased).
``--max-update auto`` calibrates the budget, ``composition`` adds the eighth configuration (see
:data:`BUDGET_RULE` and :data:`COMPOSITION_RULE`).
"""

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Dict, List, Optional, Sequence, Tuple

from fusion_fairseq.tools.common import cpu_name, device_name, load_average, positive_int

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(PLUGIN_DIR)
SCRIPTS_DIR = os.path.join(REPO_ROOT, "scripts")


def log(message: str = "") -> None:
    print(f"[compare] {message}", flush=True)


class ComparisonError(SystemExit):
    """A user-facing error (exits with status 1, printing the message)."""

    def __init__(self, message: str):
        super().__init__(f"compare_methods: error: {message}")


# ---------------------------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    name: str
    title: str
    paper: str
    arch: str
    flags: Tuple[str, ...] = ()
    #: "encdec": --encoder-*/--decoder-* width flags + --share-all-embeddings;
    #: "shared": one stack (--embed-dim/--ffn-embed-dim/--attention-heads), one embedding by construction
    style: str = "encdec"
    criterion: Tuple[str, ...] = ()  # replaces the common criterion flags
    match: Optional[str] = None  # flag chosen to match the vanilla Transformer's parameter count
    note: str = ""
    #: the BLEU difference to its Transformer baseline that the paper reports for this configuration, and where
    paper_gap: Optional[Tuple[float, str]] = None
    #: a method that starts from the final averaged checkpoint of this method's run of the same seed
    #: (fairseq's --finetune-from-model) and trains --finetune-update more updates
    init: Optional[str] = None
    #: the row its difference and verdict are taken against
    baseline: str = "transformer"


#: One headline configuration per paper, at the common width. Order = table order.
METHODS: Dict[str, Method] = {m.name: m for m in (
    Method("transformer", "Transformer (baseline)", "fairseq's vanilla Transformer", "transformer",
           note="post-norm, sinusoidal positions"),
    Method("mlrf", "MLRF Both-FNN-SA", "Wang et al. 2018, multi-layer representation fusion",
           "fusion_transformer", ("--fuse-encoder", "fnn", "--fuse-decoder", "sa"),
           note="the paper's best system; fusion sizes from the architecture (attention 4d, FFN 2d, 4 hops)",
           paper_gap=(+0.92, "IWSLT14 De-En, Table 2: 33.59 vs the 3-layer Transformer with restarted Adam, 32.67")),
    Method("deeprep", "Deep representations: hierarchical + diversity", "Dou et al. 2018 (EMNLP)",
           "fusion_transformer", ("--aggregate-encoder", "hierarchical", "--aggregate-decoder", "hierarchical"),
           criterion=("--criterion", "label_smoothed_cross_entropy_with_layer_diversity", "--label-smoothing", "0.1",
                      "--diversity-lambda", "1.0"),
           note="hierarchical layer aggregation on both sides + layer-diversity regulariser, lambda 1.0 (the "
                "paper's final system); trained from scratch like every row (the paper fine-tunes from the vanilla model)",
           paper_gap=(+1.14, "WMT14 En-De, Transformer-Base, Table 1 row 9: 28.78 vs 27.64")),
    Method("surface_fusion", "Encoder layer fusion: SurfaceFusion (hard, 0.8)", "Liu et al. 2021",
           "fusion_transformer", ("--surface-fusion", "hard", "--surface-fusion-lambda", "0.8"),
           note="the paper's proposed method: the source embedding fused into the output layer",
           paper_gap=(+1.3, "WMT16 Ro-En, Table 2: hard fusion 35.1 vs vanilla 33.8")),
    Method("fgla", "Encoder layer fusion: fine-grained layer attention", "Liu et al. 2021",
           "fusion_transformer", ("--layer-attention", "fine"),
           note="the fine-grained layer attention the paper analyses (second row of the same paper)",
           paper_gap=(+0.65, "WMT16 Ro-En, Table 1: 34.45 vs 33.80")),
    Method("layerwise_coordination", "Layer-wise coordination", "He et al. 2018 (NeurIPS)",
           "layerwise_coordination", style="shared", match="--layers",
           note="one shared stack, mixed attention; depth chosen to match the Transformer's parameters as the paper "
                "does (14 layers ~ 6+6); input/output embedding shared by construction",
           paper_gap=(+2.21, "IWSLT14 De-En, Table 1: 35.07 vs the small Transformer, 32.86")),
    Method("dense_transformer", "DenseNMT (dense Transformer, DenseAtt-2)", "Shen et al. 2018 (NAACL)",
           "dense_transformer", ("--dense-attention", "2", "--summary-every", "0"), match="--growth-dim",
           note="dense encoder + dense decoder + DenseAtt-2, no summary layers (the paper's shallow 4L setting); growth "
                "dimension chosen to match the Transformer's parameters as the paper does (DenseNMT-4L ~ BASE-4L)",
           paper_gap=(+0.02, "IWSLT14 De-En, Table 1, embedding 128: DenseNMT-4L-2 30.01 vs the convolutional "
                             "BASE-4L 29.99 (+0.80 at 64, +0.97 at 256)")),
    Method("denseformer", "DenseFormer 1x1", "Pagliardini et al. 2024", "fusion_transformer",
           ("--denseformer-encoder", "--denseformer-decoder"),
           note="a depth-weighted average of the embedding and every earlier block's output after each block, "
                "on both sides (dilation 1, period 1); the paper measures language models (perplexity), no translation BLEU"),
    Method("hyper_connections", "Hyper-connections DHCx4", "Zhu et al. 2025 (ICLR)", "fusion_transformer",
           ("--hyper-connections-encoder", "dynamic", "--hyper-connections-decoder", "dynamic",
            "--hyper-connections-rate", "4"),
           note="dynamic hyper-connections, expansion rate 4, on both sides; the paper measures language models, no "
                "translation BLEU"),
    Method("transformer_continued", "Transformer, continued", "fairseq's vanilla Transformer", "transformer",
           init="transformer",
           note="the Transformer's final averaged checkpoint trained --finetune-update more updates with the same "
                "schedule: the baseline of deeprep_finetuned"),
    Method("deeprep_finetuned", "Deep representations, fine-tuned from the Transformer", "Dou et al. 2018 (EMNLP)",
           "fusion_transformer", ("--aggregate-encoder", "hierarchical", "--aggregate-decoder", "hierarchical"),
           criterion=("--criterion", "label_smoothed_cross_entropy_with_layer_diversity", "--label-smoothing", "0.1",
                      "--diversity-lambda", "1.0"), init="transformer", baseline="transformer_continued",
           note="as deeprep, but starting from the Transformer's final averaged checkpoint of the same seed and "
                "trained --finetune-update more updates with the same schedule, as the paper trains it",
           paper_gap=(+1.14, "WMT14 En-De, Transformer-Base, Table 1 row 9: 28.78 vs 27.64")),
)}
#: the methods of the 3+3 (shallow) comparison: the default of --methods without --deep
SHALLOW_METHODS = ("transformer", "mlrf", "deeprep", "surface_fusion", "fgla", "layerwise_coordination",
                   "dense_transformer")


def resolve_methods(names: Sequence[str]) -> List[Method]:
    wanted: List[str] = []
    for item in names:
        wanted += [n.strip() for n in item.split(",") if n.strip()]
    if not wanted:
        raise ComparisonError(f"--methods: no method given (known methods: {', '.join(METHODS)})")
    known = {**METHODS, COMPOSITION: COMPOSITION_PLACEHOLDER}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ComparisonError(f"--methods: unknown method(s) {', '.join(repr(n) for n in unknown)}; known methods: "
                              f"{', '.join(known)}")
    return [known[n] for n in dict.fromkeys(wanted)]


# ----------------------------------------------------------------------------------------------- width
@dataclass(frozen=True)
class Width:
    encoder_layers: int
    decoder_layers: int
    dim: int
    ffn: int
    heads: int

    def __str__(self):
        return f"{self.encoder_layers}+{self.decoder_layers}:{self.dim}:{self.ffn}:{self.heads}"

    def describe(self):
        return (f"{self.encoder_layers}+{self.decoder_layers} layers, d={self.dim}, FFN {self.ffn}, "
                f"{self.heads} heads")


DEFAULT_WIDTH = "3+3:256:1024:4"
SMALL_WIDTH = "3+3:128:512:4"
#: ``--deep``: the 6+6 comparison (examples/comparison/README.md, "The 6+6 comparison"): this width, the
#: polynomial schedule to a fixed budget, these methods, the averaged checkpoint only, the verdict of
#: :func:`seed_sentence_bootstrap` and a third seed where two do not decide (:data:`THIRD_SEED_RULE`)
DEEP_WIDTH = "6+6:128:512:4"
DEEP_METHODS = (*SHALLOW_METHODS, "denseformer", "hyper_connections", "transformer_continued", "deeprep_finetuned",
                "composition")


def parse_width(text: str) -> Width:
    m = re.fullmatch(r"\s*(\d+)\+(\d+):(\d+):(\d+):(\d+)\s*", text or "")
    if not m:
        raise argparse.ArgumentTypeError(
            f"expected ENC+DEC:DIM:FFN:HEADS (e.g. {DEFAULT_WIDTH}), got {text!r}")
    width = Width(*(int(g) for g in m.groups()))
    if min(width.encoder_layers, width.decoder_layers, width.dim, width.ffn, width.heads) < 1:
        raise argparse.ArgumentTypeError(f"every number of --width must be positive, got {text!r}")
    if width.dim % width.heads:
        raise argparse.ArgumentTypeError(f"--width: d={width.dim} is not divisible by {width.heads} heads")
    return width


def width_flags(method: Method, width: Width) -> List[str]:
    if method.style == "shared":
        return ["--embed-dim", str(width.dim), "--ffn-embed-dim", str(width.ffn),
                "--attention-heads", str(width.heads)]
    flags = []
    for side, layers in (("encoder", width.encoder_layers), ("decoder", width.decoder_layers)):
        flags += [f"--{side}-layers", str(layers), f"--{side}-embed-dim", str(width.dim),
                  f"--{side}-ffn-embed-dim", str(width.ffn), f"--{side}-attention-heads", str(width.heads)]
    return flags + ["--share-all-embeddings"]


def match_candidates(method: Method, width: Width) -> List[int]:
    if method.match == "--layers":
        return list(range(1, 4 * (width.encoder_layers + width.decoder_layers) + 1))
    if method.match == "--growth-dim":
        step = width.heads * 8 // math.gcd(width.heads, 8)  # divisible by the heads, a multiple of 8
        return list(range(step, 2 * width.dim + 1, step))
    raise ValueError(f"no candidates for {method.match}")


def match_parameter(count, candidates: Sequence[int], target: int) -> Tuple[int, int, Dict[int, int]]:
    """The candidate whose ``count(candidate)`` is closest to ``target`` (ties: the smaller one), for a
    ``count`` that does not decrease along ``candidates``; binary search, so few models are built.
    Returns (value, its count, every count computed)."""
    seen: Dict[int, int] = {}

    def at(i):
        value = candidates[i]
        if value not in seen:
            seen[value] = count(value)
        return seen[value]

    lo, hi = 0, len(candidates) - 1
    if at(hi) < target:
        lo = hi
    else:
        while lo < hi:  # first index with count >= target
            mid = (lo + hi) // 2
            if at(mid) >= target:
                hi = mid
            else:
                lo = mid + 1
    best = lo
    if lo > 0 and abs(at(lo - 1) - target) <= abs(at(lo) - target):
        best = lo - 1
    return candidates[best], at(best), seen


# ------------------------------------------------------------------------------------------- settings
def schedule_flags(settings: argparse.Namespace, total: Optional[int] = None) -> List[str]:
    """The learning-rate schedule: inverse-sqrt (never anneals), or with ``--lr-schedule polynomial``
    fairseq's polynomial_decay, linear from the end of the warm-up to 0 at ``total`` updates (the run's budget)."""
    if settings.lr_schedule == "polynomial":
        total = total or (settings.max_update if isinstance(settings.max_update, int) else settings.warmup + 1)
        return ["--lr-scheduler", "polynomial_decay", "--warmup-updates", str(settings.warmup),
                "--end-learning-rate", "0", "--total-num-update", str(total)]
    return ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(settings.warmup), "--warmup-init-lr", "1e-07"]


def common_train_flags(settings: argparse.Namespace, src: str, tgt: str, total: Optional[int] = None) -> List[str]:
    """Everything but the model, the criterion, the seed, the budget, the device and the paths: identical for all
    (``total``: the updates the schedule anneals to, see :func:`schedule_flags`)."""
    return [
        "--task", "translation", "--source-lang", src, "--target-lang", tgt,
        "--dropout", str(settings.dropout),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", str(settings.lr), *schedule_flags(settings, total), "--weight-decay", "0.0001",
        "--max-tokens", str(settings.max_tokens),
        # validate + checkpoint every --eval-every updates and at the end only (not at epoch ends); every
        # interval checkpoint is kept: they are the resume points and the candidates of the evaluation
        "--save-interval-updates", str(settings.eval_every), "--validate-interval-updates", str(settings.eval_every),
        "--save-interval", "1000000", "--validate-interval", "1000000", "--no-epoch-checkpoints",
        # checkpoint selection on the NLL: the diversity criterion's loss includes its regulariser
        "--best-checkpoint-metric", "nll_loss",
        "--log-format", "json", "--log-interval", str(settings.log_interval),
        "--num-workers", "0", "--required-batch-size-multiple", "1", "--skip-invalid-size-inputs-valid-test",
    ]


DEFAULT_CRITERION = ("--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1")


def model_flags(method: Method, width: Width, matched: Optional[int] = None) -> List[str]:
    flags = ["--arch", method.arch, *width_flags(method, width), *method.flags]
    if method.match:
        if matched is None:
            raise ValueError(f"{method.name}: {method.match} not matched yet")
        flags += [method.match, str(matched)]
    return flags


def train_argv(method: Method, plan_entry: dict, settings, data_bin: str, recipe: dict, seed: int,
               total: Optional[int] = None, init: Optional[str] = None) -> List[str]:
    """fairseq-train's argv of one run, without the budget, the save dir and the device (see :func:`train_worker`);
    ``total``: the run's budget, which the polynomial schedule anneals to; ``init``: the checkpoint it starts from."""
    return [data_bin, "--user-dir", PLUGIN_DIR, *plan_entry["model_flags"],
            *(method.criterion or DEFAULT_CRITERION), *common_train_flags(settings, recipe["SRC"], recipe["TGT"], total),
            "--seed", str(seed), *(["--finetune-from-model", init] if init else []),
            *shlex.split(settings.train_args or "")]


# --------------------------------------------------------------------------------------------- data
def read_recipe_env(data_bin: str) -> dict:
    from fusion_fairseq.tools import corpus

    return corpus.read_recipe_env(data_bin)


def prepare_data(args) -> str:
    """The binarised data: ``--data-bin`` as given, else ``OUT/data/data-bin`` made (once) by
    ``fusion_fairseq.tools.corpus prepare multi30k --from RAW`` (joint BPE, joined dictionary)."""
    from fusion_fairseq.tools import corpus

    if args.data_bin:
        data_bin = os.path.abspath(args.data_bin)
        if not os.path.isfile(os.path.join(data_bin, "recipe.env")):
            raise ComparisonError(f"--data-bin: {data_bin}/recipe.env is missing (make the data with "
                                  "python -m fusion_fairseq.tools.corpus prepare multi30k, which records the references there)")
        return data_bin
    dest = os.path.join(args.out, "data")
    data_bin = os.path.join(dest, "data-bin")
    if os.path.isfile(os.path.join(data_bin, "recipe.env")):
        return data_bin
    if args.report_only:
        raise ComparisonError(f"--report-only: no prepared data in {data_bin}")
    if not args.raw:
        raise ComparisonError(f"--raw: not given, and {data_bin} holds no prepared data; give --raw DIR (the Multi30k "
                              "task-1 raw files train/val/test_*.de/.en) or --data-bin DIR")
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    argv = ["prepare", "multi30k", "--from", os.path.abspath(args.raw), "--dest", dest, "--src", "de", "--tgt", "en",
            "--test-set", "test_2016_flickr", "--bpe-merges", str(args.bpe_merges),
            "--workers", str(max(1, min(os.cpu_count() or 1, 8)))]
    log(f"preparing the data: python -m fusion_fairseq.tools.corpus {' '.join(shlex.quote(a) for a in argv)}")
    log_path = os.path.join(args.out, "logs", "prepare.log")
    with open(log_path, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            corpus.main(argv)
        except SystemExit as error:
            print(error.code, file=f)
            failed = error.code
        else:
            failed = None
    if failed is not None or not os.path.isfile(os.path.join(data_bin, "recipe.env")):
        with open(log_path, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise ComparisonError(f"preparing the data failed; log {log_path}:\n{tail}")
    return data_bin


def dictionary_size(data_bin: str, recipe: dict) -> int:
    src, tgt = recipe["SRC"], recipe["TGT"]
    paths = [os.path.join(data_bin, f"dict.{lang}.txt") for lang in (src, tgt)]
    texts = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    if texts[0] != texts[1]:
        raise ComparisonError(f"{data_bin}: the dictionaries of {src} and {tgt} differ; every method shares one joint "
                              "vocabulary (binarise with --joined-dictionary)")
    return 4 + sum(1 for line in texts[0].splitlines() if line.strip())


# --------------------------------------------------------------------------------------------- plan
def _build_counter(data_bin: str, settings, recipe: dict):
    """count(method, extra_flags) -> parameters of the model fairseq-train would build (args parsed by
    fairseq's own training parser, the joined dictionary of the data)."""
    from types import SimpleNamespace

    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fusion_fairseq  # noqa: F401  (registers the plugin)

    dictionary = Dictionary.load(os.path.join(data_bin, f"dict.{recipe['SRC']}.txt"))
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)

    def count(method: Method, flags: List[str]) -> int:
        argv = [data_bin, "--user-dir", PLUGIN_DIR, *flags, *(method.criterion or DEFAULT_CRITERION),
                *common_train_flags(settings, recipe["SRC"], recipe["TGT"]), *shlex.split(settings.train_args or "")]
        parser = options.get_training_parser()
        with contextlib.redirect_stderr(sys.stdout):
            try:
                args = options.parse_args_and_arch(parser, argv)
            except SystemExit as error:
                raise ComparisonError(f"{method.name}: fairseq rejects its flags {' '.join(flags)} (exit {error.code})")
        model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task)
        return sum(p.numel() for p in model.parameters())

    return count


def make_plan(methods: List[Method], width: Width, settings, data_bin: str, recipe: dict, out: str) -> dict:
    """Model flags and parameter counts of every method (matched sizes solved here); cached in
    ``OUT/plan.json`` (keyed by everything that changes them)."""
    vocab = dictionary_size(data_bin, recipe)
    key = json.dumps({"width": str(width), "vocab": vocab, "dropout": settings.dropout, "train_args": settings.train_args,
                      "baseline": _method_spec(METHODS["transformer"])}, sort_keys=True)
    path = os.path.join(out, "plan.json")
    cache = _read_json(path)  # a cache: unreadable means recompute
    entries = cache.get("entries", {}) if isinstance(cache, dict) else {}
    missing = [m for m in methods if m.name not in entries or entries[m.name].get("key") != _method_key(key, m)]
    if missing:
        log(f"computing model sizes ({', '.join(m.name for m in missing)}) ...")
        count = _build_counter(data_bin, settings, recipe)
        baseline = METHODS["transformer"]
        target = count(baseline, model_flags(baseline, width))
        for method in missing:
            entry = {"key": _method_key(key, method), "vocab": vocab}
            if method.match:
                value, params, tried = match_parameter(
                    lambda v, m=method: count(m, model_flags(m, width, v)), match_candidates(method, width), target)
                entry.update(matched_flag=method.match, matched_value=value, matched_to=target,
                             match_tried={str(k): v for k, v in sorted(tried.items())})
                log(f"  {method.name}: {method.match} {value} -> {params:,} parameters "
                    f"(transformer: {target:,}; tried {len(tried)} values)")
            else:
                params = count(method, model_flags(method, width))
            entry.update(model_flags=model_flags(method, width, entry.get("matched_value")), params=params)
            entries[method.name] = entry
        os.makedirs(out, exist_ok=True)
        _write_json(path, {"entries": entries})
    return {m.name: entries[m.name] for m in methods}


def _method_spec(method: Method) -> list:
    return [method.name, method.arch, method.style, list(method.flags), list(method.criterion), method.match]


def _method_key(key: str, method: Method) -> str:
    return hashlib.sha1((key + json.dumps(_method_spec(method))).encode()).hexdigest()[:16]


def _write_json(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


#: what the report reads of a done.json (see :func:`evaluate_worker`, which writes it, and :func:`collect_run`)
DONE_KEYS = ("sacrebleu", "tokenized_bleu", "params", "updates", "train_seconds", "generate_seconds",
             "updates_per_second", "devices", "finished", "sacrebleu_signature", "scores")


def finished_run(rdir: str) -> Optional[dict]:
    """The run's ``done.json`` once it is evaluated, else None. One that is unreadable or of another
    shape (truncated, written by hand) stops the runner in one line, wherever it is read: its scores
    cannot be trusted, and the checkpoints it scored are gone."""
    path = os.path.join(rdir, "done.json")
    if not os.path.lexists(path):
        return None
    done = _read_json(path)
    if not isinstance(done, dict) or any(key not in done for key in DONE_KEYS):
        raise ComparisonError(f"{path} is unreadable or not a record of this runner (truncated?): move it away "
                              "and remove the run's checkpoints to train and evaluate the run again")
    return done


# ---------------------------------------------------------------------------------------------- budget
#: ``--max-update auto``: the Transformer of the first seed trains in chunks of PLATEAU_WINDOW updates
#: until its best validation NLL (fairseq's ``valid_nll_loss``, bits per target token) improves by less
#: than PLATEAU_DELTA over PLATEAU_WINDOW updates; that update, rounded up to a multiple of BUDGET_STEP,
#: is the budget of every run. The other runs train up to ``--provisional-update`` meanwhile (the
#: learning-rate schedule does not depend on the budget, so nothing they did is redone).
PLATEAU_DELTA = 0.01
PLATEAU_WINDOW = 500
BUDGET_STEP = 500
BUDGET_RULE = (f"the first validation at which the first seed's Transformer's best validation NLL (bits) is less "
               f"than {PLATEAU_DELTA} below its best {PLATEAU_WINDOW} updates earlier, rounded up to a multiple "
               f"of {BUDGET_STEP}")


def plateau_update(curve: Dict[int, float], delta: float = PLATEAU_DELTA, window: int = PLATEAU_WINDOW) -> Optional[int]:
    """The first validated update ``u`` whose best NLL so far is less than ``delta`` below the best
    NLL up to ``u - window``; None while the curve still improves. Reading of "improves by less than
    0.01 over 500 updates": best-so-far values, so one noisy validation neither ends nor prolongs it."""
    bests: List[Tuple[int, float]] = []
    for update, nll in sorted(curve.items()):
        bests.append((update, min(nll, bests[-1][1]) if bests else nll))
        earlier = [best for u, best in bests if u <= update - window]
        if earlier and earlier[-1] - bests[-1][1] < delta:
            return update
    return None


def calibrated_budget(plateau: int) -> int:
    return BUDGET_STEP * math.ceil(plateau / BUDGET_STEP)


#: With a fixed budget (the 6+6 comparison), the check after training that it was enough: for every seed
#: of the Transformer, the validation NLL (bits) changes by less than CHECK_DELTA over each of the last
#: CHECK_WINDOWS windows of CHECK_WINDOW updates before the budget. The report says whether it held.
CHECK_DELTA = 0.02
CHECK_WINDOW = 500
CHECK_WINDOWS = 3
CHECK_RULE = (f"for every seed of the Transformer, the validation NLL changes by less than {CHECK_DELTA} bits over "
              f"each of the last {CHECK_WINDOWS} windows of {CHECK_WINDOW} updates before the budget")


def budget_check(baseline_row: Optional[dict], budget: Optional[int]) -> Optional[dict]:
    """:data:`CHECK_RULE` on the Transformer's runs that reached ``budget``: per seed the NLL at the window
    ends and the changes; "passed" when every seed's changes are below CHECK_DELTA (None: no run reached it)."""
    if baseline_row is None or budget is None:
        return None
    ends = [budget - k * CHECK_WINDOW for k in range(CHECK_WINDOWS, -1, -1)]
    seeds = {}
    for run in baseline_row["runs"]:
        curve = run_curve(run)
        if budget not in curve:
            continue
        if any(u not in curve for u in ends):
            seeds[str(run["seed"])] = {"error": f"no validation at update(s) {', '.join(str(u) for u in ends if u not in curve)}"}
            continue
        changes = [round(curve[b] - curve[a], 4) for a, b in zip(ends, ends[1:])]
        seeds[str(run["seed"])] = {"nll": [curve[u] for u in ends], "changes": changes,
                                   "passed": all(abs(c) < CHECK_DELTA for c in changes)}
    if not seeds:
        return None
    return {"rule": CHECK_RULE, "updates": ends, "seeds": seeds,
            "passed": all(found.get("passed", False) for found in seeds.values())}


def best_within(curve: Dict[int, float], budget: int) -> Tuple[int, float]:
    """(update, NLL) of the best validation at or before ``budget``."""
    update = min((u for u in curve if u <= budget), key=lambda u: (curve[u], u))
    return update, curve[update]


# ----------------------------------------------------------------------------------------- composition
#: The fusion_transformer rows that compose into the eighth configuration, and its rule, fixed before
#: any run of the comparison has been scored.
#: Hard SurfaceFusion is not one: its validation "NLL" is its un-normalised Eq. 6 score, not a likelihood,
#: so it cannot be compared with the others' NLL that the rule ranks by.
COMPONENTS = ("mlrf", "deeprep", "fgla")
COMPOSITION = "composition"
COMPOSITION_RULE = (
    "the components (" + ", ".join(COMPONENTS) + ") whose first-seed best validation NLL within the budget is "
    "below the Transformer's, best first, each added when fairseq builds it together with those already chosen; "
    "when fewer than two qualify, the two best that build together")


def choose_components(best_nll: Dict[str, float], baseline_nll: float, builds) -> List[str]:
    """:data:`COMPOSITION_RULE`; ``builds(names)`` tells whether a composition of ``names`` builds."""
    ranked = sorted(best_nll, key=lambda name: (best_nll[name], name))

    def greedy(candidates):
        chosen: List[str] = []
        for name in candidates:
            if builds(chosen + [name]):
                chosen.append(name)
        return chosen

    chosen = greedy([name for name in ranked if best_nll[name] < baseline_nll])
    return chosen if len(chosen) >= 2 else greedy(ranked)[:2]


def composed_method(components: Sequence[str]) -> Method:
    parts = [METHODS[name] for name in components]
    return Method(
        COMPOSITION, "Composition: " + " + ".join(name for name in components), "fusion_transformer features composed",
        "fusion_transformer", tuple(flag for part in parts for flag in part.flags),
        criterion=next((part.criterion for part in parts if part.criterion), ()),
        note=f"chosen by rule: {COMPOSITION_RULE}")


COMPOSITION_PLACEHOLDER = Method(COMPOSITION, "Composition (chosen after the first seed)", "fusion_transformer features "
                                 "composed", "fusion_transformer", note=f"chosen by rule: {COMPOSITION_RULE}")


# ----------------------------------------------------------------------------------------- checkpoints
INTERVAL_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt")


def interval_checkpoints(save_dir: str) -> Dict[int, str]:
    """{update: path} of fairseq's interval checkpoints, which it writes atomically (a temporary
    file renamed), so one that exists is complete."""
    found = {}
    if os.path.isdir(save_dir):
        for name in os.listdir(save_dir):
            m = INTERVAL_CHECKPOINT.fullmatch(name)
            if m:
                found[int(m.group(1))] = os.path.join(save_dir, name)
    return dict(sorted(found.items()))


def saved_updates(save_dir: str) -> int:
    return max(interval_checkpoints(save_dir), default=0)


def checkpoint_updates(path: str) -> Optional[int]:
    """The update count stored in checkpoint ``path``; None when it cannot be read (truncated, empty)."""
    import torch

    import fusion_fairseq  # noqa: F401  (allow-lists the configuration types of fairseq checkpoints)

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # noqa: BLE001 - any unreadable file: truncated, not a zip, not a checkpoint
        return None


def resume_from_newest_intact(save_dir: str) -> None:
    """Make ``checkpoint_last.pt``, which fairseq resumes from, the newest checkpoint that reads.

    fairseq writes ``checkpoint_last.pt`` by copying the interval checkpoint (not atomically), so a
    run killed during the copy leaves it truncated and every later resume fails; killed between the
    two writes, it is older than the interval checkpoint. Either way the newest intact interval
    checkpoint replaces it (atomically); an unreadable file is kept beside it, renamed, and said."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    last_updates = checkpoint_updates(last) if os.path.exists(last) else None
    for update, path in reversed(interval_checkpoints(save_dir).items()):
        if last_updates is not None and last_updates >= update:
            return
        if checkpoint_updates(path) != update:
            print(f"[compare] {path} is unreadable; looking for an older checkpoint", flush=True)
            continue
        _set_aside_unreadable(last, last_updates)
        shutil.copyfile(path, last + ".tmp")
        os.replace(last + ".tmp", last)
        print(f"[compare] resuming from {os.path.basename(path)} (update {update}): checkpoint_last.pt was "
              + ("older" if last_updates is not None else "missing or unreadable"), flush=True)
        return
    _set_aside_unreadable(last, last_updates)


def _set_aside_unreadable(last: str, last_updates: Optional[int]) -> None:
    if last_updates is None and os.path.exists(last):
        aside = f"{last}.unreadable-{int(time.time())}"
        os.replace(last, aside)
        print(f"[compare] {last} is unreadable (kept as {aside})", flush=True)


def installed_packages() -> List[str]:
    """name==version of every installed distribution, sorted: what a run ran with."""
    import importlib.metadata

    return sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                   if d.metadata["Name"]}, key=str.lower)


def code_commit() -> Optional[str]:
    """The commit of the code that runs (``+modified`` when tracked files differ from it); None outside git."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        return git("rev-parse", "HEAD") + ("+modified" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


# ---------------------------------------------------------------------------------------------- runs
def run_dir(out: str, method: str, seed: int) -> str:
    return os.path.join(out, "runs", method, f"seed{seed}")


def device_flags(device: str) -> List[str]:
    return ["--cpu"] if device == "cpu" else []


def run_config(method: Method, plan_entry: dict, settings, data_bin: str, recipe: dict, seed: int, rdir: str,
               total: Optional[int] = None, init: Optional[str] = None) -> dict:
    argv = train_argv(method, plan_entry, settings, data_bin, recipe, seed, total, init)
    return {
        "method": method.name, "seed": seed, "arch": method.arch, "params": plan_entry["params"],
        "train_argv": argv,  # the comparable part: the same in every session of this run
        "save_dir": os.path.join(rdir, "checkpoints"),
        "data_bin": data_bin, "beam": settings.beam, "gen_args": settings.gen_args, "recipe": recipe,
        "device": settings.device, "device_flags": device_flags(settings.device),
        "keep_checkpoints": settings.keep_checkpoints,
    }


class RunLock:
    """An exclusive, non-blocking flock on RUN/.lock (released when the process ends)."""

    def __init__(self, rdir: str):
        os.makedirs(rdir, exist_ok=True)
        self.file = open(os.path.join(rdir, ".lock"), "a+")

    def acquire(self) -> bool:
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def release(self):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def run_is_locked(rdir: str) -> bool:
    if not os.path.isfile(os.path.join(rdir, ".lock")):
        return False
    lock = RunLock(rdir)
    if lock.acquire():
        lock.release()
        return False
    lock.file.close()
    return True


def check_config(rdir: str, config: dict) -> None:
    """Refuse a run directory started with other training flags (the plugin's location aside: a pinned
    checkout of the same code may resume or evaluate it)."""
    stored = _read_json(os.path.join(rdir, "config.json"))
    if stored is None:
        return
    old, new = _flag_values(stored.get("train_argv") or []), _flag_values(config["train_argv"])
    diff = [f"{flag} {' '.join(old.get(flag, ['(absent)']))} -> {' '.join(new.get(flag, ['(absent)']))}"
            for flag in sorted(set(old) | set(new)) if flag != "--user-dir" and old.get(flag) != new.get(flag)]
    if diff:
        raise ComparisonError(
            f"{rdir} was started with other settings ({'; '.join(diff)[:600]}); "
            "use another --out, the original settings, or delete that run directory")


def _flag_values(argv: Sequence[str]) -> Dict[str, List[str]]:
    """{flag: the values after it} of an argv (positional arguments under "")."""
    values: Dict[str, List[str]] = {"": []}
    flag = ""
    for item in argv:
        if item.startswith("--"):
            flag = item
            values.setdefault(flag, [])
        else:
            values[flag].append(item)
    return values


def run_step(name: str, rdir: str, step: str, updates: int, env: dict) -> str:
    """One step of a run in a worker process: ``train`` up to ``updates``, or ``evaluate`` the run at
    that budget. Returns "done", "running" (another process holds the run) or "failed"."""
    lock = RunLock(rdir)
    if not lock.acquire():
        log(f"{name}: running in another process, skipped")
        return "running"
    try:
        log(f"{name}: {'training up to update' if step == 'train' else 'evaluating at update'} {updates} "
            f"-> {rdir}/run.log")
        started = time.time()
        with open(os.path.join(rdir, "run.log"), "a", encoding="utf-8") as log_file:
            log_file.write(f"\n==== {step} {datetime.now(timezone.utc).isoformat(timespec='seconds')} pid {os.getpid()}\n")
            log_file.flush()
            rc = subprocess.call([sys.executable, "-m", "fusion_fairseq.tools.comparison", f"_{step}", rdir, str(updates)],
                                 stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                 cwd=rdir)  # -m imports from the working directory first: never another checkout
        if rc != 0:
            log(f"{name}: {step} FAILED (exit {rc}) after {time.time() - started:.0f}s; see {rdir}/run.log")
            return "failed"
        log(f"{name}: {step} finished in {time.time() - started:.0f}s")
        return "done"
    finally:
        lock.release()


# -------------------------------------------------------------------------------------------- worker
def device_description(device: str, threads: Optional[int] = None) -> str:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return f"{device_name(device)} (CUDA)"
    return f"CPU {cpu_name()}, {os.cpu_count()} cores, {threads or torch.get_num_threads()} torch threads"


def _load_recipe_tool():
    """The data pipeline, whose ``main`` runs its hyps / detok / bleu steps."""
    from fusion_fairseq.tools import corpus

    return corpus


def last_logged_update(log_path: str) -> int:
    last = 0
    if os.path.isfile(log_path):
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r'"(?:valid_|train_)?num_updates": "?(\d+)', line)
                if m:
                    last = int(m.group(1))
    return last


def last_log_time(log_path: str) -> Optional[float]:
    """Time of the last timestamped (fairseq) line of the log, local time as fairseq writes it."""
    last = None
    if os.path.isfile(log_path):
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line[:4].isdigit() and line[19:22] == " | ":
                    last = line[:19]
    if last is None:
        return None
    try:
        return time.mktime(time.strptime(last, "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def _fairseq_logging() -> None:
    import logging

    # fairseq-train's own log format (the learning curves are read from its "| valid |" json lines);
    # force: importing the plugin may already have configured the root logger
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=logging.INFO, stream=sys.stdout, force=True)


def close_interrupted_sessions(sessions: List[dict], log_path: str) -> None:
    """A session killed before it could record its end ends at the last fairseq log line."""
    for session in sessions:
        if session.get("end") is None:
            session["end"] = max(session["start"], last_log_time(log_path) or session["start"])
            session["to_update"] = last_logged_update(log_path)
            session["interrupted"] = True


def train_worker(rdir: str, target: int) -> None:
    """fairseq-train's own code, in this process, resuming the run up to update ``target``."""
    _fairseq_logging()
    config = _read_json(os.path.join(rdir, "config.json"))
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    import fairseq_cli.train as fairseq_train

    sessions_path, log_path = os.path.join(rdir, "sessions.json"), os.path.join(rdir, "run.log")
    sessions = _read_json(sessions_path) or []
    close_interrupted_sessions(sessions, log_path)
    resume_from_newest_intact(config["save_dir"])
    session = {"start": time.time(), "end": None, "device": device_description(config["device"]),
               "from_update": saved_updates(config["save_dir"]), "target": target, "commit": code_commit(),
               "python": sys.version.split()[0], "packages": installed_packages()}
    sessions.append(session)
    _write_json(sessions_path, sessions)
    argv = [*config["train_argv"], "--max-update", str(target), "--save-dir", config["save_dir"], *config["device_flags"]]
    print("$ fairseq-train " + " ".join(shlex.quote(a) for a in argv), flush=True)
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    fairseq_train.distributed_utils.call_main(convert_namespace_to_omegaconf(args), fairseq_train.main)
    session["end"], session["to_update"] = time.time(), saved_updates(config["save_dir"])
    _write_json(sessions_path, sessions)


def evaluate_worker(rdir: str, budget: int) -> None:
    """Translate every test set with two models of the run -- the checkpoint of the best validation
    NLL within ``budget`` and the average of the last :data:`AVERAGED` checkpoints up to ``budget``
    -- and score them as ``scripts/evaluate.sh`` does; writes ``done.json`` last."""
    _fairseq_logging()
    config = _read_json(os.path.join(rdir, "config.json"))
    plan = _read_json(os.path.join(rdir, "evaluation.json"))
    import torch

    log_path = os.path.join(rdir, "run.log")
    best_update, best_nll = best_within(learning_curve(log_path), budget)
    checkpoints = interval_checkpoints(config["save_dir"])
    eval_dir = os.path.join(rdir, f"eval-beam{config['beam']}")
    os.makedirs(eval_dir, exist_ok=True)
    interval = int(_flag_values(config["train_argv"])["--save-interval-updates"][-1])
    average = final_average(config["save_dir"], budget, interval)
    models = {"best": checkpoints.get(best_update), "average": average}
    models = {kind: models[kind] for kind in plan.get("kinds", CHECKPOINT_KINDS)}
    started = time.time()
    scores = {kind: {name: translate_and_score(config, path, test_set, os.path.join(eval_dir, kind, name))
                     for name, test_set in plan["test_sets"].items()}
              for kind, path in models.items()}
    lowercase = config["recipe"].get("LOWERCASE", "0") == "1"
    for per_set in scores.values():
        per_set["all"] = concatenated_bleu(per_set, lowercase)
    headline = next(iter(scores.values()))[next(iter(plan["test_sets"]))]
    done = {
        "method": config["method"], "seed": config["seed"], "arch": config["arch"],
        "sacrebleu": headline["sacrebleu"], "tokenized_bleu": headline["tokenized_bleu"],
        "sacrebleu_signature": headline["sacrebleu_signature"], "scores": scores,
        "params": logged_parameters(log_path) or config["params"], "updates": budget,
        "best_update": best_update, "best_valid_nll": best_nll,
        "averaged_updates": _read_json(average + ".json")["updates"],
        **training_record(_read_json(os.path.join(rdir, "sessions.json")) or [], log_path),
        "generate_seconds": round(time.time() - started, 1), "evaluated_by": code_commit(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "packages": installed_packages(),
    }
    _write_json(os.path.join(rdir, "done.json"), done)  # the marker, before anything is removed
    if not config.get("keep_checkpoints"):  # keep the scored models; the rest only served resuming
        for path in {*checkpoints.values(), os.path.join(config["save_dir"], "checkpoint_last.pt"),
                     os.path.join(config["save_dir"], "checkpoint_best.pt")} - set(models.values()):
            if os.path.exists(path):
                os.remove(path)


def training_record(sessions: List[dict], log_path: str) -> dict:
    """Training time, speed, devices and code commits of a run's sessions (one killed after its last
    checkpoint ends at its last log line)."""
    close_interrupted_sessions(sessions, log_path)
    seconds = sum(s["end"] - s["start"] for s in sessions)
    updates = sum((s.get("to_update") or 0) - s.get("from_update", 0) for s in sessions)
    return {"train_seconds": round(seconds, 1), "updates_per_second": round(updates / max(1e-9, seconds), 3),
            "devices": sorted({s["device"] for s in sessions}),
            "trained_by": sorted({s.get("commit") or "unknown" for s in sessions})}


def final_average(save_dir: str, budget: int, interval: int) -> str:
    """The average of the last :data:`AVERAGED` checkpoints up to ``budget`` (:func:`averaged_updates`), made
    once into ``save_dir`` (with a note of its updates beside it) and kept: it is scored, and the runs that
    start from a trained model start from it."""
    from fusion_fairseq.tools.averaging import average_checkpoints

    path = os.path.join(save_dir, f"average-last{AVERAGED}-to-{budget}.pt")
    if not (os.path.isfile(path) and os.path.isfile(path + ".json")):
        checkpoints = interval_checkpoints(save_dir)
        updates = averaged_updates(checkpoints, budget, interval)
        average_checkpoints([checkpoints[u] for u in updates], path)
        _write_json(path + ".json", {"updates": updates})
    return path


def averaged_updates(checkpoints: Dict[int, str], budget: int, interval: int) -> List[int]:
    """The updates of the last :data:`AVERAGED` checkpoints every ``interval`` updates up to ``budget``
    (fewer only when the budget holds fewer intervals); an error when one of them is missing."""
    wanted = list(range(budget - budget % interval, 0, -interval))[:AVERAGED][::-1]
    missing = [u for u in wanted if u not in checkpoints]
    if missing:
        raise ComparisonError(f"cannot average the last {AVERAGED} checkpoints up to update {budget}: "
                              f"no checkpoint of update(s) {', '.join(map(str, missing))}")
    return wanted


def logged_parameters(log_path: str) -> Optional[int]:
    found = None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"num\. (?:shared )?model params: ([\d,]+)", line)
            if m:
                found = int(m.group(1).replace(",", ""))
    return found


def translate_and_score(config: dict, checkpoint: str, test_set: dict, out_dir: str) -> dict:
    """fairseq-generate (beam, --remove-bpe) on one binarised test set, then detokenised sacreBLEU and
    tokenised BLEU as scripts/evaluate.sh computes them. Returns the scores (and the hypothesis file)."""
    from fairseq import options
    import fairseq_cli.generate as fairseq_generate

    recipe = config["recipe"]
    os.makedirs(out_dir, exist_ok=True)
    gen_argv = [test_set["data"], "--path", checkpoint, "--gen-subset", "test",
                "--source-lang", recipe["SRC"], "--target-lang", recipe["TGT"], "--beam", str(config["beam"]),
                "--lenpen", "1.0", "--remove-bpe", "@@ ", "--required-batch-size-multiple", "1", "--batch-size", "128",
                "--user-dir", PLUGIN_DIR, "--results-path", out_dir, *config["device_flags"],
                *shlex.split(config.get("gen_args") or "")]
    print("$ fairseq-generate " + " ".join(shlex.quote(a) for a in gen_argv), flush=True)
    fairseq_generate.main(options.parse_args_and_arch(options.get_generation_parser(), gen_argv))
    tool = _load_recipe_tool()
    hyp_tok, hyp_detok = os.path.join(out_dir, "hyp.tok"), os.path.join(out_dir, "hyp.detok")
    with open(test_set["raw_ref"], encoding="utf-8") as f:
        n_ref = sum(1 for _ in f)
    tool.main(["hyps", os.path.join(out_dir, "generate-test.txt"), "--hyp", hyp_tok,
               "--ref", os.path.join(out_dir, "ref.fairseq.tok"), "--expect", str(n_ref)])
    tool.main(["detok", "--lang", recipe["TGT"], "-i", hyp_tok, "-o", hyp_detok])
    bleu_argv = ["bleu", "--hyp-detok", hyp_detok, "--ref", test_set["raw_ref"], "--hyp-tok", hyp_tok,
                 "--tok-ref", test_set["tok_ref"], "--json", os.path.join(out_dir, "scores.json")]
    if recipe.get("LOWERCASE", "0") == "1":
        bleu_argv.append("--lowercase")
    if recipe.get("COMPOUND_SPLIT", "0") == "1":
        bleu_argv.append("--compound-split")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        tool.main(bleu_argv)
    print(printed.getvalue(), flush=True)
    scores = _read_json(os.path.join(out_dir, "scores.json"))
    keys = ("sacrebleu", "tokenized_bleu", "sacrebleu_signature", "sentences")
    return {**{key: scores[key] for key in keys}, "hyp_detok": hyp_detok, "raw_ref": test_set["raw_ref"]}


# ------------------------------------------------------------------------------------------- test sets
#: Multi30k's four English test sets; the first is the one prepare-multi30k.sh binarises as ``test``.
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
AVERAGED = 5  # checkpoints averaged, as the Transformer setups the papers follow do


def prepare_test_sets(data_bin: str, recipe: dict, raw: Optional[str], out: str) -> Dict[str, dict]:
    """Every test set of :data:`TEST_SETS` tokenised, BPE'd with the data's codes and binarised with its
    dictionaries, exactly as ``corpus prepare multi30k`` prepares its one test set, under
    ``OUT/test-sets/NAME``; made once. Returns {name: {"data", "raw_ref", "tok_ref"}}."""
    codes = os.path.join(os.path.dirname(data_bin), "code")
    src, tgt = recipe["SRC"], recipe["TGT"]
    sets = {}
    for name in TEST_SETS:
        where = os.path.join(out, "test-sets", name)
        sets[name] = {"data": os.path.join(where, "bin"), "raw_ref": os.path.join(where, f"raw.{tgt}"),
                      "tok_ref": os.path.join(where, f"tok.{tgt}")}
        if os.path.isfile(os.path.join(where, "bin", "done")):
            continue
        raw_dir = raw
        needed = [os.path.join(raw_dir or "", f"{name}.{lang}") for lang in (src, tgt)] + [codes]
        missing = [path for path in needed if not os.path.isfile(path)]
        if missing:
            raise ComparisonError(f"cannot prepare the test set {name}: missing {', '.join(missing)} (give --raw DIR "
                                  "with the Multi30k test files, and data made by corpus prepare multi30k)")
        log(f"preparing the test set {name}")
        _binarise_test_set(os.path.join(raw_dir, name), where, codes, data_bin, recipe)
    return sets


def _binarise_test_set(raw_prefix: str, where: str, codes: str, data_bin: str, recipe: dict) -> None:
    from fusion_fairseq.tools import corpus

    src, tgt = recipe["SRC"], recipe["TGT"]
    for lang in (src, tgt):
        raw = corpus.read_lines(f"{raw_prefix}.{lang}")
        tokeniser = (lang, corpus.CORPORA["multi30k"].steps, recipe.get("LOWERCASE", "0") == "1")
        tok = corpus.parallel_map(corpus.Tokeniser, tokeniser, raw, 1)
        for name, lines in (("raw", raw), ("tok", tok), ("test", corpus.parallel_map(corpus.Segmenter, (codes,), tok, 1))):
            corpus.write_lines(os.path.join(where, f"{name}.{lang}"), lines)
    corpus.binarise(where, os.path.join(where, "bin"), src, tgt, splits=("test",), dictionaries=[
        os.path.join(data_bin, f"dict.{lang}.txt") for lang in (src, tgt)])
    with open(os.path.join(where, "bin", "done"), "w", encoding="utf-8") as f:
        f.write("\n")


# ------------------------------------------------------------------------------------ paired bootstrap
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default
PAIRED_FORMAT = 2  # part of the paired.json cache key: raised when paired_bootstrap's result gains a field


def paired_bootstrap(references: List[str], baseline: List[str], system: List[str], lowercase: bool) -> dict:
    """sacreBLEU's paired bootstrap resampling (``--paired-bs``, 1000 samples, its seed): the system's
    and the baseline's BLEU, the p-value sacrebleu reports and the 95% confidence interval of the
    difference system - baseline over the same resampled test sets."""
    import numpy as np
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    bleu = BLEU(lowercase=lowercase)
    test = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": bleu}, [references], test_type="bs",
                      n_samples=BOOTSTRAP_SAMPLES)
    _, results = test()
    stats = [sentence_statistics(hyps, references, lowercase) for hyps in (baseline, system)]
    indices = np.random.default_rng(BOOTSTRAP_SEED).choice(len(references), size=(BOOTSTRAP_SAMPLES, len(references)))
    differences = np.array([corpus_bleu(stats[1][i].sum(0)) - corpus_bleu(stats[0][i].sum(0)) for i in indices])
    low, high = np.percentile(differences, [2.5, 97.5])
    base, sys_ = results["BLEU"]
    return {"baseline": round(base.score, 2), "system": round(sys_.score, 2),
            "difference": round(sys_.score - base.score, 2), "ci95": [round(float(low), 2), round(float(high), 2)],
            "p_value": sys_.p_value, "samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED,
            "signature": str(bleu.get_signature())}


def sentence_statistics(hypotheses: List[str], references: List[str], lowercase: bool):
    """Per sentence, sacreBLEU's sufficient statistics (n-gram matches and totals for n = 1..4, the
    hypothesis' and the reference's length) from its public ``BLEU.sentence_score``: summed over any
    set of sentences they give that set's corpus BLEU (:func:`corpus_bleu`)."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=lowercase, effective_order=True)  # only its n-gram counts are read: the same either way
    rows = []
    for hypothesis, reference in zip(hypotheses, references):
        score = bleu.sentence_score(hypothesis, [reference])
        rows.append([*score.counts, *score.totals, score.sys_len, score.ref_len])
    return np.array(rows, dtype=np.int64)


def corpus_bleu(statistics_sum) -> float:
    """Corpus BLEU (sacreBLEU's default exponential smoothing) from summed :func:`sentence_statistics`."""
    from sacrebleu.metrics import BLEU

    c = [int(x) for x in statistics_sum]
    return BLEU.compute_bleu(correct=c[0:4], total=c[4:8], sys_len=c[8], ref_len=c[9], smooth_method="exp").score


#: The verdict of the 6+6 comparison, fixed before any of its test scores existed: a method's Δ is its
#: mean corpus BLEU over its seeds minus its baseline's, on the four test sets together (the average of
#: the last checkpoints); its 95% interval comes from VERDICT_SAMPLES bootstrap replicates, each drawing
#: the seeds of the method and of the baseline with replacement (so seed-to-seed variance counts) and
#: then one set of sentences with replacement, shared by every run (test-set sampling). Better: the
#: interval is above 0; worse: below 0; otherwise undecided.
VERDICT_SAMPLES = 1000
VERDICT_SEED = 12345
VERDICT_RULE = ("Δ: mean sacreBLEU over the method's seeds minus its baseline's, on the four test sets together; "
                f"95% interval of {VERDICT_SAMPLES} bootstrap replicates, each resampling the seeds of both (with "
                "replacement), then the test sentences (one draw shared by every run); better: the interval is above "
                "0, worse: below 0, otherwise undecided")
THIRD_SEED_RULE = ("once every run of the first seeds is scored: one more seed for the Transformer, for every "
                   "configuration whose verdict is undecided, and for its baseline")


def seed_sentence_bootstrap(system: List, baseline: List, samples: int = VERDICT_SAMPLES, seed: int = VERDICT_SEED) -> dict:
    """:data:`VERDICT_RULE` for the :func:`sentence_statistics` of a method's runs (one per seed) and its baseline's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(system[0])

    def mean_bleu(runs, weights=None):
        return statistics.fmean(corpus_bleu(run.sum(0) if weights is None else weights @ run) for run in runs)

    differences = []
    for _ in range(samples):
        picked = [[runs[i] for i in rng.integers(len(runs), size=len(runs))] for runs in (system, baseline)]
        weights = np.bincount(rng.integers(n, size=n), minlength=n)
        differences.append(mean_bleu(picked[0], weights) - mean_bleu(picked[1], weights))
    low, high = (round(float(x), 2) for x in np.percentile(differences, [2.5, 97.5]))
    return {"difference": round(mean_bleu(system) - mean_bleu(baseline), 2), "ci95": [low, high],
            "seeds": [len(system), len(baseline)], "samples": samples,
            "verdict": "better" if low > 0 else "worse" if high < 0 else "undecided"}


def run_statistics(out: str, method: str, seed: int, kind: str, lowercase: bool):
    """:func:`sentence_statistics` of a scored run on the four test sets together, cached in the run directory."""
    import numpy as np

    rdir = run_dir(out, method, seed)
    done = finished_run(rdir)
    path = os.path.join(rdir, f"sentence-statistics-{kind}.json")
    cached = _read_json(path)
    if cached and cached.get("key") == done["finished"]:
        return np.array(cached["statistics"], dtype=np.int64)
    scores = done["scores"][kind]
    found = sentence_statistics(read_concatenated(scores, "hyp_detok"), read_concatenated(scores, "raw_ref"), lowercase)
    _write_json(path, {"key": done["finished"], "statistics": found.tolist()})
    return found


def concatenated_bleu(scores: Dict[str, dict], lowercase: bool) -> dict:
    """Detokenised sacreBLEU of the test sets together (one corpus), and the output's length over the
    reference's, tokenised as sacreBLEU does: its brevity penalty sees only short output, while long
    output (a model looping until the length limit) costs precision."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=lowercase)
    score = bleu.corpus_score(read_concatenated(scores, "hyp_detok"), [read_concatenated(scores, "raw_ref")])
    return {"sacrebleu": round(score.score, 2), "sacrebleu_signature": str(bleu.get_signature()),
            "sentences": sum(scores[name]["sentences"] for name in TEST_SETS),
            "length_ratio": round(score.sys_len / score.ref_len, 3)}


def read_concatenated(scores: Dict[str, dict], key: str) -> List[str]:
    lines: List[str] = []
    for name in TEST_SETS:
        with open(scores[name][key], encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in f]
    return lines


# ------------------------------------------------------------------------------------------- report
VALID_LINE = re.compile(r"\|\s*valid\s*\|\s*(\{.*\})\s*$")


def learning_curve(log_path: str) -> Dict[int, float]:
    """{update: validation NLL (base 2)} from fairseq's json log lines (a resumed run's repeated
    updates: the latest value)."""
    curve: Dict[int, float] = {}
    if not os.path.isfile(log_path):
        return curve
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = VALID_LINE.search(line)
            if not m:
                continue
            try:
                stats = json.loads(m.group(1))
                curve[int(float(stats["valid_num_updates"]))] = float(stats["valid_nll_loss"])
            except (ValueError, KeyError):
                continue
    return dict(sorted(curve.items()))


def test_scores(done: dict) -> dict:
    """{"test": {kind: {test set or "all": sacreBLEU}}, "test_tokenized": ...} of a finished run."""
    scores = done.get("scores") or {}
    return {"test": {kind: {name: s["sacrebleu"] for name, s in sets.items()} for kind, sets in scores.items()},
            "test_tokenized": {kind: {name: s["tokenized_bleu"] for name, s in sets.items() if "tokenized_bleu" in s}
                               for kind, sets in scores.items()}}


def paired_with_baseline(out: str, method: str, seed: int, lowercase: bool, baseline_method: str = "transformer"
                         ) -> Optional[dict]:
    """{kind: paired bootstrap against the baseline (the Transformer) of the same seed} on the concatenated test
    sets, once both runs are evaluated (cached in the run's paired.json); None for the Transformer itself."""
    rdir, base_dir = run_dir(out, method, seed), run_dir(out, baseline_method, seed)
    system, baseline = (finished_run(d) for d in (rdir, base_dir))
    if method == "transformer" or not (system and baseline and system.get("scores") and baseline.get("scores")):
        return None
    path = os.path.join(rdir, "paired.json")
    key = [system["finished"], baseline["finished"], PAIRED_FORMAT]
    cached = _read_json(path)
    if cached and cached.get("key") == key:
        return cached["paired"]
    paired = {kind: paired_bootstrap(read_concatenated(baseline["scores"][kind], "raw_ref"),
                                     read_concatenated(baseline["scores"][kind], "hyp_detok"),
                                     read_concatenated(system["scores"][kind], "hyp_detok"), lowercase)
              for kind in system["scores"]}
    _write_json(path, {"key": key, "paired": paired})
    return paired


def summarise(values: Sequence[float]) -> Optional[dict]:
    values = [float(v) for v in values]
    if not values:
        return None
    return {"n": len(values), "mean": round(statistics.fmean(values), 2),
            "std": round(statistics.stdev(values), 2) if len(values) > 1 else None,
            "min": min(values), "max": max(values)}


def mean_curve(curves: List[Dict[int, float]]) -> Dict[int, float]:
    """The mean of the curves at the updates every one of them reached: the same seeds at every point,
    so that no step appears where a shorter curve ends."""
    if not curves:
        return {}
    common = sorted(set.intersection(*(set(c) for c in curves)))
    return {u: statistics.fmean(c[u] for c in curves) for u in common}


def updates_to_reach(curve: Dict[int, float], target: float) -> Optional[int]:
    """The first validated update whose NLL is at most ``target`` (None: never, so far)."""
    return next((u for u, nll in sorted(curve.items()) if nll <= target), None)


def run_curve(run: dict) -> Dict[int, float]:
    """A run's validation curve with integer updates (the results keep them as JSON strings)."""
    return {int(u): v for u, v in run["curve"].items()}


def add_updates_to_baseline_nll(rows: List[dict]) -> None:
    """Per method and seed, the updates it needed to reach the best validation NLL of the
    Transformer of the same seed (Shen et al.'s "time to the same loss", in updates: wall time
    per update depends on what else the machine runs; the benchmark gives the step-time ratios).
    Only against finished baseline runs, whose best NLL is final."""
    baseline = next((r for r in rows if r["method"] == "transformer"), None)
    if baseline is None:
        return
    targets = {}
    for run in baseline["runs"]:
        curve = run_curve(run)
        if run["status"] == "done" and curve:
            best = min(curve.values())
            targets[run["seed"]] = (best, updates_to_reach(curve, best))
    for row in rows:
        for run in row["runs"]:
            if run["seed"] not in targets:
                continue
            target, baseline_updates = targets[run["seed"]]
            reached = updates_to_reach(run_curve(run), target)
            run["baseline_nll"] = {"target": round(target, 4), "baseline_updates": baseline_updates,
                                   "updates": reached, "final": run["status"] == "done"}
            if reached is not None:
                run["baseline_nll"]["ratio"] = round(reached / baseline_updates, 3)
        ratios = [run["baseline_nll"]["ratio"] for run in row["runs"] if run.get("baseline_nll", {}).get("ratio")]
        row["updates_to_baseline_nll_ratio"] = summarise(ratios)


def collect_run(out: str, method: str, seed: int, lowercase: bool, budget: Optional[int],
                baseline: str = "transformer") -> dict:
    """One run's entry of the report: its scores once done, else its progress so far; its validation
    curve up to ``budget`` (all of it while the budget is not yet calibrated)."""
    rdir = run_dir(out, method, seed)
    log_path = os.path.join(rdir, "run.log")
    done = finished_run(rdir)
    run = {"seed": seed, "dir": os.path.relpath(rdir, out)}
    if done:
        run.update(status="done", **{k: done[k] for k in DONE_KEYS if k != "scores"})
        run.update(test_scores(done), paired=paired_with_baseline(out, method, seed, lowercase, baseline),
                   length_ratio={kind: concatenated_bleu(sets, lowercase)["length_ratio"]
                                 for kind, sets in (done.get("scores") or {}).items()})
    else:
        updates = last_logged_update(log_path)
        status = "running" if run_is_locked(rdir) else ("partial" if updates else "pending")
        run.update(status=status, updates=updates)
        sessions = _read_json(os.path.join(rdir, "sessions.json")) or []
        if sessions:  # time so far (a session still going or killed: until its last log line)
            run.update(training_record(sessions, log_path))
    run["curve"] = {str(u): round(v, 4) for u, v in learning_curve(log_path).items()
                    if budget is None or u <= budget}
    return run


def method_row(method: Method, runs: List[dict], plan_entry: dict) -> dict:
    """A method's entry of the report: its runs and their summaries over the finished seeds."""
    finished = [r for r in runs if r["status"] == "done"]
    # the figure's mean: over the finished seeds, or over the unfinished ones while none has finished
    curves = [run_curve(r) for r in (finished or runs) if r["curve"]]
    return {
        "method": method.name, "title": method.title, "paper": method.paper, "arch": method.arch,
        "method_flags": list(method.flags),
        "flags": plan_entry.get("model_flags"), "criterion": list(method.criterion or DEFAULT_CRITERION),
        "params": plan_entry.get("params"), "matched": ({plan_entry["matched_flag"]: plan_entry["matched_value"]}
                                                        if plan_entry.get("matched_flag") else None),
        "note": method.note, "paper_gap": list(method.paper_gap) if method.paper_gap else None, "runs": runs,
        "sacrebleu": summarise([r["sacrebleu"] for r in finished]),
        "tokenized_bleu": summarise([r["tokenized_bleu"] for r in finished]),
        "test": {kind: {name: summarise([r["test"][kind][name] for r in finished if r.get("test", {}).get(kind)])
                        for name in (*TEST_SETS, "all")} for kind in CHECKPOINT_KINDS},
        "length_ratio": {kind: summarise([r["length_ratio"][kind] for r in finished if kind in r["length_ratio"]])
                         for kind in CHECKPOINT_KINDS},
        "mean_curve": {str(u): round(v, 4) for u, v in mean_curve(curves).items()},
        "curve_seeds": len(curves),
    }


def collect(out: str, methods: List[Method], seeds: Dict[str, List[int]], plan: dict, settings, width: Width,
            data_bin: str) -> dict:
    """The report's data; ``seeds``: the seeds of each method."""
    lowercase = read_recipe_env(data_bin).get("LOWERCASE", "0") == "1"
    budget = settings.max_update if isinstance(settings.max_update, int) else None  # else "auto (calibrating)"
    rows = [method_row(method, [collect_run(out, method.name, seed, lowercase,
                                            settings.finetune_update if method.init else budget, method.baseline)
                                for seed in seeds[method.name]], plan.get(method.name, {})) for method in methods]
    add_updates_to_baseline_nll(rows)
    extra = {}
    if settings.deep:
        for method, row in zip(methods, rows):
            base = next((r for r in rows if r["method"] == method.baseline), None)
            row["baseline"] = method.baseline
            if base is not row and base and all(run["status"] == "done" for run in row["runs"] + base["runs"]):
                row["verdict"] = seed_sentence_bootstrap(
                    *[[run_statistics(out, r["method"], run["seed"], "average", lowercase) for run in r["runs"]]
                      for r in (row, base)])
        extra["third_seed"] = _read_json(os.path.join(out, "third_seed.json"))
        extra["budget_check"] = budget_check(next((r for r in rows if r["method"] == "transformer"), None), budget)
    runs = [run for row in rows for run in row["runs"]]
    extra["cpu_hours"] = {"planned": settings.planned_cpu_hours, "actual": round(
        sum((run.get("train_seconds") or 0) + (run.get("generate_seconds") or 0) for run in runs)
        * (settings.threads or 1) / 3600, 1)}
    return {
        "task": "Multi30k De->En (train / val / " + ", ".join(TEST_SETS) + ")",
        "data_bin": data_bin,
        "settings": {
            "methods": [m.name for m in methods], "seeds": sorted({s for found in seeds.values() for s in found}),
            "deep": settings.deep, "lr_schedule": settings.lr_schedule, "finetune_update": settings.finetune_update,
            "width": str(width), "width_text": width.describe(),
            "max_update": settings.max_update, "max_tokens": settings.max_tokens, "lr": settings.lr,
            "warmup": settings.warmup, "dropout": settings.dropout, "eval_every": settings.eval_every,
            "beam": settings.beam, "device": settings.device, "jobs": settings.jobs, "threads": settings.threads,
            "train_args": settings.train_args, "gen_args": settings.gen_args,
            "common_flags": common_train_flags(settings, "SRC", "TGT"), "default_criterion": list(DEFAULT_CRITERION),
        },
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_average": load_average()},
        "methods": rows, **extra,
    }


def _fmt_stats(stats: Optional[dict]) -> str:
    if not stats:
        return "–"
    text = f"{stats['mean']:.2f}"
    if stats["n"] > 1:
        text += f" ± {stats['std']:.2f} [{stats['min']:.2f}, {stats['max']:.2f}]"
    return text + f" (n={stats['n']})"


def _fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "–"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"


def markdown(results: dict) -> str:
    rows, seeds = results["methods"], results["settings"]["seeds"]
    max_update = results["settings"]["max_update"]
    deep = results["settings"].get("deep")
    return "\n".join([*markdown_header(results), *summary_table(rows), *(deep_tables(results) if deep else []),
                      *per_seed_table(rows, seeds, max_update),
                      *runs_table(rows), *test_set_tables(rows, seeds), *([] if deep else verdict_table(rows)),
                      *learning_speed_table(rows, seeds, max_update), *methods_table(rows),
                      "", "![validation NLL against updates](learning_curves.png)", ""])


LENGTH_TOLERANCE = 0.05  # an output length ratio further from 1 is flagged


def deep_tables(results: dict) -> List[str]:
    """Markdown (--deep): the verdict per method with every seed's score and length, sacreBLEU's paired
    bootstrap per seed beside it, the third seed, the budget check and the CPU-hours."""
    rows, seeds = results["methods"], results["settings"]["seeds"]
    lines = ["", "## Verdict", "", f"{VERDICT_RULE}; fixed in the code before any test score existed. Per seed: "
             "sacreBLEU of the averaged checkpoint on the four test sets together and, in parentheses, the output's "
             f"length over the reference's (⚠: more than {LENGTH_TOLERANCE:.0%} from 1). Paired: sacreBLEU's paired "
             "bootstrap against the baseline of the same seed (test-set resampling only; a side column).", "",
             "| method | baseline | " + " | ".join(f"seed {seed}" for seed in seeds) + " | Δ [95% interval] | verdict | "
             + " | ".join(f"paired seed {seed}" for seed in seeds) + " |",
             "|---|---|" + "---:|" * len(seeds) + "---:|---|" + "---:|" * len(seeds)]
    for r in rows:
        by_seed = {run["seed"]: run for run in r["runs"]}
        scores, paired = [], []
        for run in (by_seed.get(seed) for seed in seeds):
            if run is None or run["status"] != "done":
                scores.append(run["status"] if run else "–")
                paired.append("–")
                continue
            ratio = run["length_ratio"]["average"]
            flag = " ⚠" if abs(ratio - 1) > LENGTH_TOLERANCE else ""
            scores.append(f"{run['test']['average']['all']:.2f} ({ratio:.2f}{flag})")
            found = (run.get("paired") or {}).get("average")
            paired.append(f"{found['difference']:+.2f} [{found['ci95'][0]:+.2f}, {found['ci95'][1]:+.2f}]"
                          if found else "–")
        found = r.get("verdict")
        verdict_cells = ([f"{found['difference']:+.2f} [{found['ci95'][0]:+.2f}, {found['ci95'][1]:+.2f}]",
                          found["verdict"]] if found else ["–", "–" if r["method"] == "transformer" else "pending"])
        lines.append(f"| {r['title']} | {r['baseline'] if r['method'] != 'transformer' else '–'} | "
                     + " | ".join(scores + verdict_cells + paired) + " |")
    third = results.get("third_seed")
    lines += ["", f"Third seed ({THIRD_SEED_RULE}): " + (
        f"seed {third['seed']} for {', '.join(third['methods'])}." if third else "not decided yet.")]
    check = results.get("budget_check")
    lines += ["", "## Budget check", "", f"Rule ({CHECK_RULE}): " + (
        "not checked yet (no Transformer run has reached the budget)." if not check else
        ("**held**" if check["passed"] else "**did not hold**") + f" (validation NLL at updates "
        f"{', '.join(map(str, check['updates']))}: " + "; ".join(
            f"seed {seed}: " + (found.get("error") or " → ".join(f"{v:.3f}" for v in found["nll"]))
            for seed, found in check["seeds"].items()) + ").")]
    hours = results["cpu_hours"]
    lines += ["", "## CPU-hours", "", f"Planned: {hours['planned'] if hours['planned'] is not None else '–'}; actual so "
              f"far: {hours['actual']} (training and test decoding summed over the runs, times the threads per run)."]
    return lines


def markdown_header(results: dict) -> List[str]:
    s = results["settings"]
    runs = [run for r in results["methods"] for run in r["runs"]]
    n_done = sum(run["status"] == "done" for run in runs)
    devices = sorted({d for run in runs for d in run.get("devices", [])})
    train_total = sum(run.get("train_seconds") or 0 for run in runs)
    decode_total = sum(run.get("generate_seconds") or 0 for run in runs)
    signatures = {run["sacrebleu_signature"] for run in runs if run.get("sacrebleu_signature")}
    case = ("case-insensitive" if all("case:lc" in sig for sig in signatures) else "cased") if signatures else "–"
    return [
        "# One benchmark for all methods: Multi30k De->En",
        "",
        f"Written {results['written']} by `scripts/compare_methods.py`. **{n_done} of {len(runs)} runs done**"
        + ("" if n_done == len(runs) else " (the table fills in as runs finish; run the same command again to "
           "continue)") + ".",
        "",
        f"* Data: {results['task']}, one joint BPE and one joined dictionary for all methods (`{results['data_bin']}`).",
        f"* Width: {s['width_text']} (`--width {s['width']}`); `--share-all-embeddings` for every encoder-decoder "
        "model (layer-wise coordination has one embedding for both sides and the softmax by construction).",
        f"* Budget: {s['max_update']} updates of ≤{s['max_tokens']} tokens, Adam (0.9, 0.98), lr {s['lr']}, "
        + (f"linear decay to 0 at the budget after {s['warmup']} warm-up updates" if s.get("lr_schedule") == "polynomial"
           else f"inverse-sqrt schedule with {s['warmup']} warm-up updates")
        + f", dropout {s['dropout']}, label smoothing 0.1, weight decay 1e-4; validation + checkpoint every "
        f"{s['eval_every']} updates; " + (
            f"the average of the last {AVERAGED} checkpoints is translated (beam {s['beam']}); the runs that start from "
            f"the Transformer's final model train {s.get('finetune_update')} more updates with the same schedule"
            if s.get("deep") else f"the checkpoint with the best validation NLL and the average of the last {AVERAGED} "
            f"checkpoints are translated (beam {s['beam']})") + f". Seeds: {', '.join(map(str, s['seeds']))}.",
        f"* Device(s) used so far: {'; '.join(devices) if devices else '–'}. Requested: "
        f"`--device {s['device']}`, {s['jobs']} parallel job(s). Time so far, summed over runs: training "
        f"{_fmt_duration(train_total)}, test decoding {_fmt_duration(decode_total)}.",
        f"* BLEU: detokenised sacreBLEU against the raw reference ({case}; signature in results.json) and, "
        "in parentheses, tokenised BLEU (multi-bleu style), both as `scripts/evaluate.sh`. Mean ± sample std "
        "[min, max] over the finished seeds.",
    ]


def summary_table(rows: List[dict]) -> List[str]:
    """Markdown: the table the README shows. Per method, sacreBLEU on every test set and on the four
    together for the best / the averaged checkpoint (mean over the finished seeds), then the paired
    difference to the Transformer on the four together and its :func:`verdict`, for both kinds."""
    baseline = next((r for r in rows if r["method"] == "transformer"), None)
    if baseline is None or not any(run.get("test") for r in rows for run in r["runs"]):
        return []
    short = [name.replace("test_", "") for name in TEST_SETS]
    deep = any("baseline" in r for r in rows)
    lines = ["", "## Summary", "",
             "Each cell: " + " / ".join(CHECKPOINT_KINDS[kind] for kind in scored_kinds(rows)) + "; sacreBLEU, mean "
             "over the finished seeds (their spread and the per-seed confidence intervals: the tables below). "
             + ("Δ [95% interval] and verdict: as in [Verdict](#verdict)." if deep else
                "Δ and verdict: as in [Against the Transformer](#against-the-transformer)."), "",
             "| method | params vs Transformer | seeds | " + " | ".join(short) + " | all four | Δ all four | verdict |",
             "|---|---:|---:|" + "---:|" * (len(TEST_SETS) + 2) + "---|"]
    for r in rows:
        scores = [" / ".join(f"{r['test'][kind][name]['mean']:.2f}" if r["test"][kind][name] else "–"
                             for kind in scored_kinds(rows)) for name in (*TEST_SETS, "all")]
        if "baseline" in r:  # --deep: against its baseline, the verdict of the seeds-and-sentences bootstrap
            found = r.get("verdict")
            against = ([f"{found['difference']:+.2f} [{found['ci95'][0]:+.2f}, {found['ci95'][1]:+.2f}]",
                        found["verdict"]] if found else ["–", "–" if r["method"] == "transformer" else "pending"])
        elif r is baseline:
            against = ["–", "–"]
        else:
            pairs = [difference_and_verdict(r, baseline, kind) for kind in CHECKPOINT_KINDS]
            against = [" / ".join(difference for difference, _ in pairs), " / ".join(v for _, v in pairs)]
        done = sum(run["status"] == "done" for run in r["runs"])
        params, base_params = r["params"], baseline["params"]
        versus = f"{100 * (params - base_params) / base_params:+.1f}%" if params and base_params else "–"
        lines.append(f"| {r['title']} | {versus} | "
                     f"{done}/{len(r['runs'])} | " + " | ".join(scores + against) + " |")
    return lines


def per_seed_table(rows: List[dict], seeds: List[int], max_update) -> List[str]:
    kinds = scored_kinds(rows)
    lines = ["", "## test_2016_flickr per seed: " + ("the best checkpoint" if kinds[:1] == ["best"] else
                                                     CHECKPOINT_KINDS[kinds[0]] if kinds else "–"), "",
             "sacreBLEU and, in parentheses, tokenised BLEU; then their mean ± std [min, max] over the finished "
             "seeds.", "",
             f"| method | params | {' | '.join(f'seed {seed}' for seed in seeds)} | sacreBLEU | "
             "tokenised BLEU | done |", "|---|---:|" + "---:|" * len(seeds) + "---|---|---|"]
    for r in rows:
        cells = []
        by_seed = {run["seed"]: run for run in r["runs"]}
        for run in (by_seed.get(seed, {"status": "–"}) for seed in seeds):
            if run["status"] == "done":
                cells.append(f"{run['sacrebleu']:.2f} ({run['tokenized_bleu']:.2f})")
            elif run["status"] in ("running", "partial"):
                cells.append(f"{run['status']} {run['updates']}/{max_update}")
            else:
                cells.append(run["status"])
        params = r["params"]
        n = sum(run["status"] == "done" for run in r["runs"])
        lines.append(f"| {r['title']} | {f'{params:,}' if params else '–'} | " + " | ".join(cells) +
                     f" | {_fmt_stats(r['sacrebleu'])} | {_fmt_stats(r['tokenized_bleu'])} | {n}/{len(r['runs'])} |")
    return lines


def runs_table(rows: List[dict]) -> List[str]:
    lines = ["", "## Runs", "",
             "Times are wall-clock, under whatever else the machine ran meanwhile (other runs, evaluations): "
             "they do not compare methods' speed; the benchmark's step-time ratios do (docs/measurements.md).", "",
             "| method | seed | status | updates | training time | updates/s | test decoding | device | finished |",
             "|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        for run in r["runs"]:
            lines.append(
                f"| {r['method']} | {run['seed']} | {run['status']} | {run.get('updates', 0)} | "
                f"{_fmt_duration(run.get('train_seconds'))} | {run.get('updates_per_second', '–')} | "
                f"{_fmt_duration(run.get('generate_seconds'))} | {'; '.join(run.get('devices', [])) or '–'} | "
                f"{run.get('finished', '–')} |")
    return lines


def methods_table(rows: List[dict]) -> List[str]:
    lines = ["", "## Methods", "", "| method | paper | flags (besides the common width) | criterion | note |",
             "|---|---|---|---|---|"]
    for r in rows:
        flags = [f"--arch {r['arch']}", " ".join(r["method_flags"])]
        if r.get("matched"):
            (flag, value), = r["matched"].items()
            flags.append(f"{flag} {value} (matched)")
        lines.append(f"| {r['title']} | {r['paper']} | `{' '.join(f for f in flags if f)}` | "
                     f"`{' '.join(r['criterion'][1:2])}` | {r['note']} |")
    return lines


CHECKPOINT_KINDS = {"best": "the checkpoint of the best validation NLL",
                    "average": f"the average of the last {AVERAGED} checkpoints"}


def test_set_tables(rows: List[dict], seeds: List[int]) -> List[str]:
    """Markdown: per kind of checkpoint, sacreBLEU on every test set and on all four together (mean ± std
    over the finished seeds), and the paired difference to the Transformer of each seed (95% CI)."""
    if not any(run.get("test") for r in rows for run in r["runs"]):
        return []
    short = {name: name.replace("test_", "") for name in TEST_SETS}
    lines = []
    for kind in scored_kinds(rows):
        title = CHECKPOINT_KINDS[kind]
        lines += ["", f"## Test sacreBLEU: {title}", "",
                  f"Mean ± sample std over the finished seeds; Δ: the method minus the Transformer of the same seed "
                  "on the four test sets together, with the 95% confidence interval of sacreBLEU's paired bootstrap "
                  f"({BOOTSTRAP_SAMPLES} resamples), per seed. Length: the output's length over the "
                  "reference's on the four together (tokenised as sacreBLEU does; mean over seeds).", "",
                  "| method | " + " | ".join(short[n] for n in TEST_SETS) + " | all four | length | " +
                  " | ".join(f"Δ seed {seed}" for seed in seeds) + " |",
                  "|---|" + "---:|" * (len(TEST_SETS) + 2 + len(seeds))]
        for r in rows:
            cells = [_fmt_mean_std(r["test"][kind][name]) for name in (*TEST_SETS, "all")]
            ratio = r["length_ratio"][kind]
            cells.append(f"{ratio['mean']:.2f}" if ratio else "–")
            by_seed = {run["seed"]: run for run in r["runs"]}
            for run in (by_seed.get(seed, {}) for seed in seeds):
                paired = (run.get("paired") or {}).get(kind)
                cells.append(f"{paired['difference']:+.2f} [{paired['ci95'][0]:+.2f}, {paired['ci95'][1]:+.2f}]"
                             if paired else "–")
            lines.append(f"| {r['title']} | " + " | ".join(cells) + " |")
    return lines


def scored_kinds(rows: List[dict]) -> List[str]:
    """The kinds of checkpoint (:data:`CHECKPOINT_KINDS`) that some run was scored with."""
    return [kind for kind in CHECKPOINT_KINDS if any(kind in run.get("test", {}) for r in rows for run in r["runs"])]


def verdict(paired: List[Optional[dict]], baseline_scores: List[float]) -> str:
    """Whether a method differs from the Transformer beyond the seed spread, from the paired bootstrap of
    every seed (``paired``: {"difference", "ci95"} per seed, None while a run is unfinished) and the
    Transformer's own scores over those seeds.

    Rule: every seed's 95% interval excludes 0 on the same side, and the mean difference is larger
    than the Transformer's seed spread (max - min of its scores): the first bounds the test-set
    sampling noise, the second what another training seed alone moves the score.
    """
    if not paired or any(p is None for p in paired):
        done = sum(p is not None for p in paired)
        return f"pending ({done} of {len(paired)} seeds)"
    mean = statistics.fmean(p["difference"] for p in paired)
    spread = max(baseline_scores) - min(baseline_scores) if len(baseline_scores) > 1 else 0.0
    side = {1 if p["ci95"][0] > 0 else -1 if p["ci95"][1] < 0 else 0 for p in paired}
    if len(side) == 1 and 0 not in side and abs(mean) > spread:
        return "better" if mean > 0 else "worse"
    return "within the spread"


def difference_and_verdict(row: dict, baseline: dict, kind: str) -> Tuple[str, str]:
    """A method's mean paired difference to the Transformer over the seeds scored so far, as text, and its
    :func:`verdict`, for one kind of checkpoint."""
    paired = [(run.get("paired") or {}).get(kind) for run in row["runs"]]
    base = [run["test"][kind]["all"] for run in baseline["runs"] if run.get("test", {}).get(kind)]
    known = [p["difference"] for p in paired if p]
    return (f"{statistics.fmean(known):+.2f}" if known else "–"), verdict(paired, base)


def verdict_table(rows: List[dict]) -> List[str]:
    """Markdown: per method and kind of checkpoint, the mean paired difference to the Transformer on the
    four test sets together, the :func:`verdict`, and the gap its paper reports."""
    baseline = next((r for r in rows if r["method"] == "transformer"), None)
    if baseline is None or not any(run.get("paired") for r in rows for run in r["runs"]):
        return []
    lines = ["", "## Against the Transformer", "",
             "Δ: the method minus the Transformer of the same seed in sacreBLEU on the four test sets together, "
             "mean over seeds. Better / worse: every seed's paired-bootstrap 95% interval excludes 0 on that side "
             "and the mean exceeds the Transformer's own seed spread (max - min); otherwise within the spread. "
             "The paper's gap is its own Transformer baseline's, on its data and at its size.", "",
             "| method | Δ best | verdict | Δ averaged | verdict | paper's gap | where |", "|---|---:|---|---:|---|---:|---|"]
    for r in rows:
        if r["method"] == "transformer":
            continue
        cells = [cell for kind in CHECKPOINT_KINDS for cell in difference_and_verdict(r, baseline, kind)]
        gap, where = r.get("paper_gap") or (None, "")
        cells += [f"{gap:+.2f}" if gap is not None else "–", where or "–"]
        lines.append(f"| {r['title']} | " + " | ".join(cells) + " |")
    return lines


def _fmt_mean_std(stats: Optional[dict]) -> str:
    if not stats:
        return "–"
    return f"{stats['mean']:.2f}" + (f" ± {stats['std']:.2f}" if stats["n"] > 1 else "")


def learning_speed_table(rows: List[dict], seeds: List[int], max_update: int) -> List[str]:
    """Markdown lines: updates to reach the Transformer's best validation NLL, per seed."""
    if not any(run.get("baseline_nll") for r in rows for run in r["runs"]):
        return []
    seed_cols = " | ".join(f"seed {seed}" for seed in seeds)
    lines = ["", "## Updates to reach the Transformer's best validation NLL", "",
             "Per seed: the first validation (every `--eval-every` updates) at which the method's validation NLL is "
             "at most the best one of the Transformer of the same seed, and that count over the Transformer's own "
             f"(ratio < 1: the method gets there in fewer updates). `> {max_update}`: not within the budget; "
             "`not yet`: a run still going.", "",
             f"| method | {seed_cols} | ratio (mean over seeds) |", "|---|" + "---:|" * len(seeds) + "---:|"]
    for r in rows:
        cells = []
        for run in r["runs"]:
            info = run.get("baseline_nll")
            if not info:
                cells.append("–")
            elif info["updates"] is not None:
                cells.append(f"{info['updates']} ({info['ratio']:.2f})")
            else:
                cells.append(f"> {max_update}" if info["final"] else "not yet")
        lines.append(f"| {r['title']} | " + " | ".join(cells) + f" | {_fmt_stats(r.get('updates_to_baseline_nll_ratio'))} |")
    return lines


def plot_curves(results: dict, path: str) -> None:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the right panel repeats the second half of training at a scale where the methods come apart
    fig, (whole, tail) = plt.subplots(1, 2, figsize=(13, 5))
    half = max((int(u) for r in results["methods"] for u in r["mean_curve"]), default=0) // 2
    for r in results["methods"]:
        curve = {int(u): v for u, v in r["mean_curve"].items()}
        if not curve:
            continue
        label = f"{r['title']} ({r['curve_seeds']} seed{'s' if r['curve_seeds'] != 1 else ''})"
        whole.plot(list(curve), list(curve.values()), marker="o", markersize=3, label=label)
        late = {u: v for u, v in curve.items() if u >= half}
        tail.plot(list(late), list(late.values()), marker="o", markersize=3)
    s = results["settings"]
    whole.set_title(f"Multi30k De->En, {s['width_text']}, mean over seeds", fontsize=10)
    tail.set_title(f"from update {half} on", fontsize=10)
    for ax in (whole, tail):
        ax.set_xlabel("updates")
        ax.set_ylabel("validation NLL (bits per target token)")
        ax.grid(alpha=0.3)
    if whole.lines:
        whole.legend(fontsize=8)
    else:
        whole.text(0.5, 0.5, "no validation yet", ha="center", va="center", transform=whole.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out, methods, seeds, plan, settings, width, data_bin) -> dict:
    results = collect(out, methods, seeds, plan, settings, width, data_bin)
    _write_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(results))
    plot_curves(results, os.path.join(out, "learning_curves.png"))
    return results


# ---------------------------------------------------------------------------------------------- CLI
def _budget(text):
    return "auto" if text == "auto" else positive_int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compare_methods.py",
        description="Train the vanilla Transformer and every paper's headline configuration at a matched size "
        "with one budget on Multi30k De->En; report BLEU per seed, mean and spread, parameters and learning curves. "
        "Resumable: run the same command again to continue.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--methods", nargs="+",
                   help="methods (space- or comma-separated) from: " + ", ".join(METHODS) + f"; and '{COMPOSITION}': "
                   f"{COMPOSITION_RULE} (default: {', '.join(SHALLOW_METHODS)}; with --deep: {', '.join(DEEP_METHODS)})")
    p.add_argument("--deep", action="store_true",
                   help=f"the 6+6 comparison: --width {DEEP_WIDTH} (unless --width is given), --lr-schedule polynomial, "
                   "the methods above, only the average of the last checkpoints scored, the verdict of a bootstrap over "
                   "seeds and sentences, and a third seed where two seeds do not decide")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p.add_argument("--out", default="comparison_out", help="output directory (runs, data, results)")
    g = p.add_argument_group("data")
    g.add_argument("--raw", help="Multi30k raw files (train/val/test_*.de/.en), needed to prepare the data and the "
                   "test sets")
    g.add_argument("--data-bin", help="already binarised data made by scripts/prepare-multi30k.sh (joined dictionary)")
    g.add_argument("--bpe-merges", type=positive_int, default=8000, help="joint BPE merges when preparing the data")
    g = p.add_argument_group("models")
    w = g.add_mutually_exclusive_group()
    w.add_argument("--width", type=parse_width,
                   help=f"common size ENC+DEC:DIM:FFN:HEADS (default {DEFAULT_WIDTH}; with --deep {DEEP_WIDTH})")
    w.add_argument("--small", dest="width", action="store_const", const=parse_width(SMALL_WIDTH),
                   help=f"the small CPU preset --width {SMALL_WIDTH}")
    g.add_argument("--dropout", type=float, default=0.1)
    g = p.add_argument_group("budget (identical for every run)")
    g.add_argument("--max-update", type=_budget, default=800,
                   help="updates of every run, or 'auto': calibrated on the Transformer of the first seed (" +
                   BUDGET_RULE + ")")
    g.add_argument("--provisional-update", type=positive_int, default=4000,
                   help="with --max-update auto: how far the other runs train while the budget is calibrated")
    g.add_argument("--max-tokens", type=positive_int, default=4096)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup", type=positive_int, default=250, help="warm-up updates")
    g.add_argument("--lr-schedule", choices=("inverse_sqrt", "polynomial"),
                   help="inverse_sqrt (the default; never anneals) or polynomial: linear from the warm-up to 0 at the "
                   "run's budget (the default with --deep; needs a fixed --max-update)")
    g.add_argument("--finetune-update", type=positive_int, default=2000,
                   help="updates of the runs that start from the Transformer's final averaged checkpoint "
                   "(transformer_continued, deeprep_finetuned)")
    g.add_argument("--planned-cpu-hours", type=float, help="the plan's CPU-hours, which the report puts beside the actual")
    g.add_argument("--eval-every", type=positive_int, default=100,
                   help="updates between validations (learning curve) and checkpoints (resume points)")
    g.add_argument("--beam", type=positive_int, default=5)
    g.add_argument("--train-args", default="", help="extra fairseq-train flags for every run (e.g. '--fp16')")
    g.add_argument("--gen-args", default="", help="extra fairseq-generate flags for every run's test translation")
    g = p.add_argument_group("execution")
    g.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    g.add_argument("--jobs", type=positive_int, default=1, help="runs in parallel")
    g.add_argument("--threads", type=positive_int,
                   help="torch threads per run (default: torch's own; with --jobs N on CPU: cores / N)")
    g.add_argument("--keep-checkpoints", action="store_true",
                   help="keep every checkpoint of evaluated runs (default: only the scored one is kept)")
    g.add_argument("--stage", choices=("all", "train", "evaluate"), default="all",
                   help="train: train every run to the budget and evaluate none (e.g. from a pinned checkout); "
                   "evaluate: evaluate the runs that reached it and train none")
    g.add_argument("--report-only", action="store_true", help="train nothing; collect what exists and write the report")
    g.add_argument("--force", action="store_true",
                   help="use an --out that holds results, runs or data this tool did not write (they are replaced)")
    g.add_argument("--log-interval", type=positive_int, default=50, help=argparse.SUPPRESS)
    return p


def worker_env(settings) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.dirname(PLUGIN_DIR), os.environ.get("PYTHONPATH")) if p)}
    threads = settings.threads
    if threads is None and settings.device == "cpu" and settings.jobs > 1:
        threads = max(1, (os.cpu_count() or 1) // settings.jobs)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    settings.threads = threads
    return env


class Experiment:
    """The runs of one ``--out``: which step each needs next, in which order, and the report.

    Every decision is read back from the run directories (interval checkpoints, logs, ``budget.json``,
    ``composition.json``), so an invocation killed at any point is continued by the next one."""

    def __init__(self, settings, methods: List[Method], data_bin: str, recipe: dict):
        self.settings, self.methods, self.data_bin, self.recipe = settings, methods, data_bin, recipe
        self.out = settings.out
        self.record_budget()
        self.plan = make_plan(self.concrete_methods(), settings.width, settings, data_bin, recipe, self.out)
        self.env = worker_env(settings)

    def test_sets(self) -> Dict[str, dict]:
        return prepare_test_sets(self.data_bin, self.recipe, self.settings.raw, self.out)

    # ---- what the runs are
    def runs(self) -> List[Tuple[str, int]]:
        """(method, seed) in training order: seed-major, so the first pieces are a full one-seed table; the
        third seed of :data:`THIRD_SEED_RULE` last."""
        third = _read_json(os.path.join(self.out, "third_seed.json")) or {"seed": None, "methods": []}
        return ([(method.name, seed) for seed in self.settings.seeds for method in self.methods] +
                [(method.name, third["seed"]) for method in self.methods if method.name in third["methods"]])

    def seeds_of(self, name: str) -> List[int]:
        return [seed for method, seed in self.runs() if method == name]

    def run_budget(self, name: str) -> Optional[int]:
        """The updates a run trains: the budget, or --finetune-update for one that starts from a trained model."""
        method = self.method(name)
        return self.settings.finetune_update if method and method.init else self.budget()

    def method(self, name: str) -> Optional[Method]:
        """The method of that name; the composition only once it is chosen."""
        if name != COMPOSITION:
            return METHODS[name]
        chosen = _read_json(os.path.join(self.out, "composition.json"))
        return composed_method(chosen["components"]) if chosen else None

    def concrete_methods(self, keep_unchosen: bool = False) -> List[Method]:
        """The methods, the composition as chosen; before it is chosen it is left out, or with
        ``keep_unchosen`` kept as its placeholder (for the report)."""
        resolved = [(self.method(method.name), method) for method in self.methods]
        return [chosen or method for chosen, method in resolved if chosen is not None or keep_unchosen]

    def rdir(self, name: str, seed: int) -> str:
        return run_dir(self.out, name, seed)

    def save_dir(self, name: str, seed: int) -> str:
        return os.path.join(self.rdir(name, seed), "checkpoints")

    # ---- budget and composition, decided from the runs' curves
    def record_budget(self) -> None:
        """budget.json holds the budget of ``--out`` (for ``auto``, once calibrated); another one is refused."""
        path = os.path.join(self.out, "budget.json")
        known, asked = _read_json(path), self.settings.max_update
        was = (known or {}).get("max_update")
        if known and was != asked:
            raise ComparisonError(f"{self.out} was started with other settings (--max-update {was} -> {asked}); use "
                                  "another --out or the original settings")
        if not known and asked != "auto" and not self.settings.report_only:
            _write_json(path, {"max_update": asked, "budget": asked})

    def trained_to(self, name: str, seed: int, budget: int) -> bool:
        """Whether a run has reached ``budget``: an interval checkpoint there, or evaluated (the evaluation
        removes every checkpoint but the one it scores)."""
        return (finished_run(self.rdir(name, seed)) is not None
                or saved_updates(self.save_dir(name, seed)) >= budget)

    def budget(self) -> Optional[int]:
        known = _read_json(os.path.join(self.out, "budget.json"))
        return known["budget"] if known else None

    def calibrate(self) -> None:
        """Write budget.json once the calibration run's curve has flattened (never changed afterwards)."""
        if self.budget() is not None:
            return
        name, seed = "transformer", self.settings.seeds[0]
        curve = learning_curve(os.path.join(self.rdir(name, seed), "run.log"))
        saved = saved_updates(self.save_dir(name, seed))
        plateau = plateau_update({u: v for u, v in curve.items() if u <= saved}, PLATEAU_DELTA, PLATEAU_WINDOW)
        if plateau is None:
            return
        budget = calibrated_budget(plateau)
        _write_json(os.path.join(self.out, "budget.json"), {
            "max_update": "auto", "budget": budget, "plateau_update": plateau, "rule": BUDGET_RULE,
            "calibration_run": os.path.relpath(self.rdir(name, seed), self.out),
            "curve": {str(u): v for u, v in curve.items() if u <= saved}})
        log(f"budget calibrated: {budget} updates (validation NLL flat at update {plateau})")

    def choose_composition(self) -> None:
        """Write composition.json once every component's first seed has reached the budget."""
        budget = self.budget()
        if (COMPOSITION not in [m.name for m in self.methods] or budget is None
                or os.path.isfile(os.path.join(self.out, "composition.json"))):
            return
        seed = self.settings.seeds[0]
        names = ["transformer", *COMPONENTS]
        if not all(self.trained_to(name, seed, budget) for name in names):
            return
        best = {name: best_within(learning_curve(os.path.join(self.rdir(name, seed), "run.log")), budget)[1]
                for name in names}
        count = _build_counter(self.data_bin, self.settings, self.recipe)

        def builds(components):
            method = composed_method(components)
            try:
                count(method, model_flags(method, self.settings.width))
                return True
            except (ValueError, SystemExit):
                return False

        components = choose_components({n: best[n] for n in COMPONENTS}, best["transformer"], builds)
        _write_json(os.path.join(self.out, "composition.json"), {
            "components": components, "rule": COMPOSITION_RULE, "seed": seed, "budget": budget,
            "best_valid_nll": best})
        log(f"composition chosen: {' + '.join(components)}")
        self.plan = make_plan(self.concrete_methods(), self.settings.width, self.settings, self.data_bin, self.recipe,
                              self.out)

    def choose_third_seed(self) -> None:
        """With --deep, write third_seed.json once every run of the first seeds is scored (:data:`THIRD_SEED_RULE`)."""
        path = os.path.join(self.out, "third_seed.json")
        if not self.settings.deep or os.path.isfile(path):
            return
        if not all(finished_run(self.rdir(*run)) for run in self.runs()):
            return
        lowercase = self.recipe.get("LOWERCASE", "0") == "1"
        intervals = {}
        for method in self.concrete_methods():
            if method.name != "transformer":
                runs = [run_statistics(self.out, name, seed, "average", lowercase)
                        for name in (method.name, method.baseline) for seed in self.settings.seeds]
                half = len(self.settings.seeds)
                intervals[method.name] = seed_sentence_bootstrap(runs[:half], runs[half:])
        chosen = [name for name, found in intervals.items() if found["verdict"] == "undecided"]
        methods = {"transformer", *chosen, *(self.method(name).baseline for name in chosen)}
        _write_json(path, {"seed": max(self.settings.seeds) + 1, "rule": THIRD_SEED_RULE, "intervals": intervals,
                           "methods": [m.name for m in self.methods if m.name in methods]})
        log(f"third seed for: {', '.join(m.name for m in self.methods if m.name in methods)}")

    # ---- the next step of a run
    def target(self, name: str, seed: int, saved: int) -> int:
        budget = self.run_budget(name)
        if budget is not None:
            return budget
        if (name, seed) == ("transformer", self.settings.seeds[0]):
            return (saved // PLATEAU_WINDOW + 1) * PLATEAU_WINDOW  # calibration: the next chunk
        return self.settings.provisional_update

    def next_step(self, name: str, seed: int) -> Optional[Tuple[str, int]]:
        """("train", up to update) or ("evaluate", at budget); None: done, or waiting for the budget, the
        composition or another process."""
        rdir = self.rdir(name, seed)
        if finished_run(rdir) or self.method(name) is None or run_is_locked(rdir):
            return None
        init = self.method(name).init
        if init and (self.budget() is None or not self.trained_to(init, seed, self.budget())):
            return None  # it starts from that run's final model
        saved, budget = saved_updates(self.save_dir(name, seed)), self.run_budget(name)
        if budget is not None and saved >= budget:
            return None if self.settings.stage == "train" else ("evaluate", budget)
        if self.settings.stage == "evaluate":
            return None
        target = self.target(name, seed, saved)
        return ("train", target) if saved < target else None

    def start(self, name: str, seed: int, step: str, updates: int) -> str:
        method, rdir = self.method(name), self.rdir(name, seed)
        if step == "train":
            init = (final_average(self.save_dir(method.init, seed), self.budget(), self.settings.eval_every)
                    if method.init else None)
            config = run_config(method, self.plan[name], self.settings, self.data_bin, self.recipe, seed, rdir,
                                self.run_budget(name), init)
            check_config(rdir, config)
            os.makedirs(rdir, exist_ok=True)
            _write_json(os.path.join(rdir, "config.json"), config)
        else:
            _write_json(os.path.join(rdir, "evaluation.json"), {"budget": updates, "test_sets": self.test_sets(),
                                                                "kinds": ["average"] if self.settings.deep
                                                                else list(CHECKPOINT_KINDS)})
        status = run_step(f"{name} seed {seed}", rdir, step, updates, self.env)
        if step == "train" and status == "done" and saved_updates(self.save_dir(name, seed)) < updates:
            log(f"{name} seed {seed}: fairseq-train stopped before update {updates}; see {rdir}/run.log")
            return "failed"
        return status

    def run(self) -> List[str]:
        """Train and evaluate until nothing is left that can go on; returns the failed runs."""
        failed, running = set(), {}
        if self.settings.stage != "train":
            self.test_sets()  # once, before the workers read them
        with ThreadPoolExecutor(max_workers=self.settings.jobs) as pool:
            while True:
                self.calibrate()
                self.choose_composition()
                self.choose_third_seed()
                for name, seed in self.runs():
                    if len(running) >= self.settings.jobs:
                        break
                    step = None if (name, seed) in failed | set(running.values()) else self.next_step(name, seed)
                    if step:
                        running[pool.submit(self.start, name, seed, *step)] = (name, seed)
                if not running:
                    return [f"{name} seed {seed}" for name, seed in sorted(failed)]
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    run = running.pop(future)
                    if future.result() == "failed":
                        failed.add(run)
                self.report(quiet=True)

    def report(self, quiet: bool = False) -> dict:
        budget = self.budget()
        asked = self.settings.max_update
        settings = argparse.Namespace(**{**vars(self.settings), "max_update": budget or (
            asked if asked != "auto" else "auto (calibrating)")})
        try:
            methods = self.concrete_methods(keep_unchosen=True)
            return write_report(self.out, methods, {m.name: self.seeds_of(m.name) for m in methods}, self.plan,
                                settings, self.settings.width, self.data_bin)
        except Exception as error:  # noqa: BLE001 - a report must not stop the training of the other runs
            if not quiet:
                raise
            log(f"warning: could not write the intermediate report: {error}")
            return {}


def parse_settings(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, with the defaults that depend on --deep filled in."""
    settings = build_parser().parse_args(argv)
    settings.width = settings.width or parse_width(DEEP_WIDTH if settings.deep else DEFAULT_WIDTH)
    settings.lr_schedule = settings.lr_schedule or ("polynomial" if settings.deep else "inverse_sqrt")
    settings.methods = settings.methods or [",".join(DEEP_METHODS if settings.deep else SHALLOW_METHODS)]
    return settings


def main(argv: Optional[Sequence[str]] = None) -> dict:
    settings = parse_settings(argv)
    methods = resolve_methods(settings.methods)
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # the root logger may be at DEBUG
    check_method_choice(settings, [m.name for m in methods])
    check_checkpoint_alignment(settings)
    if settings.device is None:
        settings.device = "cuda" if _cuda_available() else "cpu"
    settings.out = os.path.abspath(settings.out)
    claim_out_dir(settings.out, settings.force)
    data_bin = prepare_data(settings)
    experiment = Experiment(settings, methods, data_bin, read_recipe_env(data_bin))
    done = [run for run in experiment.runs() if finished_run(experiment.rdir(*run))]
    for name, seed in done:
        log(f"{name} seed {seed}: already done, not retrained")
    log(f"{len(done)} of {len(experiment.runs())} runs done; "
        + ("reporting only" if settings.report_only else f"stage '{settings.stage}' with {settings.jobs} job(s) on "
           f"{settings.device}") + f"; results -> {settings.out}/results.md")
    failed = []
    if not settings.report_only:
        experiment.report()  # the table so far
        failed = experiment.run()
    results = experiment.report()
    log(f"wrote {settings.out}/results.md, results.json and learning_curves.png")
    if failed:
        raise ComparisonError(f"{len(failed)} run(s) failed: {', '.join(failed)} (see their run.log)")
    return results


OUT_STAMP, STAMP_TEXT = ".written_by", "fusion-fairseq compare_methods.py\n"
OUT_NAMES = ("results.md", "results.json", "learning_curves.png", "plan.json", "budget.json", "composition.json",
             "runs", "data", "test-sets")


def claim_out_dir(out: str, force: bool) -> None:
    """--out is this tool's working directory, rewritten on every run: one it stamped is continued;
    one holding files of its names that it did not stamp is refused without --force."""
    stamp = os.path.join(out, OUT_STAMP)
    if os.path.isfile(stamp):
        with open(stamp, encoding="utf-8", errors="replace") as f:
            if f.read() == STAMP_TEXT:
                return
    found = [name for name in OUT_NAMES if os.path.exists(os.path.join(out, name))]
    if found and not force:
        raise ComparisonError(f"--out {out} holds {', '.join(found)}, not written by compare_methods.py; pass --force "
                              "to replace them, or give another --out")
    os.makedirs(out, exist_ok=True)
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(STAMP_TEXT)


def check_method_choice(settings, names: List[str]) -> None:
    if len(set(settings.seeds)) != len(settings.seeds):
        raise ComparisonError("--seeds: repeated seed")
    if "transformer" not in names:
        if settings.max_update == "auto":
            raise ComparisonError("--max-update auto: the budget is calibrated on 'transformer'; add it to --methods")
        log("note: the baseline 'transformer' is not among --methods; its size is still the matching target")
    missing = [name for name in ("transformer", *COMPONENTS) if name not in names]
    if COMPOSITION in names and missing:
        raise ComparisonError(f"--methods: '{COMPOSITION}' is chosen from the runs of {', '.join(COMPONENTS)} and "
                              f"transformer; add {', '.join(missing)}")


def check_checkpoint_alignment(settings) -> None:
    """Every update a run stops at is a multiple of --eval-every: fairseq writes the interval checkpoints
    (the resume points, the best and the averaged candidates) only there."""
    every = settings.eval_every
    why = f"not a multiple of --eval-every {every}, the only updates with a checkpoint"
    if settings.max_update == "auto" and settings.lr_schedule == "polynomial":
        raise ComparisonError("--max-update auto: the polynomial schedule anneals to 0 at a budget fixed before "
                              "training; give --max-update N")
    if settings.max_update == "auto":
        if BUDGET_STEP % every:
            raise ComparisonError(f"--max-update auto: its budgets are multiples of {BUDGET_STEP}, {why}")
        if settings.provisional_update % every:
            raise ComparisonError(f"--provisional-update {settings.provisional_update}: {why}")
    elif settings.max_update % every:
        raise ComparisonError(f"--max-update {settings.max_update}: {why}")
    if settings.finetune_update % every and any(method.init for method in resolve_methods(settings.methods)):
        raise ComparisonError(f"--finetune-update {settings.finetune_update}: {why}")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("_train", "_evaluate"):
        (train_worker if sys.argv[1] == "_train" else evaluate_worker)(sys.argv[2], int(sys.argv[3]))
    else:
        main()

"""One benchmark for all methods: translation quality at a matched size and an identical budget, in the design of
examples/comparison/reviewed/plan.md (:class:`Experiment`; examples/comparison/README.md). Every (method, seed) run
is ``fairseq-train`` in ``OUT/runs/METHOD/seedS/``, resumed by fairseq from ``checkpoint_last.pt`` (and at each
update of the final average, :func:`train_run`); its
``done.json``, written last after the evaluation, marks it as finished: it is never retrained. The report is
:mod:`fusion_lab.comparison_report`'s. The earlier designs (the 3+3 and 6+6 comparisons) run at their pins:
examples/comparison/converged.sh and deep.sh."""

import argparse
import bisect
import contextlib
import functools
import importlib.metadata
import io
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Dict, List, Optional, Sequence, Set, Tuple

from fusion_lab import comparison_report as report, corpus, seed_analysis
from fusion_lab.common import (BATCHES_IN_THREAD, FAIRSEQ_GENERATE_WRITES, FAIRSEQ_TRAIN_WRITES, PLUGIN_DIR,
                               append_to_log, claim_out_dir, copy_file, count_parameters, cpu_flags, cpu_name,
                               device_name, folder_without_links, learning_curve, positive_int,
                               python_module_command, replace_atomically, tree_sha256)
from fusion_lab.comparison_report import TEST_SETS

REPO_ROOT = os.path.dirname(PLUGIN_DIR)


def log(message: str = "") -> None:
    print(f"[compare] {message}", flush=True)


class ComparisonError(SystemExit):
    def __init__(self, message: str):
        super().__init__(f"compare_methods: error: {message}")


@dataclass(frozen=True)
class Method:
    name: str
    title: str
    paper: str
    arch: str
    flags: Tuple[str, ...] = ()
    style: str = "encdec"  # or "shared": one stack, one embedding by construction (see width_flags)
    criterion: Tuple[str, ...] = ()  # replaces the common criterion flags
    match: Optional[str] = None  # flag chosen to match the vanilla Transformer's parameter count
    note: str = ""
    #: the BLEU difference to its baseline that the paper reports for this configuration, and where
    paper_gap: Optional[Tuple[float, str]] = None
    #: its own peak learning rate and budget (a variant of the grid or of the longer budget), else the round's
    lr: Optional[float] = None
    max_update: Optional[int] = None
    #: with ``match``: the method whose parameter count is matched (else the vanilla Transformer's)
    match_target: str = "transformer"


DIVERSITY_CRITERION = ("--criterion", "label_smoothed_cross_entropy_with_layer_diversity", "--label-smoothing", "0.1",
                       "--diversity-lambda", "1.0")
#: One headline configuration per paper, at the common width. Order = table order. The notes are the report's
#: one-line summaries: examples/comparison/README.md ("The methods") gives each choice in full.
METHODS: Dict[str, Method] = {m.name: m for m in (
    Method("transformer", "Transformer (baseline)", "fairseq's vanilla Transformer", "transformer",
           note="post-norm, sinusoidal positions"),
    Method("mlrf", "MLRF Both-FNN-SA", "Wang et al. 2018, multi-layer representation fusion",
           "fusion_transformer", ("--fuse-encoder", "fnn", "--fuse-decoder", "sa"), note="the paper's best system",
           paper_gap=(+0.92, "IWSLT14 De-En, Table 2: 33.59 vs the 3-layer Transformer with restarted Adam, 32.67")),
    Method("deeprep", "Deep representations: hierarchical + diversity", "Dou et al. 2018 (EMNLP)",
           "fusion_transformer", ("--aggregate-encoder", "hierarchical", "--aggregate-decoder", "hierarchical"),
           criterion=DIVERSITY_CRITERION, note="the paper's final system, trained from scratch like every row",
           paper_gap=(+1.14, "WMT14 En-De, Transformer-Base, Table 1 row 9: 28.78 vs 27.64")),
    Method("surface_fusion", "Encoder layer fusion: SurfaceFusion (hard, 0.8)", "Liu et al. 2021",
           "fusion_transformer", ("--surface-fusion", "hard", "--surface-fusion-lambda", "0.8"),
           note="the paper's proposed method",
           paper_gap=(+1.3, "WMT16 Ro-En, Table 2: hard fusion 35.1 vs vanilla 33.8")),
    Method("fgla", "Encoder layer fusion: fine-grained layer attention", "Liu et al. 2021",
           "fusion_transformer", ("--layer-attention", "fine"), note="the second row of the same paper",
           paper_gap=(+0.65, "WMT16 Ro-En, Table 1: 34.45 vs 33.80")),
    Method("layerwise_coordination", "Layer-wise coordination", "He et al. 2018 (NeurIPS)",
           "layerwise_coordination", style="shared", match="--layers",
           note="one shared stack; depth matched to the Transformer's parameters, as the paper does",
           paper_gap=(+2.21, "IWSLT14 De-En, Table 1: 35.07 vs the small Transformer, 32.86")),
    Method("dense_transformer", "DenseNMT (dense Transformer, DenseAtt-2)", "Shen et al. 2018 (NAACL)",
           "dense_transformer", ("--dense-attention", "2", "--summary-every", "0"), match="--growth-dim",
           note="growth dimension matched to the Transformer's parameters, as the paper does",
           paper_gap=(+0.02, "IWSLT14 De-En, Table 1, embedding 128: DenseNMT-4L-2 30.01 vs the convolutional "
                             "BASE-4L 29.99 (+0.80 at 64, +0.97 at 256)")),
    Method("denseformer", "DenseFormer 1x1", "Pagliardini et al. 2024", "fusion_transformer",
           ("--denseformer-encoder", "--denseformer-decoder"), note="the paper measures language models, no BLEU"),
    Method("hyper_connections", "Hyper-connections DHCx4", "Zhu et al. 2025 (ICLR)", "fusion_transformer",
           ("--hyper-connections-encoder", "dynamic", "--hyper-connections-decoder", "dynamic",
            "--hyper-connections-rate", "4"), note="the paper measures language models, no BLEU"),
    Method("mhc", "Manifold-constrained hyper-connections (mHC) x4", "Xie et al. 2025",
           "fusion_transformer", ("--hyper-connections-encoder", "manifold", "--hyper-connections-decoder", "manifold",
                                  "--hyper-connections-rate", "4"), note="the paper measures language models, no BLEU"),
    Method("muddformer", "MUDDFormer", "Xiao et al. 2025 (ICML)", "fusion_transformer",
           ("--mudd-encoder", "--mudd-decoder"), note="the paper measures language models, no BLEU"),
    Method("transformer_wide", "Transformer, FFN widened to deep representations' size", "fairseq's vanilla "
           "Transformer", "transformer", match="--ffn-embed-dim", match_target="deeprep",
           note="the capacity-matched baseline: both FFN widths matched to deep representations' parameters"),
)}

def resolve_methods(names: Sequence[str]) -> List[Method]:
    wanted = [name.strip() for item in names for name in item.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in METHODS]
    if unknown or not wanted:
        problem = f"unknown method(s) {', '.join(map(repr, unknown))}" if unknown else "no method given"
        raise ComparisonError(f"--methods: {problem}; known methods: {', '.join(METHODS)} (the rows of the earlier "
                              "tables that are not among them ran at their pins: examples/comparison/deep.sh)")
    return [METHODS[name] for name in dict.fromkeys(wanted)]


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
        return f"{self.encoder_layers}+{self.decoder_layers} layers, d={self.dim}, FFN {self.ffn}, {self.heads} heads"


DEEP_WIDTH = "6+6:128:512:4"  # the 6+6 comparison's and the reviewed design's: the default
SMALL_WIDTH = "3+3:128:512:4"


def parse_width(text: str) -> Width:
    m = re.fullmatch(r"\s*(\d+)\+(\d+):(\d+):(\d+):(\d+)\s*", text or "")
    if not m:
        raise argparse.ArgumentTypeError(f"expected ENC+DEC:DIM:FFN:HEADS (e.g. {DEEP_WIDTH}), got {text!r}")
    width = Width(*(int(g) for g in m.groups()))
    if min(width.encoder_layers, width.decoder_layers, width.dim, width.ffn, width.heads) < 1:
        raise argparse.ArgumentTypeError(f"every number of --width must be positive, got {text!r}")
    if width.dim % width.heads:
        raise argparse.ArgumentTypeError(f"--width: d={width.dim} is not divisible by {width.heads} heads")
    return width


def width_flags(method: Method, width: Width) -> List[str]:
    if method.style == "shared":
        return ["--embed-dim", str(width.dim), "--ffn-embed-dim", str(width.ffn), "--attention-heads", str(width.heads)]
    flags = []
    for side, layers in (("encoder", width.encoder_layers), ("decoder", width.decoder_layers)):
        flags += [f"--{side}-layers", str(layers), f"--{side}-embed-dim", str(width.dim),
                  f"--{side}-ffn-embed-dim", str(width.ffn), f"--{side}-attention-heads", str(width.heads)]
    return flags + ["--share-all-embeddings"]


def match_candidates(method: Method, width: Width) -> List[int]:
    if method.match == "--layers":
        return list(range(1, 4 * (width.encoder_layers + width.decoder_layers) + 1))
    if method.match == "--ffn-embed-dim":
        return list(range(width.ffn, 8 * width.ffn + 1))
    step = width.heads * 8 // math.gcd(width.heads, 8)  # --growth-dim: divisible by the heads, a multiple of 8
    return list(range(step, 2 * width.dim + 1, step))


def match_parameter(count, candidates: Sequence[int], target: int) -> Tuple[int, int, Dict[int, int]]:
    """Binary search (few models built) for the candidate whose ``count`` is closest to ``target`` (ties: the
    smaller), ``count`` not decreasing along ``candidates``. Returns (value, its count, every count computed)."""
    seen: Dict[int, int] = {}

    def at(i):
        if candidates[i] not in seen:
            seen[candidates[i]] = count(candidates[i])
        return seen[candidates[i]]

    lo = min(bisect.bisect_left(range(len(candidates)), target, key=at), len(candidates) - 1)  # first count >= target
    best = lo - 1 if lo > 0 and abs(at(lo - 1) - target) <= abs(at(lo) - target) else lo
    return candidates[best], at(best), seen


def common_train_flags(settings: argparse.Namespace, src: str, tgt: str, total: Optional[int] = None,
                       lr: Optional[float] = None) -> List[str]:
    """The flags identical for all runs: the learning rate warms up, then decays linearly to 0 at ``total``
    updates, the run's budget (default ``--max-update``); ``lr``: a configuration's own peak rate, else ``--lr``.
    adam_with_overrides is fairseq's Adam honouring the parameters' own settings (no weight decay on
    hyper-connections' static weights)."""
    return [
        "--task", "translation", "--source-lang", src, "--target-lang", tgt,
        "--dropout", str(settings.dropout),
        "--optimizer", "adam_with_overrides", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", str(lr or settings.lr), "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(settings.warmup),
        "--end-learning-rate", "0", "--total-num-update", str(total or settings.max_update), "--weight-decay", "0.0001",
        "--max-tokens", str(settings.max_tokens),
        # validate + checkpoint every --eval-every updates and at the end only (not at epoch ends); every
        # interval checkpoint is kept: they are the resume points and the candidates of the evaluation
        "--save-interval-updates", str(settings.eval_every), "--validate-interval-updates", str(settings.eval_every),
        "--save-interval", "1000000", "--validate-interval", "1000000", "--no-epoch-checkpoints",
        # checkpoint selection on the NLL: the diversity criterion's loss includes its regulariser
        "--best-checkpoint-metric", "nll_loss",
        "--log-format", "json", "--log-interval", str(settings.log_interval),
        *BATCHES_IN_THREAD, "--required-batch-size-multiple", "1", "--skip-invalid-size-inputs-valid-test",
    ]


DEFAULT_CRITERION = ("--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1")


def matched_flags(method: Method, value: Optional[int]) -> List[str]:
    """The matched flag and its value (``--ffn-embed-dim``: both sides' FFN width)."""
    if not method.match:
        return []
    flags = ["--encoder-ffn-embed-dim", "--decoder-ffn-embed-dim"] if method.match == "--ffn-embed-dim" else [method.match]
    return [item for flag in flags for item in (flag, str(value))]


def model_flags(method: Method, width: Width, matched: Optional[int] = None) -> List[str]:
    return ["--arch", method.arch, *width_flags(method, width), *method.flags, *matched_flags(method, matched)]


def prepare_data(args) -> str:
    """The binarised data: ``--data-bin`` as given, else ``OUT/data/data-bin`` made (once) by
    ``fusion_lab.corpus prepare multi30k --from RAW`` (joint BPE, joined dictionary)."""
    dest = os.path.join(args.out, "data")
    data_bin = os.path.abspath(args.data_bin) if args.data_bin else os.path.join(dest, "data-bin")
    if os.path.isfile(os.path.join(data_bin, "recipe.env")):
        return data_bin
    if args.data_bin:
        raise ComparisonError(f"--data-bin: {data_bin}/recipe.env is missing (make the data with python -m "
                              "fusion_lab.corpus prepare multi30k, which records the references there)")
    if args.report_only:
        raise ComparisonError(f"--report-only: no prepared data in {data_bin}")
    if not args.raw:
        raise ComparisonError(f"--raw: not given, and {data_bin} holds no prepared data; give --raw DIR (the Multi30k "
                              "task-1 raw files train/val/test_*.de/.en) or --data-bin DIR")
    argv = ["prepare", "multi30k", "--from", os.path.abspath(args.raw), "--dest", dest, "--src", "de", "--tgt", "en",
            "--test-set", TEST_SETS[0], "--bpe-merges", str(args.bpe_merges)]
    log(f"preparing the data: python -m fusion_lab.corpus {shlex.join(argv)}")
    log_path = os.path.join(args.out, "logs", "prepare.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)

    def prepare(file):
        text = io.TextIOWrapper(file, encoding="utf-8", write_through=True)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            try:
                corpus.main(argv)
            except SystemExit as error:  # recipe.env, written last, is then missing
                print(error.code, file=text)
        text.detach()

    replace_atomically(log_path, prepare, keep_partial=True)
    if not os.path.isfile(os.path.join(data_bin, "recipe.env")):
        tail = "\n".join(corpus.read_lines(log_path))[-3000:]
        raise ComparisonError(f"preparing the data failed; log {log_path}:\n{tail}")
    return data_bin


def _build_counter(data_bin: str, settings, recipe: dict):
    """count(method, model flags) -> parameters of the model fairseq-train would build with the data's joined
    dictionary (:func:`fusion_lab.benchmark.build_model`: fairseq's own training parser)."""
    from fairseq.data import Dictionary

    from fusion_lab.benchmark import BenchmarkError, build_model

    dictionary = Dictionary.load(os.path.join(data_bin, f"dict.{recipe['SRC']}.txt"))

    @functools.lru_cache(maxsize=None)  # a configuration at several learning rates is one model
    def count_flags(arch: str, flags: Tuple[str, ...], criterion: Tuple[str, ...], name: str) -> int:
        try:
            return count_parameters(build_model(arch, [*flags, *shlex.split(settings.train_args or "")],
                                                dictionary, criterion, name)[2])
        except BenchmarkError as error:
            raise ComparisonError(str(error)) from None

    def count(method: Method, flags: List[str]) -> int:
        return count_flags(method.arch, tuple(flags), tuple(method.criterion or DEFAULT_CRITERION), method.name)

    return count


def make_plan(methods: List[Method], settings, data_bin: str, recipe: dict) -> dict:
    """Model flags and parameter counts of every method (the matched sizes solved), into ``OUT/plan.json``."""
    src, tgt = recipe["SRC"], recipe["TGT"]
    texts = [corpus.read_lines(os.path.join(data_bin, f"dict.{lang}.txt")) for lang in (src, tgt)]
    if texts[0] != texts[1]:
        raise ComparisonError(f"{data_bin}: the dictionaries of {src} and {tgt} differ; every method shares one joint "
                              "vocabulary (binarise with --joined-dictionary)")
    log(f"computing model sizes ({', '.join(m.name for m in methods)}) ...")
    count, width = _build_counter(data_bin, settings, recipe), settings.width
    targets = {name: count(METHODS[name], model_flags(METHODS[name], width))
               for name in dict.fromkeys(method.match_target for method in methods if method.match)}
    entries = {}
    for method in methods:
        value = None
        if method.match:
            target = targets[method.match_target]
            value, params, tried = match_parameter(
                lambda v, m=method: count(m, model_flags(m, width, v)), match_candidates(method, width), target)
            log(f"  {method.name}: {method.match} {value} -> {params:,} parameters "
                f"({method.match_target}: {target:,}; tried {len(tried)} values)")
        else:
            params = count(method, model_flags(method, width))
        entries[method.name] = {"model_flags": model_flags(method, width, value), "params": params,
                                "matched": {method.match: value} if method.match else None}
    _write_json(os.path.join(settings.out, "plan.json"), {"max_update": settings.max_update, "entries": entries})
    return entries


def _write_json(path: str, data) -> None:
    replace_atomically(path, lambda f: f.write((json.dumps(data, indent=2) + "\n").encode()))


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


#: what the report reads of a done.json (:func:`evaluate_run` writes it)
DONE_KEYS = ("sacrebleu", "tokenized_bleu", "params", "updates", "train_seconds", "generate_seconds",
             "updates_per_second", "devices", "finished", "sacrebleu_signature", "scores")


def finished_run(rdir: str) -> Optional[dict]:
    """The run's ``done.json`` once it is evaluated, else None. One unreadable or of another shape stops the runner
    wherever it is read: its scores cannot be trusted, and the checkpoints it scored are gone."""
    path = os.path.join(rdir, "done.json")
    if not os.path.lexists(path):
        return None
    done = _read_json(path)
    if not isinstance(done, dict) or any(key not in done for key in DONE_KEYS):
        raise ComparisonError(f"{path} is unreadable or not a record of this runner (truncated?): move it away "
                              "and remove the run's checkpoints to train and evaluate the run again")
    return done


INTERVAL_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt")


def interval_checkpoints(save_dir: str) -> Dict[int, str]:
    """{update: path} of fairseq's interval checkpoints (written atomically: one that exists is complete)."""
    names = os.listdir(save_dir) if os.path.isdir(save_dir) else []
    return dict(sorted((int(m.group(1)), os.path.join(save_dir, m.group(0)))
                       for m in map(INTERVAL_CHECKPOINT.fullmatch, names) if m))


def saved_updates(save_dir: str) -> int:
    return max(interval_checkpoints(save_dir), default=0)


def checkpoint_position(path: str) -> Optional[Tuple[int, int]]:
    """(the epoch its data iterator is at, updates) of a fairseq checkpoint; None when the file cannot be read
    (truncated, empty)."""
    import torch

    import fusion_fairseq.models  # noqa: F401  (registers the plugin; reads fairseq checkpoints under torch >= 2.6)

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
        return int(iterator.get("epoch", 1)), int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # noqa: BLE001 - any unreadable file: truncated, not a zip, not a checkpoint
        return None


def checkpoint_updates(path: str) -> Optional[int]:
    """None when the file cannot be read (truncated, empty)."""
    position = checkpoint_position(path)
    return position and position[1]


def resume_from_newest_intact(save_dir: str) -> None:
    """Make ``checkpoint_last.pt``, which fairseq resumes from, the newest checkpoint that reads: fairseq
    copies it from the interval checkpoint (not atomically), so a run killed during the copy leaves it
    truncated, and killed between the two writes, older. An unreadable one is kept beside it, renamed."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    last_updates = checkpoint_updates(last) if os.path.exists(last) else None
    intact = None
    for update, path in reversed(interval_checkpoints(save_dir).items()):
        if last_updates is not None and last_updates >= update:
            return
        if checkpoint_updates(path) == update:
            intact = update, path
            break
        log(f"{path} is unreadable; looking for an older checkpoint")
    if last_updates is None and os.path.exists(last):
        aside = f"{last}.unreadable-{int(time.time())}"
        os.replace(last, aside)
        log(f"{last} is unreadable (kept as {aside})")
    if intact:
        copy_file(intact[1], last)
        log(f"resuming from {os.path.basename(intact[1])} (update {intact[0]}): checkpoint_last.pt was "
            + ("older" if last_updates is not None else "missing or unreadable"))


def code_commit() -> Optional[str]:
    """The commit of the code that runs (``+modified`` when tracked files differ from it); None outside git."""
    def git(*args):
        return subprocess.check_output(["git", "-C", REPO_ROOT, *args], text=True, stderr=subprocess.DEVNULL).strip()

    try:
        return git("rev-parse", "HEAD") + ("+modified" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def run_dir(out: str, method: str, seed: int) -> str:
    return os.path.join(out, "runs", method, f"seed{seed}")


def check_config(rdir: str, config: dict) -> None:
    """Refuse a run directory started with other training flags (the plugin's location aside: a pinned
    checkout of the same code may resume or evaluate it)."""
    def flags(argv):  # "--flag value ..." of each flag
        return {item for item in re.split(r" (?=--)", shlex.join(argv)) if not item.startswith("--user-dir ")}

    stored = _read_json(os.path.join(rdir, "config.json"))
    old, new = flags((stored or config).get("train_argv") or []), flags(config["train_argv"])
    if old != new:
        raise ComparisonError(f"{rdir} was started with other settings (was: {'; '.join(sorted(old - new))[:300]}; "
                              f"now: {'; '.join(sorted(new - old))[:300]}); use another --out, the original settings, "
                              "or delete that run directory")


def with_this_plugin(argv: Sequence[str]) -> List[str]:
    """``argv`` with its ``--user-dir`` naming the plugin beside this file: a run folder's stored one (another
    checkout's, or code a config.json was edited to name) is never imported."""
    argv = list(argv)
    argv[argv.index("--user-dir") + 1] = PLUGIN_DIR
    return argv


def check_generation(rdir: str, beam: int, gen_args: Optional[str]) -> None:
    """Refuse to score a run with other generation settings than those it was trained with (its config.json),
    which :func:`evaluate_run` uses."""
    stored = _read_json(os.path.join(rdir, "config.json"))
    was, now = (stored["beam"], stored.get("gen_args") or ""), (beam, gen_args or "")
    if was != now:
        raise ComparisonError(f"--beam {now[0]} --gen-args {now[1]!r}: {rdir} was trained to be scored with --beam "
                              f"{was[0]} --gen-args {was[1]!r}; give those, or use another --out")


#: the runner's line in run.log before every fairseq-train it starts (the run's training record)
TRAINING_MARK = "==== fairseq-train "


def train_run(rdir: str, target: int, threads: Optional[int] = None) -> None:
    """``python -m fairseq_cli.train`` up to update ``target`` (resumed from ``checkpoint_last.pt``), appending
    to run.log, stopped and resumed at each update of the final average (:func:`averaging_window`), whose
    checkpoint :func:`keep_epoch_end` then keeps. The plugin is the one beside this file (``--user-dir``, first
    on the path), and ``-m`` imports from the working directory first: the run directory, never another
    checkout. ``threads``: torch's threads (default: the run's, ``--threads``)."""
    config = _read_json(os.path.join(rdir, "config.json"))
    argv = config["train_argv"]
    interval = int(argv[argv.index("--save-interval-updates") + 1])
    save_dir = os.path.join(rdir, "checkpoints")
    for stop in sorted({*averaging_window(target, interval), target}):
        if saved_updates(save_dir) < stop:
            train_to(rdir, config, stop, threads or config["threads"])


def keep_epoch_end(save_dir: str, update: int) -> None:
    """fairseq-train names no interval checkpoint at an update that ends an epoch: its checkpoint_last.pt is then
    that update's only copy, kept under the interval checkpoint's name (the run resumes from it, the final
    average reads it)."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    position = checkpoint_position(last) if update not in interval_checkpoints(save_dir) else None
    if position and position[1] == update:  # named by the epoch it ended (the checkpoint holds the next one)
        copy_file(last, os.path.join(save_dir, f"checkpoint_{max(1, position[0] - 1)}_{update}.pt"))


def train_to(rdir: str, config: dict, target: int, threads: Optional[int]) -> None:
    """One fairseq-train of :func:`train_run`, up to update ``target``."""
    import torch

    save_dir, log_path = os.path.join(rdir, "checkpoints"), os.path.join(rdir, "run.log")
    folder_without_links(save_dir, FAIRSEQ_TRAIN_WRITES)
    resume_from_newest_intact(save_dir)
    start = {"start": time.time(), "from": saved_updates(save_dir), "to": target, "commit": code_commit(),
             "device": f"{device_name('cuda')} (CUDA)" if config["device"] == "cuda" and torch.cuda.is_available() else
             f"CPU {cpu_name()}, {os.cpu_count()} cores, {threads or torch.get_num_threads()} torch threads",
             "cpu_flags": cpu_flags()}
    argv = [*with_this_plugin(config["train_argv"]), "--max-update", str(target), "--save-dir", save_dir,
            *(["--cpu"] if config["device"] == "cpu" else [])]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    with append_to_log(log_path) as f:
        f.write(f"\n{TRAINING_MARK}{json.dumps(start)}\n$ fairseq-train {shlex.join(argv)}\n")
        f.flush()
        rc = subprocess.call([*python_module_command("fairseq_cli.train"), *argv], stdout=f, stderr=subprocess.STDOUT,
                             env=env, cwd=rdir)
    if rc == 0:
        keep_epoch_end(save_dir, target)
    if rc != 0 or saved_updates(save_dir) < target:
        raise ComparisonError(f"fairseq-train stopped before update {target} (exit {rc}); see {log_path}")


FAIRSEQ_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ")
LOGGED_UPDATE = re.compile(r'"(?:valid_|train_)?num_updates": "?(\d+)')


def training_record(log_path: str) -> dict:
    """Training time, speed, devices and commits from run.log: every fairseq-train the runner started
    (:data:`TRAINING_MARK`) lasts until its last timestamped fairseq line (killed or not)."""
    starts = []
    for line in _log_lines(log_path):
        if line.startswith(TRAINING_MARK):
            starts.append(dict(json.loads(line[len(TRAINING_MARK):]), end=None, reached=None))
        elif starts:
            stamp, update = FAIRSEQ_TIME.match(line), LOGGED_UPDATE.search(line)
            if stamp:
                starts[-1]["end"] = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
            if update:
                starts[-1]["reached"] = int(update.group(1))
    seconds = sum(max(0.0, (s["end"] or s["start"]) - s["start"]) for s in starts)
    updates = sum(max(0, (s["reached"] or s["from"]) - s["from"]) for s in starts)
    return {"train_seconds": round(seconds, 1), "updates_per_second": round(updates / max(1e-9, seconds), 3),
            "devices": sorted({s["device"] for s in starts}),
            "trained_by": sorted({s.get("commit") or "unknown" for s in starts})}


def _log_lines(log_path: str) -> List[str]:
    return corpus.read_lines(log_path) if os.path.isfile(log_path) else []


def _last_number(log_path: str, pattern) -> Optional[int]:
    found = [m.group(1) for m in map(re.compile(pattern).search, _log_lines(log_path)) if m]
    return int(found[-1].replace(",", "")) if found else None


def final_average(save_dir: str, budget: int, interval: int) -> str:
    """The average of :func:`averaged_updates`, made once (atomically) into ``save_dir`` and kept: it is scored."""
    from fusion_lab.averaging import average_checkpoints

    path = os.path.join(save_dir, f"average-last{AVERAGED}-to-{budget}.pt")
    if not os.path.isfile(path):
        checkpoints = interval_checkpoints(save_dir)
        average_checkpoints([checkpoints[u] for u in averaged_updates(checkpoints, budget, interval)], path)
    return path


def averaging_window(budget: int, interval: int) -> List[int]:
    """The last :data:`AVERAGED` interval updates up to ``budget`` (fewer only where it holds fewer)."""
    return list(range(budget - budget % interval, 0, -interval))[:AVERAGED][::-1]


def averaged_updates(checkpoints: Dict[int, str], budget: int, interval: int) -> List[int]:
    """:func:`averaging_window`, all saved."""
    wanted = averaging_window(budget, interval)
    missing = [u for u in wanted if u not in checkpoints]
    if missing:
        raise ComparisonError(f"cannot average the last {AVERAGED} checkpoints up to update {budget}: "
                              f"no checkpoint of update(s) {', '.join(map(str, missing))}")
    return wanted


#: fairseq-generate's own code runs in this process (no start-up cost per test set), one test set at a time
GENERATING = threading.Lock()


def evaluate_run(rdir: str, budget: int, test_sets: Dict[str, dict]) -> None:
    """fairseq-generate with the final average on every test set, scored as ``corpus evaluate`` scores;
    ``done.json`` is written last, then the checkpoints that only served resuming go."""
    import fairseq_cli.generate as fairseq_generate
    from fairseq import options

    config = _read_json(os.path.join(rdir, "config.json"))
    recipe, save_dir, log_path = config["recipe"], os.path.join(rdir, "checkpoints"), os.path.join(rdir, "run.log")
    lowercase, compound_split = (recipe.get(key, "0") == "1" for key in ("LOWERCASE", "COMPOUND_SPLIT"))
    interval = int(config["train_argv"][config["train_argv"].index("--save-interval-updates") + 1])
    average = final_average(save_dir, budget, interval)
    started, scores = time.time(), {}
    for name, test_set in test_sets.items():
        out_dir = os.path.join(rdir, f"eval-beam{config['beam']}", "average", name)
        gen_argv = [test_set["data"], "--path", average, "--gen-subset", "test", "--source-lang", recipe["SRC"],
                    "--target-lang", recipe["TGT"], "--beam", str(config["beam"]), "--lenpen", "1.0", "--remove-bpe",
                    "@@ ", "--required-batch-size-multiple", "1", "--batch-size", "128", "--user-dir", PLUGIN_DIR,
                    "--results-path", out_dir, *BATCHES_IN_THREAD, *(["--cpu"] if config["device"] == "cpu" else []),
                    *shlex.split(config.get("gen_args") or "")]
        folder_without_links(out_dir, FAIRSEQ_GENERATE_WRITES)
        print("$ fairseq-generate " + shlex.join(gen_argv), flush=True)
        with GENERATING:
            fairseq_generate.main(options.parse_args_and_arch(options.get_generation_parser(), gen_argv))
        found = corpus.score(os.path.join(out_dir, "generate-test.txt"), out_dir, recipe["TGT"], test_set["raw_ref"],
                             test_set["tok_ref"], lowercase, compound_split)
        scores[name] = {key: found[key] for key in ("sacrebleu", "tokenized_bleu", "sacrebleu_signature", "sentences")}
        scores[name].update(hyp_detok=os.path.join(out_dir, "hyp.detok"), raw_ref=test_set["raw_ref"])
    scores["all"] = report.concatenated_bleu(scores, lowercase)
    done = {
        **{key: config[key] for key in ("method", "seed", "arch")}, "scores": {"average": scores},
        **{key: scores[TEST_SETS[0]][key] for key in ("sacrebleu", "tokenized_bleu", "sacrebleu_signature")},
        "params": _last_number(log_path, r"num\. (?:shared )?model params: ([\d,]+)") or config["params"],
        "updates": budget, "averaged_updates": averaged_updates(interval_checkpoints(save_dir), budget, interval),
        **training_record(log_path), "generate_seconds": round(time.time() - started, 1), "evaluated_by": code_commit(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "packages": sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                            if d.metadata["Name"]}, key=str.lower),  # what the run ran with
    }
    _write_json(os.path.join(rdir, "done.json"), done)  # the marker, before anything is removed
    if not config.get("keep_checkpoints"):
        for name in os.listdir(save_dir):
            if name.startswith("checkpoint") and name.endswith(".pt"):
                os.remove(os.path.join(save_dir, name))


AVERAGED = 5  # checkpoints averaged, as the Transformer setups the papers follow do


@functools.lru_cache(maxsize=None)
def run_statistics(rdir: str):
    """:func:`report.sentence_statistics` of a scored run's test sets together (computed once: a scored run
    is never scored again)."""
    scores = finished_run(rdir)["scores"]["average"]
    hypotheses, references = (report.read_concatenated(scores, key) for key in ("hyp_detok", "raw_ref"))
    return report.sentence_statistics(hypotheses, references, "case:lc" in scores["all"]["sacrebleu_signature"])


def paired_with_baseline(out: str, method: str, seed: int, baseline: str) -> Optional[dict]:
    """:func:`report.paired_bootstrap` against the baseline's run of the same seed (``baseline``: a run name, so
    the reference learning rate's for ``transformer``) once both are scored (cached
    while neither is scored anew); None for a method that is its own baseline."""
    rdir = run_dir(out, method, seed)
    system, base = finished_run(rdir), finished_run(run_dir(out, baseline, seed))
    if method == baseline or not (system and base):
        return None
    path, key = os.path.join(rdir, "paired.json"), [system["finished"], base["finished"]]
    cached = _read_json(path)
    if cached and cached.get("key") == key:
        return cached["paired"]
    system, base = system["scores"]["average"], base["scores"]["average"]
    references, baseline_text = (report.read_concatenated(base, name) for name in ("raw_ref", "hyp_detok"))
    paired = report.paired_bootstrap(references, baseline_text, report.read_concatenated(system, "hyp_detok"),
                                     "case:lc" in system["all"]["sacrebleu_signature"])
    _write_json(path, {"key": key, "paired": paired})
    return paired


def collect_run(out: str, method: str, seed: int, budget: int, baseline: str = "transformer") -> dict:
    """A run's scores once done, else its progress; its curve up to ``budget``."""
    rdir = run_dir(out, method, seed)
    log_path = os.path.join(rdir, "run.log")
    done = finished_run(rdir)
    run = {"seed": seed, "dir": os.path.relpath(rdir, out)}
    if done:
        scores = done["scores"]["average"]
        run.update({key: done[key] for key in done if key not in ("scores", "packages")}, status="done",
                   test={name: found["sacrebleu"] for name, found in scores.items()},
                   length_ratio=scores["all"]["length_ratio"], paired=paired_with_baseline(out, method, seed, baseline))
    else:
        updates = _last_number(log_path, LOGGED_UPDATE) or 0
        run.update(training_record(log_path), status="partial" if updates else "pending", updates=updates)
    run["curve"] = {str(u): round(v, 4) for u, v in learning_curve(log_path).items() if u <= budget}
    return run


def method_row(method: Method, runs: List[dict], plan_entry: dict) -> dict:
    done = [r for r in runs if r["status"] == "done"]
    # the figure's mean: over the finished seeds, or over the unfinished ones while none has finished
    curves = [{int(u): v for u, v in r["curve"].items()} for r in (done or runs) if r["curve"]]
    return {
        "method": method.name, "title": method.title, "paper": method.paper, "arch": method.arch,
        "baseline": "transformer", "method_flags": list(method.flags), "flags": plan_entry.get("model_flags"),
        "criterion": list(method.criterion or DEFAULT_CRITERION), "params": plan_entry.get("params"),
        "matched": plan_entry.get("matched"), "note": method.note,
        "paper_gap": list(method.paper_gap) if method.paper_gap else None, "runs": runs,
        **{key: report.summarise([r[key] for r in done]) for key in ("sacrebleu", "tokenized_bleu", "length_ratio")},
        "test": {name: report.summarise([r["test"][name] for r in done]) for name in (*TEST_SETS, "all")},
        "mean_curve": {str(u): round(v, 4) for u, v in report.mean_curve(curves).items()}, "curve_seeds": len(curves),
    }


#: The configurations of examples/comparison/reviewed/plan.md, in the order its parts train: the papers' rows and
#: both Transformers first, then today's layer fusion (the default of ``--methods``)
REVIEWED_ROUNDS = (("transformer", "transformer_wide", "deeprep", "surface_fusion", "mlrf", "dense_transformer",
                    "layerwise_coordination", "fgla"),
                   ("denseformer", "hyper_connections", "muddformer", "mhc"))
REVIEWED_METHODS = tuple(name for names in REVIEWED_ROUNDS for name in names)
#: compared besides every configuration against the Transformer: (configuration, its other baseline)
REVIEWED_EXTRA_COMPARISONS = (("deeprep", "transformer_wide"),)
REVIEWED_CPU_KIND = "AMD EPYC"
REVIEWED_SEEDS = (1, 2, 3, 4, 5, 6)


def at_learning_rate(method: Method, lr: float, reference: float) -> Method:
    """``method`` at peak rate ``lr``; at the round's reference rate it keeps its name (and run folders), so
    that runs of earlier rounds with the same function and flags count."""
    return replace(method, name=method.name if lr == reference else f"{method.name}@lr{lr:g}",
                   title=f"{method.title}, lr {lr:g}", lr=lr)


def at_budget(method: Method, updates: int) -> Method:
    return replace(method, name=f"{method.name}@{updates}", title=f"{method.title}, {updates} updates",
                   max_update=updates)


class Experiment:
    """The runs of one ``--out`` (examples/comparison/reviewed/plan.md): which step each needs next, in which
    order, and the report, in three stages, each decided by a rule fixed beforehand:

    1. the grid: every configuration at each rate of the rule's grid (:data:`seed_analysis.LEARNING_RATES`) on the
       first seed;
    2. every configuration at its chosen rate (``learning_rates.json``, :func:`seed_analysis.choose_learning_rate`
       on the validation NLL its grid runs logged at the budget) on the other seeds;
    3. the Transformer and every configuration decided better or worse on all seeds, at ``--longer-budget``
       updates (same warm-up, linear decay to 0 there) on ``--longer-seeds`` (``longer_budget.json``).

    Every configuration is compared with the Transformer at its own chosen rate, seeds paired
    (:func:`seed_analysis.compare_with_baselines`). Every decision is read back from the run directories
    (interval checkpoints, logs) and the files of ``--out`` (``plan.json``, ``learning_rates.json``,
    ``longer_budget.json``), so an invocation killed at any point is continued by the next."""

    def __init__(self, settings, methods: List[Method], data_bin: str, recipe: dict):
        self.settings, self.methods, self.data_bin, self.recipe = settings, methods, data_bin, recipe
        self.out = settings.out
        self.variants: Dict[str, Method] = {}
        known = (_read_json(os.path.join(self.out, "plan.json")) or {}).get("max_update", settings.max_update)
        if known != settings.max_update:  # plan.json holds the budget of --out; another one is refused
            raise ComparisonError(f"{self.out} was started with other settings (--max-update {known} -> "
                                  f"{settings.max_update}); use another --out or the original settings")
        self.plan = make_plan(self.concrete_methods(), settings, data_bin, recipe)

    @functools.lru_cache(maxsize=None)
    def data_sha256(self) -> str:
        """The identity of the data every run trains on: the binarised splits, the dictionaries and the BPE codes."""
        files = [os.path.join(self.data_bin, name) for name in os.listdir(self.data_bin)
                 if name.endswith((".bin", ".idx")) or name.startswith("dict.")]
        codes = os.path.join(os.path.dirname(self.data_bin), "code")
        return tree_sha256(files + ([codes] if os.path.isfile(codes) else []))

    def test_sets(self) -> Dict[str, dict]:
        """Every test set of :data:`TEST_SETS` tokenised, BPE'd with the data's codes and binarised with its
        dictionaries, exactly as ``corpus prepare multi30k`` prepares its one test set, under
        ``OUT/test-sets/NAME``; made once. Returns {name: {"data", "raw_ref", "tok_ref"}}."""
        codes = os.path.join(os.path.dirname(self.data_bin), "code")
        (src, tgt), raw = (self.recipe["SRC"], self.recipe["TGT"]), self.settings.raw
        sets = {}
        for name in TEST_SETS:
            where = os.path.join(self.out, "test-sets", name)
            sets[name] = {"data": os.path.join(where, "bin"), "raw_ref": os.path.join(where, f"raw.{tgt}"),
                          "tok_ref": os.path.join(where, f"tok.{tgt}")}
            if os.path.isfile(os.path.join(where, "bin", "done")):
                continue
            missing = [path for path in [os.path.join(raw or "", f"{name}.{lang}") for lang in (src, tgt)] + [codes]
                       if not os.path.isfile(path)]
            if missing:
                raise ComparisonError(f"cannot prepare the test set {name}: missing {', '.join(missing)} (give --raw "
                                      "DIR with the Multi30k test files, and data made by corpus prepare multi30k)")
            log(f"preparing the test set {name}")
            steps, lowercase = corpus.CORPORA["multi30k"].steps, self.recipe.get("LOWERCASE", "0") == "1"
            text = {"raw": {lang: corpus.read_lines(os.path.join(raw, f"{name}.{lang}")) for lang in (src, tgt)}}
            text["tok"] = {lang: list(map(corpus.Tokeniser(lang, steps, lowercase), lines))
                           for lang, lines in text["raw"].items()}
            text["test"] = {lang: list(map(corpus.Segmenter(codes), lines)) for lang, lines in text["tok"].items()}
            corpus.write_splits(text, where, (src, tgt))  # where/raw.LANG, tok.LANG and test.LANG
            corpus.binarise(where, os.path.join(where, "bin"), src, tgt, splits=("test",), dictionaries=[
                os.path.join(self.data_bin, f"dict.{lang}.txt") for lang in (src, tgt)])
            corpus.write_lines(os.path.join(where, "bin", "done"), [""])
        return sets

    def variant(self, method: Method, lr: float, budget: Optional[int] = None) -> Method:
        found = at_learning_rate(method, lr, self.settings.lr)
        found = at_budget(found, budget) if budget else found
        self.variants[found.name] = found
        return found

    def chosen_rates(self) -> Dict[str, float]:
        return (_read_json(os.path.join(self.out, "learning_rates.json")) or {}).get("chosen", {})

    def longer_methods(self) -> List[str]:
        return (_read_json(os.path.join(self.out, "longer_budget.json")) or {}).get("methods", [])

    def baselines(self) -> Set[str]:
        """The Transformer's runs at its chosen rate, at the budget and the longer one: the baselines of the
        comparisons, compared with nothing themselves."""
        chosen = self.main_variant(METHODS["transformer"])
        return set() if chosen is None else {chosen.name, at_budget(chosen, self.settings.longer_budget).name}

    def rates_not_chosen(self) -> Set[str]:
        """The grid's runs at a rate other than their configuration's chosen one (seed 1 only)."""
        chosen = self.chosen_rates()
        return {self.variant(m, lr).name for m in self.methods if m.name in chosen
                for lr in self.settings.learning_rates if lr != chosen[m.name]}

    def main_variant(self, method: Method) -> Optional[Method]:
        lr = self.chosen_rates().get(method.name)
        return None if lr is None else self.variant(method, lr)

    def runs(self) -> List[Tuple[str, int]]:
        """(method, seed): per round of :data:`REVIEWED_ROUNDS` (a method in none: the last), its grid then its
        other seeds (seed-major); then the Transformer at the longer budget; then every configuration decided."""
        settings, first, runs = self.settings, self.settings.seeds[0], []
        rounds = [[m for m in self.methods if m.name in names] for names in REVIEWED_ROUNDS]
        rounds.append([m for m in self.methods if m.name not in REVIEWED_METHODS])
        for methods in rounds:
            runs += [(self.variant(m, lr).name, first) for m in methods for lr in settings.learning_rates]
            chosen = [v for v in map(self.main_variant, methods) if v]
            runs += [(v.name, seed) for seed in settings.seeds[1:] for v in chosen]
        longer = [m for m in self.methods if m.name == "transformer" or m.name in self.longer_methods()]
        for method in sorted(longer, key=lambda m: m.name != "transformer"):
            lr = self.chosen_rates().get(method.name)
            if lr is not None:
                runs += [(self.variant(method, lr, settings.longer_budget).name, seed) for seed in settings.longer_seeds]
        return runs

    def seeds_of(self, name: str) -> List[int]:
        return [seed for method, seed in self.runs() if method == name]

    def method(self, name: str) -> Optional[Method]:
        if name not in self.variants:
            self.runs()
        return self.variants.get(name) or METHODS.get(name)

    def concrete_methods(self) -> List[Method]:
        return [self.method(name) for name in dict.fromkeys(name for name, _ in self.runs())]

    def rdir(self, name: str, seed: int) -> str:
        return run_dir(self.out, name, seed)

    def save_dir(self, name: str, seed: int) -> str:
        return os.path.join(self.rdir(name, seed), "checkpoints")

    def run_budget(self, name: str) -> int:
        return self.method(name).max_update or self.settings.max_update

    def trained_to(self, name: str, seed: int, budget: int) -> bool:
        """An interval checkpoint at ``budget``, or evaluated (which removes the checkpoints)."""
        return finished_run(self.rdir(name, seed)) is not None or saved_updates(self.save_dir(name, seed)) >= budget

    def choose_learning_rates(self) -> None:
        """Add to learning_rates.json the rate of every configuration whose grid runs all reached the budget."""
        path, budget, first = os.path.join(self.out, "learning_rates.json"), self.settings.max_update, self.settings.seeds[0]
        record = _read_json(path) or {"rule": seed_analysis.LEARNING_RATE_RULE, "seed": first, "budget": budget,
                                      "validation_nll": {}, "chosen": {}}
        for method in self.methods:
            grid = {lr: self.variant(method, lr) for lr in self.settings.learning_rates}
            if method.name in record["chosen"] or not all(self.trained_to(v.name, first, budget) for v in grid.values()):
                continue
            validation = {lr: learning_curve(os.path.join(self.rdir(v.name, first), "run.log")).get(budget)
                          for lr, v in grid.items()}
            record["validation_nll"][method.name] = {f"{lr:g}": nll for lr, nll in validation.items()}
            record["chosen"][method.name] = seed_analysis.choose_learning_rate(validation)
            _write_json(path, record)
            log(f"{method.name}: learning rate {record['chosen'][method.name]:g} chosen")
            self.plan = make_plan(self.concrete_methods(), self.settings, self.data_bin, self.recipe)

    def main_family(self) -> Dict[str, Tuple[str, str]]:
        """{comparison: (configuration, baseline)} at the chosen rates: every configuration against the
        Transformer, and :data:`REVIEWED_EXTRA_COMPARISONS` ("A vs B"); only those whose rates are chosen."""
        chosen = {m.name: v for m, v in ((m, self.main_variant(m)) for m in self.methods) if v}
        pairs = [(name, "transformer") for name in chosen if name != "transformer"]
        pairs += [pair for pair in REVIEWED_EXTRA_COMPARISONS if pair[0] in chosen and pair[1] in chosen]
        return {(chosen[a].name if b == "transformer" else f"{chosen[a].name} vs {chosen[b].name}"):
                (chosen[a].name, chosen[b].name) for a, b in pairs if "transformer" in chosen}

    def main_verdicts(self) -> Optional[Dict[str, dict]]:
        """:func:`seed_analysis.compare_with_baselines` over the whole family, once: when every configuration's
        rate is chosen and every run on every seed that it reads is scored; None before, or with no comparison."""
        family, chosen = self.main_family(), self.chosen_rates()
        if not family or any(method.name not in chosen for method in self.methods):
            return None
        names = {name for pair in family.values() for name in pair}
        if not all(finished_run(self.rdir(name, seed)) for name in names for seed in self.settings.seeds):
            return None
        statistics = {name: {seed: run_statistics(self.rdir(name, seed)) for seed in self.settings.seeds}
                      for name in names}
        runs = {comparison: statistics[configuration] for comparison, (configuration, _) in family.items()}
        runs.update({baseline: statistics[baseline] for _, baseline in family.values()})
        return seed_analysis.compare_with_baselines(runs, {comparison: baseline for comparison, (_, baseline)
                                                           in family.items()})

    def choose_longer_budget(self) -> None:
        path = os.path.join(self.out, "longer_budget.json")
        if os.path.isfile(path):
            return
        verdicts = self.main_verdicts()
        if verdicts is None:
            return
        decided = [name.split("@")[0] for name, found in verdicts.items()
                   if found["verdict"] != "undecided" and " vs " not in name]
        methods = [m.name for m in self.methods if m.name == "transformer" or m.name in decided]
        _write_json(path, {"rule": "the Transformer and every configuration decided better or worse than the "
                                   "Transformer on all seeds",
                           "budget": self.settings.longer_budget, "seeds": list(self.settings.longer_seeds),
                           "methods": methods, "verdicts": {name: found["verdict"] for name, found in verdicts.items()}})
        log(f"longer budget ({self.settings.longer_budget} updates) for: {', '.join(methods)}")
        self.plan = make_plan(self.concrete_methods(), self.settings, self.data_bin, self.recipe)

    def longer_verdicts(self) -> Optional[Dict[str, dict]]:
        """The configurations of stage 3 against the Transformer at the longer budget, once all are scored."""
        chosen, budget, seeds = self.chosen_rates(), self.settings.longer_budget, self.settings.longer_seeds
        names = {name: self.variant(METHODS[name], chosen[name], budget).name for name in self.longer_methods()}
        if "transformer" not in names or len(names) < 2 or not all(
                finished_run(self.rdir(name, seed)) for name in names.values() for seed in seeds):
            return None
        runs = {name: {seed: run_statistics(self.rdir(name, seed)) for seed in seeds} for name in names.values()}
        return seed_analysis.compare_with_baselines(
            runs, {name: names["transformer"] for key, name in names.items() if key != "transformer"})

    def next_step(self, name: str, seed: int) -> Optional[Tuple[str, int]]:
        """("train", up to update) or ("evaluate", at budget); None: done, or waiting for the budget."""
        if finished_run(self.rdir(name, seed)):
            return None
        saved, budget, stage = saved_updates(self.save_dir(name, seed)), self.run_budget(name), self.settings.stage
        if saved >= budget:
            return None if stage == "train" else ("evaluate", budget)
        return None if stage == "evaluate" else ("train", budget)

    def start(self, name: str, seed: int, step: str, updates: int) -> None:
        """One step, on the round's CPU kind only (plan.md: one kind of machine)."""
        settings, kind = self.settings, self.settings.cpu_kind
        if settings.device == "cpu" and kind and not cpu_name().startswith(kind):
            raise ComparisonError(f"--cpu-kind {kind}: this machine is {cpu_name()}; the round's runs train and are "
                                  "scored on one CPU kind only")
        method, rdir = self.method(name), self.rdir(name, seed)
        log(f"{name} seed {seed}: {'training up to update' if step == 'train' else 'evaluating at update'} {updates} "
            f"-> {rdir}/run.log")
        started = time.time()
        if step == "evaluate":
            check_generation(rdir, settings.beam, settings.gen_args)
            evaluate_run(rdir, updates, self.test_sets())
        else:
            src, tgt = self.recipe["SRC"], self.recipe["TGT"]
            config = {  # fairseq-train's argv without the budget, the save dir and the device (see train_run)
                "method": name, "seed": seed, "arch": method.arch, "params": self.plan[name]["params"],
                "train_argv": [self.data_bin, "--user-dir", PLUGIN_DIR, *self.plan[name]["model_flags"],
                               *(method.criterion or DEFAULT_CRITERION),
                               *common_train_flags(settings, src, tgt, self.run_budget(name), method.lr),
                               "--seed", str(seed), *shlex.split(settings.train_args)],
                "data_bin": self.data_bin, "data_sha256": self.data_sha256(), "beam": settings.beam,
                "gen_args": settings.gen_args, "recipe": self.recipe, "device": settings.device,
                "threads": settings.threads, "keep_checkpoints": settings.keep_checkpoints}
            check_config(rdir, config)
            os.makedirs(rdir, exist_ok=True)
            _write_json(os.path.join(rdir, "config.json"), config)
            train_run(rdir, updates)
        log(f"{name} seed {seed}: {step} finished in {time.time() - started:.0f}s")

    def run(self) -> List[str]:
        """Train and evaluate, --jobs runs at a time, while any can go on; returns the failed runs."""
        failed, running = set(), {}
        if self.settings.stage != "train":
            self.test_sets()  # once, before the runs read them
        with ThreadPoolExecutor(max_workers=self.settings.jobs) as pool:
            while True:
                try:
                    self.choose_learning_rates()
                    self.choose_longer_budget()
                except ValueError as error:  # the plan's rules cannot decide (a grid that diverged): a person must
                    raise ComparisonError(str(error)) from None
                for run in self.runs():
                    step = None if run in failed | set(running.values()) else self.next_step(*run)
                    if step and len(running) < self.settings.jobs:
                        running[pool.submit(self.start, *run, *step)] = run
                if not running:
                    return [f"{name} seed {seed}" for name, seed in sorted(failed)]
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    run = running.pop(future)
                    if isinstance(future.exception(), ComparisonError):
                        log(f"{run[0]} seed {run[1]} FAILED: {future.exception()}")
                        failed.add(run)
                    else:
                        future.result()  # anything else is a defect: raised
                self.report(quiet=True)

    def collect(self) -> dict:
        settings, methods = self.settings, self.concrete_methods()
        rows = [method_row(m, [collect_run(self.out, m.name, seed, self.run_budget(m.name))
                               for seed in self.seeds_of(m.name)], self.plan.get(m.name, {})) for m in methods]
        verdicts, longer = self.main_verdicts(), self.longer_verdicts()
        baselines, not_chosen = self.baselines(), self.rates_not_chosen()
        for row in rows:  # each configuration's row shows its verdict against the Transformer
            found = {**(verdicts or {}), **(longer or {})}.get(row["method"])
            if found:
                row["baseline"] = found["baseline"]
                row["verdict"] = {"difference": round(found["difference"], 2), "verdict": found["verdict"],
                                  "ci95": [round(found["ci"][0], 2), round(found["ci"][1], 2)]}
            elif row["method"] in baselines:
                row["baseline"] = row["method"]
            elif row["method"] in not_chosen:
                row["baseline"] = None  # compared with nothing: no verdict will come
        runs = [run for row in rows for run in row["runs"]]
        seconds = sum((run.get("train_seconds") or 0) + (run.get("generate_seconds") or 0) for run in runs)
        return {
            "task": "Multi30k De->En (train / val / " + ", ".join(TEST_SETS) + ")", "data_bin": self.data_bin,
            "settings": {**{k: v for k, v in vars(settings).items() if k not in ("width", "out", "force")},
                         "methods": [m.name for m in methods], "seeds": sorted({seed for _, seed in self.runs()}),
                         "width": str(settings.width), "width_text": settings.width.describe(), "averaged": AVERAGED,
                         "common_flags": common_train_flags(settings, "SRC", "TGT"),
                         "default_criterion": list(DEFAULT_CRITERION)},
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"), "methods": rows,
            # the runs' torch threads are known only where --threads gave them (else torch takes every core)
            "cpu_hours": {"planned": settings.planned_cpu_hours,
                          "actual": round(seconds * settings.threads / 3600, 1) if settings.threads else None},
            "reviewed": {"learning_rates": _read_json(os.path.join(self.out, "learning_rates.json")),
                         "longer_budget": _read_json(os.path.join(self.out, "longer_budget.json")),
                         "family": self.main_family(), "verdicts": verdicts, "longer_verdicts": longer},
        }

    def report(self, quiet: bool = False) -> dict:
        """results.json, results.md and learning_curves.png from what exists."""
        try:
            results = self.collect()
            _write_json(os.path.join(self.out, "results.json"), results)
            markdown = report.markdown(results).encode()
            replace_atomically(os.path.join(self.out, "results.md"), lambda f: f.write(markdown))
            report.plot_curves(results, os.path.join(self.out, "learning_curves.png"))
            return results
        except Exception as error:  # noqa: BLE001 - a report must not stop the training of the other runs
            if not quiet:
                raise
            log(f"warning: could not write the intermediate report: {error}")
            return {}


def parse_settings(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="compare_methods.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train the vanilla Transformer and every paper's headline configuration at a matched size with "
        "one budget on Multi30k De->En in the design of examples/comparison/reviewed/plan.md: each configuration at "
        "its own peak learning rate, chosen from a grid on the first seed by the validation NLL, on paired seeds, "
        "then a longer budget for the Transformer and every configuration decided better or worse; report BLEU per "
        "seed, the paired verdicts, parameters and learning curves. Resumable: run the same command again to "
        "continue.", epilog="The 3+3 and 6+6 comparisons (--deep) ran with the runner of their pins: "
        "examples/comparison/converged.sh and deep.sh.")
    p.add_argument("--methods", nargs="+", default=list(REVIEWED_METHODS),
                   help=f"methods (space- or comma-separated) from: {', '.join(METHODS)}")
    p.add_argument("--reviewed", action="store_true", help="accepted for earlier command lines: this design is the "
                   "only one")
    p.add_argument("--seeds", nargs="+", type=int, default=list(REVIEWED_SEEDS), help="the paired seeds (at least 2)")
    p.add_argument("--out", default="comparison_out", help="output directory (runs, data, results)")
    g = p.add_argument_group("data")
    g.add_argument("--raw", help="Multi30k raw files (train/val/test_*.de/.en): to prepare the data and the test sets")
    g.add_argument("--data-bin", help="binarised data made by python -m fusion_lab.corpus prepare multi30k")
    g.add_argument("--bpe-merges", type=positive_int, default=8000, help="joint BPE merges when preparing the data")
    g = p.add_argument_group("models")
    w = g.add_mutually_exclusive_group()
    w.add_argument("--width", type=parse_width, default=parse_width(DEEP_WIDTH),
                   help="common size ENC+DEC:DIM:FFN:HEADS")
    w.add_argument("--small", dest="width", action="store_const", const=parse_width(SMALL_WIDTH),
                   help=f"the small CPU preset --width {SMALL_WIDTH}")
    g.add_argument("--dropout", type=float, default=0.1)
    g = p.add_argument_group("budget (identical for every run of a stage)")
    g.add_argument("--max-update", type=positive_int, default=3000, help="updates of every run of stages 1 and 2")
    g.add_argument("--max-tokens", type=positive_int, default=4096)
    g.add_argument("--longer-budget", type=positive_int, help="the updates of stage 3, twice --max-update when not given")
    g.add_argument("--longer-seeds", type=int, nargs="+", help="the seeds of stage 3, the first three --seeds "
                   "when not given")
    g.add_argument("--cpu-kind", default=REVIEWED_CPU_KIND, help="train and score only on a CPU whose name starts "
                   "so ('' for any)")
    g.add_argument("--warmup", type=positive_int, default=250, help="warm-up updates")
    g.add_argument("--planned-cpu-hours", type=float, help="the plan's CPU-hours, put beside the actual in the report")
    g.add_argument("--eval-every", type=positive_int, default=250, help="updates between validations and checkpoints")
    g.add_argument("--beam", type=positive_int, default=5)
    g.add_argument("--train-args", default="", help="extra fairseq-train flags for every run (e.g. '--fp16')")
    g.add_argument("--gen-args", default="", help="extra fairseq-generate flags for every run's test translation")
    g = p.add_argument_group("execution")
    g.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    g.add_argument("--jobs", type=positive_int, default=1, help="runs in parallel")
    g.add_argument("--threads", type=positive_int,
                   help="torch threads per run (default: torch's own; with --jobs N on CPU: cores / N)")
    g.add_argument("--keep-checkpoints", action="store_true", help="keep every checkpoint, not only the scored average")
    g.add_argument("--stage", choices=("all", "train", "evaluate"), default="all", help="train: train every run to its "
                   "budget and evaluate none (e.g. from a pinned checkout); evaluate: only evaluate the runs that did")
    g.add_argument("--report-only", action="store_true", help="train nothing; collect what exists and write the report")
    g.add_argument("--force", action="store_true",
                   help="use an --out that holds results, runs or data this tool did not write (they are replaced)")
    g.add_argument("--log-interval", type=positive_int, default=50, help=argparse.SUPPRESS)
    settings = p.parse_args(argv)
    # the grid and its reference rate (whose runs keep the method's own name) are the learning-rate rule's
    settings.learning_rates = list(seed_analysis.LEARNING_RATES)
    settings.lr = seed_analysis.DEFAULT_LEARNING_RATE
    settings.longer_budget = settings.longer_budget or 2 * settings.max_update
    settings.longer_seeds = settings.longer_seeds or settings.seeds[:3]
    return settings


def main(argv: Optional[Sequence[str]] = None) -> dict:
    settings = parse_settings(argv)
    methods = resolve_methods(settings.methods)
    check_settings(settings, methods)
    import torch

    settings.device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if settings.threads is None and settings.device == "cpu" and settings.jobs > 1:
        settings.threads = max(1, (os.cpu_count() or 1) // settings.jobs)  # the cores shared out
    if settings.threads:
        torch.set_num_threads(settings.threads)  # the test translations are made in this process
    # the root logger on the console, before fairseq-generate would bind it to its first output file
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout)
    settings.out = os.path.abspath(settings.out)
    claim_out_dir(settings.out, OUT_NAMES, "fusion-fairseq compare_methods.py", settings.force, "compare_methods.py",
                  ComparisonError)
    data_bin = prepare_data(settings)
    experiment = Experiment(settings, methods, data_bin, corpus.read_recipe_env(data_bin))
    done = [run for run in experiment.runs() if finished_run(experiment.rdir(*run))]
    for name, seed in done:
        log(f"{name} seed {seed}: already done, not retrained")
    log(f"{len(done)} of {len(experiment.runs())} runs done; "
        + ("reporting only" if settings.report_only else f"stage '{settings.stage}' with {settings.jobs} job(s) on "
           f"{settings.device}") + f"; results -> {settings.out}/results.md")
    failed = [] if settings.report_only else experiment.run()
    results = experiment.report()
    log(f"wrote {settings.out}/results.md, results.json and learning_curves.png")
    if failed:
        raise ComparisonError(f"{len(failed)} run(s) failed: {', '.join(failed)} (see their run.log)")
    return results


#: what this tool writes into --out: a folder holding one of them without its stamp is refused (without --force)
OUT_NAMES = ("results.md", "results.json", "learning_curves.png", "plan.json", "learning_rates.json",
             "longer_budget.json", "runs", "data", "test-sets")


def check_settings(settings, methods: List[Method]) -> None:
    """Before any work. Every update a run stops at must be a multiple of --eval-every: fairseq writes the
    interval checkpoints (the resume points and the averaged ones) only there."""
    if "transformer" not in [method.name for method in methods]:
        log("note: the baseline 'transformer' is not among --methods; its size is still the matching target")
    for flag, seeds in (("--seeds", settings.seeds), ("--longer-seeds", settings.longer_seeds)):
        if len(set(seeds)) != len(seeds) or len(seeds) < 2:
            raise ComparisonError(f"{flag} {' '.join(map(str, seeds))}: at least 2 distinct seeds (the paired "
                                  "analysis needs the spread between seeds)")
    extra = sorted(set(settings.longer_seeds) - set(settings.seeds))
    if extra:
        raise ComparisonError(f"--longer-seeds: {extra} not among --seeds (the longer runs pair with them)")
    for flag, updates in (("--max-update", settings.max_update), ("--longer-budget", settings.longer_budget)):
        if updates % settings.eval_every:
            raise ComparisonError(f"{flag} {updates}: not a multiple of --eval-every {settings.eval_every}, the only "
                                  "updates with a checkpoint")


def train_one(argv: Sequence[str]) -> None:
    """``python -m fusion_lab.comparison _train RUN_DIR UPDATE`` (``launch.sh train-one``): one run
    that the runner made, trained alone up to UPDATE with the threads of ``OMP_NUM_THREADS``."""
    if len(argv) != 2 or not argv[1].isdigit() or not os.path.isfile(os.path.join(argv[0], "config.json")):
        raise ComparisonError(f"_train RUN_DIR UPDATE: RUN_DIR a run folder with its config.json, UPDATE a "
                              f"number; got {' '.join(argv)!r}")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    train_run(argv[0], int(argv[1]), int(threads) if threads.isdigit() else None)


if __name__ == "__main__":
    train_one(sys.argv[2:]) if sys.argv[1:2] == ["_train"] else main()

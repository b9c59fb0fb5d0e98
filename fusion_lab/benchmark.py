"""The speed tool: training and decoding cost of the plugin's models against fairseq's vanilla
Transformer, measured in one process, and the training time a model needs to reach another's loss.

    fusion-fairseq-benchmark --repeats 3 --threads 1 --archs mlrf_iwslt_de_en \\
        --variant "Enc-FNN=fusion_transformer:--fuse-encoder fnn" --json bench.json --markdown bench.md
    fusion-fairseq-benchmark --source-lengths 8,16,32 ...   # also the decoding step cost as the source grows
    fusion-fairseq-benchmark --time-to-loss residual.log dense.log [--json t.json]   # from fairseq-train logs

Every configuration is built at one matched width on one synthetic vocabulary and seed, and the
configurations are interleaved round by round; each figure is a ratio to the baseline within a
round: the median across rounds, with its distribution-free 95% interval from 6 rounds on (else the
rounds' range). The method and its choices: docs/measurements.md.
"""

import argparse
import contextlib
import functools
import io
import itertools
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import fairseq
from fairseq import criterions, options, utils
from fairseq.data.language_pair_dataset import collate
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

import fusion_fairseq.models  # noqa: F401  (registers the plugin)
from fusion_lab.analysis import (
    UsageError, add_force_argument, check_outputs, checked, format_matrix, markdown_rows, number, write_json,
    write_markdown)
from fusion_lab.common import (
    count_parameters, device_name, dictionary_of_size, learning_curve, load_average, non_negative_int,
    plugin_architectures, positive_int, updates_to_reach)
from fusion_lab.corpus import read_lines

PROG = "fusion-fairseq-benchmark"  # the console script; scripts/benchmark.py runs the same main()
BASELINE_NAME = "vanilla"
AUTOCAST = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
CRITERIA = ("label_smoothed_cross_entropy", "cross_entropy")
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
VARIANT_EXAMPLE = '"Enc-FNN=fusion_transformer:--fuse-encoder fnn"'

# benchmark setting -> alternative groups of model flags it sets: the first group of which the
# architecture defines any flag is used (encoder/decoder flags, else the flag of a single shared
# stack such as layer-wise coordination's --embed-dim). The depth of a shared stack (--layers) is
# not mapped: no number of shared layers "matches" an N+M encoder-decoder.
WIDTH_FLAGS = {
    "encoder_layers": (("--encoder-layers",),),
    "decoder_layers": (("--decoder-layers",),),
    "embed_dim": (("--encoder-embed-dim", "--decoder-embed-dim"), ("--embed-dim",)),
    "ffn_dim": (("--encoder-ffn-embed-dim", "--decoder-ffn-embed-dim"), ("--ffn-embed-dim",)),
    "heads": (("--encoder-attention-heads", "--decoder-attention-heads"), ("--attention-heads",)),
    "dropout": (("--dropout",),),
}


BenchmarkError = UsageError  # a bad configuration or setting; the message names the flag or the spec at fault


@dataclass
class BenchmarkConfig:
    name: str
    arch: str
    flags: List[str] = field(default_factory=list)
    baseline: bool = False


def check_arch(arch: str, where: str) -> None:
    if arch not in ARCH_MODEL_REGISTRY:
        plugin = plugin_architectures()
        others = sorted(a for a in ARCH_MODEL_REGISTRY if a not in plugin)
        raise BenchmarkError(f"{where}: unknown architecture {arch!r}. Known architectures -- this plugin's: "
                             f"{', '.join(plugin)}; fairseq's and others: {', '.join(others)}")


def split_flags(text: str, where: str) -> List[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BenchmarkError(f"{where}: cannot split flags {text!r}: {exc}") from None


def parse_variant(spec: str) -> BenchmarkConfig:
    """``NAME=ARCH:FLAGS`` (``:FLAGS`` optional) -> a configuration."""
    name, equals, rest = spec.partition("=")
    arch, _, flag_text = rest.partition(":")
    name, arch = name.strip(), arch.strip()
    fault = "no '='" if not equals else "empty NAME" if not name else "empty ARCH" if not arch else None
    if fault:
        raise BenchmarkError(f"malformed --variant {spec!r}: expected NAME=ARCH:FLAGS, e.g. {VARIANT_EXAMPLE} "
                             f"({fault})")
    check_arch(arch, f"--variant {spec!r}")
    return BenchmarkConfig(name, arch, split_flags(flag_text, f"--variant {spec!r}"))


def build_configs(archs: Optional[Sequence[str]] = None, variants: Sequence[str] = (),
                  baseline_arch: str = "transformer") -> List[BenchmarkConfig]:
    """The baseline first, then ``archs`` (default: every plugin architecture), then the variants."""
    check_arch(baseline_arch, "--baseline-arch")
    configs = [BenchmarkConfig(BASELINE_NAME, baseline_arch, [], baseline=True)]
    for arch in plugin_architectures() if archs is None else archs:
        check_arch(arch, "--archs")
        configs.append(BenchmarkConfig(arch, arch, []))
    configs.extend(parse_variant(spec) for spec in variants)
    twice = [name for name, count in Counter(config.name for config in configs).items() if count > 1]
    if twice:
        raise BenchmarkError(f"duplicate configuration name {twice[0]!r} ({BASELINE_NAME!r} is the baseline's name, "
                             "architectures are named after themselves); give each --variant its own NAME")
    return configs


def model_option_actions(arch: str) -> Dict[str, argparse.Action]:
    """The options the architecture's model class defines in ``add_args`` (flag -> action)."""
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    return {flag: action for action in parser._actions for flag in action.option_strings}


def takes_number(action: argparse.Action, value) -> bool:
    """Whether the option parses ``value`` into a number (fconv's ``--encoder-layers`` is a str
    expression; flags with validating types such as ``positive_int`` qualify; switches take nothing)."""
    try:
        return action.nargs is None and type(action.type(str(value))) in (int, float)
    except (argparse.ArgumentTypeError, TypeError, ValueError):  # TypeError: no type at all
        return False


def width_flags(arch: str, settings: argparse.Namespace):
    """(flags to pass, skipped flags with the reason) for the matched width."""
    actions = model_option_actions(arch)
    flags, skipped = [], []
    for setting, alternatives in WIDTH_FLAGS.items():
        value = getattr(settings, setting)
        for flag in next((g for g in alternatives if any(flag in actions for flag in g)), alternatives[0]):
            if flag not in actions:
                skipped.append(f"{flag} (not an option of {arch}; left to the architecture)")
            elif not takes_number(actions[flag], value):
                skipped.append(f"{flag} (does not take the number {value}; give it in a --variant's flags)")
            else:
                flags += [flag, str(value)]
    return flags, skipped


def config_flags(config: BenchmarkConfig, settings: argparse.Namespace):
    """(the model flags of ``config``: matched width, common flags, its own; the skipped width flags)."""
    flags, skipped = width_flags(config.arch, settings)
    return flags + list(settings.common_flags) + list(config.flags), skipped


def build_model(arch: str, flags: List[str], dictionary, criterion_flags=(), name=None):
    """``(args, task, model)``: the flags parsed like ``fairseq-train`` (architecture and criterion
    defaults included), a stand-in task with ``dictionary`` on both sides and the model built by
    the architecture; a flag fairseq rejects is a BenchmarkError naming the configuration."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = options.parse_args_and_arch(options.get_training_parser(),
                                               ["unused-data-dir", "--arch", arch, *flags, *criterion_flags])
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()
        raise BenchmarkError(f"configuration {name or arch!r} ({arch}): fairseq rejected the flags "
                             f"{shlex.join(flags)!r}: {message[-1] if message else 'argument error'}") from None
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    try:
        return args, task, ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    except Exception as exc:
        raise BenchmarkError(f"configuration {name or arch!r} ({arch}): building the model failed: {exc}") from exc


class _Runner:
    """One configuration: its model, optimiser, criterion, generators and the shared batches."""

    def __init__(self, config, settings, dictionary, samples, device):
        self.config, self.settings = config, settings
        self.where = f"configuration {config.name!r} ({config.arch})"
        train_sample, decode_sample, self.sweep_samples = samples
        self.flags, self.skipped_width_flags = config_flags(config, settings)
        criterion_flags = ["--criterion", settings.criterion] + (
            ["--label-smoothing", str(settings.label_smoothing)] if settings.criterion == CRITERIA[0] else [])
        torch.manual_seed(settings.seed)
        args, task, self.model = build_model(config.arch, self.flags, dictionary, criterion_flags, config.name)
        self.model.to(device)
        self.model_args = json.loads(json.dumps({action.dest: getattr(args, action.dest, None) for action in
                                                 model_option_actions(config.arch).values()}, default=str))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.lr, betas=(0.9, 0.98), eps=1e-8)
        self.scaler = torch.amp.GradScaler("cuda", enabled=settings.dtype == "fp16")
        self.criterion = criterions.build_criterion(args, task)
        dtype = AUTOCAST[settings.dtype]
        self.autocast = functools.partial(torch.autocast, device.type, dtype=dtype, enabled=dtype is not None)
        self.sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        # min_len = max_len: every hypothesis has exactly that many tokens + EOS, whatever the untrained model
        self.generators = {length: SequenceGenerator([self.model], dictionary, beam_size=settings.beam, max_len_a=0,
                                                     max_len_b=length, min_len=length)
                           for length in (settings.decode_len, settings.decode_len // 2)}
        # measure -> (its step, untimed and timed steps a round, what a step processes: target tokens, sentences)
        self.loops = {"train": (functools.partial(self.train_step, train_sample), settings.warmup, settings.steps,
                                train_sample["ntokens"]),
                      "decode": (functools.partial(self.decode, decode_sample, settings.decode_len),
                                 settings.decode_warmup, settings.decode_batches, decode_sample["nsentences"])}
        self.values, self.memory, self.flops = {}, {}, {}  # values: per measure, per round

    def train_step(self, sample):
        with self.autocast():
            loss, sample_size, _ = self.criterion(self.model, sample)
        self.scaler.scale(loss / sample_size).backward()  # a scaler that is not enabled passes everything through
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def decode(self, sample, length: int):
        """One batch decoded by the generator of ``length``, checked to give ``length`` tokens + EOS a hypothesis."""
        with self.autocast():
            hypos = self.generators[length].generate([self.model], sample)
        lengths = {len(h["tokens"]) for sentence in hypos for h in sentence}
        if len(hypos) != sample["nsentences"] or lengths != {length + 1}:
            raise ValueError(f"min_len = max_len = {length} should give {sample['nsentences']} sentences of exactly "
                             f"{length + 1} tokens (EOS included), got {len(hypos)} with lengths {sorted(lengths)}")

    def timed(self, step, warmup: int, repeats: int, failed: str) -> float:
        """Seconds of ``repeats`` calls of ``step`` after ``warmup`` untimed ones."""
        clock = CLOCKS[self.settings.clock]
        try:
            for _ in range(warmup):
                step()
            self.sync()
            start = clock()
            for _ in range(repeats):
                step()
            self.sync()
            return clock() - start
        except Exception as exc:
            raise BenchmarkError(f"{self.where}: {failed} failed: {exc}") from exc

    def measure(self, what) -> float:
        """One round's value of ``what``: "train", target tokens/s of training steps; "decode", sentences/s of
        decode batches; a source length N, milliseconds of one decoding step over N-token sources, (t(L) - t(L/2)) /
        (L - L/2): the difference of two whole ``generate`` calls with L and L/2 output tokens, so that what is paid
        once per sentence (the encoder, the first step's projection of the source, the generator's set-up) cancels."""
        self.model.train(what == "train")
        torch.manual_seed(self.settings.seed)
        if what in self.loops:
            step, warmup, repeats, items = self.loops[what]
            value = repeats * items / self.timed(step, warmup, repeats, f"{what} step")
        else:  # one untimed call of each length warms the caches
            full, half = self.generators
            seconds = [self.timed(functools.partial(self.decode, self.sweep_samples[what], length), 1, 1,
                                  f"decoding a {what}-token source") for length in (full, half)]
            value = 1000 * (seconds[0] - seconds[1]) / (full - half)
        self.values.setdefault(what, []).append(value)
        return value

    def once(self, measure: Callable[[Callable[[], None]], object]) -> Dict[str, object]:
        """``{"train": measure(one training step), "decode": measure(one decode batch)}``, untimed."""
        torch.manual_seed(self.settings.seed)
        results = {}
        for what, (step, *_) in self.loops.items():
            self.model.train(what == "train")
            results[what] = measure(step)
        return results

    def measure_memory(self, transient_peak: Callable[[Callable[[], None]], Optional[int]]):
        peak = self.once(transient_peak)
        parameters = sum(p.numel() * p.element_size() for p in self.model.parameters())
        train_state = parameters + sum(v.numel() * v.element_size() for state in self.optimizer.state.values()
                                       for v in state.values() if torch.is_tensor(v))  # + Adam's moments
        self.memory = {"train_peak_bytes": None if peak["train"] is None else train_state + peak["train"],
                       "decode_peak_bytes": None if peak["decode"] is None else parameters + peak["decode"],
                       "parameter_bytes": parameters, "train_state_bytes": train_state}


def count_flops(step) -> int:
    """Matrix-product FLOPs of ``step``."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def cuda_transient_peak(fn) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - base)


def cpu_transient_peak(fn) -> Optional[int]:
    """Peak of the net bytes allocated by PyTorch's CPU allocator while ``fn`` runs: the running sum, in time order,
    of the allocation / free events torch.profiler records (the events' ``total_allocated`` is cumulative across
    profiling sessions). A block allocated before and freed during ``fn`` is not subtracted, so the peak can only be
    overestimated. None where this torch's profiler does not expose allocation events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:  # the profiler's private interfaces
        from torch._C._profiler import _EventType
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
    except (ImportError, AttributeError):
        return None
    events = []
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and str(node.extra_fields.device) == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    return max(itertools.accumulate((size for _, size in sorted(events)), initial=0))


MEMORY_METHOD = {
    "cuda": "PyTorch tensor bytes at the peak: parameters + Adam state (+ for training) plus "
            "torch.cuda.max_memory_allocated() - memory_allocated() over one training step / one decode batch",
    "cpu": "PyTorch tensor bytes at the peak: parameters + Adam state (+ for training) plus the peak net "
           "allocation of PyTorch's CPU allocator over one training step / one decode batch "
           "(torch.profiler, profile_memory=True); RSS and non-PyTorch allocations not counted",
}


def synthetic_samples(settings: argparse.Namespace, dictionary, device):
    """One training batch, one decode batch and one decode batch per ``--source-lengths`` length:
    random symbols of ``dictionary``, EOS last, collated by fairseq's translation data set (no padding)."""
    generator = torch.Generator().manual_seed(settings.seed)

    def sentence(length):
        tokens = torch.randint(dictionary.nspecial, len(dictionary), (length,), generator=generator)
        tokens[-1] = dictionary.eos()
        return tokens

    def batch(rows, src_len, tgt_len=None):
        pairs = [{"id": i, "source": sentence(src_len), "target": tgt_len and sentence(tgt_len)} for i in range(rows)]
        return utils.apply_to_sample(lambda t: t.to(device), collate(pairs, dictionary.pad(), dictionary.eos()))

    decode = functools.partial(batch, settings.decode_batch_size)
    return (batch(settings.batch_size, settings.src_len, settings.tgt_len), decode(settings.src_len),
            {length: decode(length) for length in settings.source_lengths})


def check_settings(settings: argparse.Namespace) -> None:
    """The settings that depend on each other (each alone is checked by its argparse type)."""
    if settings.dtype != "fp32" and settings.device != "cuda":
        raise BenchmarkError(f"--dtype {settings.dtype} is only supported with --device cuda (got --device "
                             f"{settings.device}); use --dtype fp32 on CPU")
    if settings.clock == "process" and settings.device != "cpu":
        raise BenchmarkError(f"--clock process measures this process's CPU time, which does not include GPU work: "
                             f"use --clock wall with --device {settings.device}")
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise BenchmarkError("--device cuda: CUDA is not available in this torch build / on this machine")
    if settings.source_lengths and settings.decode_len < 2:
        raise BenchmarkError(f"--source-lengths times L and L/2 output tokens: --decode-len must be at least 2, "
                             f"got {settings.decode_len}")
    if settings.vocab <= 4 + settings.beam:
        raise BenchmarkError(f"--vocab {settings.vocab} is too small for --beam {settings.beam} (4 special symbols)")


#: bytes a parameter holds while training: the fp32 weight, its gradient and Adam's two moments
TRAINING_BYTES_PER_PARAMETER = 16


def parameter_count(config: BenchmarkConfig, settings: argparse.Namespace, dictionary) -> int:
    """Parameters of ``config`` at the matched width, its model built with fake tensors: shapes without memory.
    (Not the meta device: fairseq's ConvTBC makes its weight with the legacy ``torch.Tensor(...)``, which ignores
    the default device; the dense_fconv models would hold gigabytes while they are counted.)"""
    with FakeTensorMode(allow_non_fake_inputs=True):
        _, _, model = build_model(config.arch, config_flags(config, settings)[0], dictionary, name=config.name)
    return count_parameters(model)


def activation_bytes(settings: argparse.Namespace) -> int:
    """A rough size of one training step's fp32 activations, and only one (the configurations take their steps
    one after another): per token and layer, 12 model-width vectors, 2 feed-forward-width vectors and 2 attention
    rows per head; and the logits, log-probabilities and their gradient over the vocabulary per target token."""
    tokens = settings.batch_size * (settings.src_len + settings.tgt_len)
    per_token_and_layer = (12 * settings.embed_dim + 2 * settings.ffn_dim
                           + 2 * settings.heads * max(settings.src_len, settings.tgt_len))
    layers = settings.encoder_layers + settings.decoder_layers
    return 4 * (tokens * layers * per_token_and_layer + 3 * settings.batch_size * settings.tgt_len * settings.vocab)


def available_memory(device: torch.device):
    """(bytes free for the measurement, where the figure comes from), or None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], "free on the GPU"
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return 1024 * kib, "MemAvailable in /proc/meminfo"


def check_memory(configs: List[BenchmarkConfig], settings: argparse.Namespace, dictionary, device,
                 log: Callable[[str], None]) -> None:
    """Every configuration is kept built for the whole measurement (the rounds interleave them): a set whose
    estimated training memory exceeds what the machine has free is refused before any model is built."""
    available = available_memory(device)
    if available is None:
        log("memory not checked: the free memory of this machine cannot be read (/proc/meminfo)")
        return
    free, source = available
    parameters = sum(parameter_count(config, settings, dictionary) for config in configs)
    estimate = TRAINING_BYTES_PER_PARAMETER * parameters + activation_bytes(settings)
    if estimate > free:
        raise BenchmarkError(
            f"the {len(configs)} configurations need an estimated {estimate / 2**30:.1f} GiB ({parameters:,} "
            f"parameters x {TRAINING_BYTES_PER_PARAMETER} bytes for weights, gradients and Adam's moments, plus one "
            f"training step's activations), more than the {free / 2**30:.1f} GiB available ({source}); name fewer "
            "with --archs, or lower the width (--embed-dim, --ffn-dim, --encoder-layers, --decoder-layers, --vocab)")


def median_interval(values: Sequence[float], level: float = 0.95) -> Optional[List[float]]:
    """The distribution-free interval for the median of the rounds' distribution: the order statistics
    x_(k) and x_(n-k+1) of the n rounds with the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k),
    is at least ``level``. None below 6 rounds at 95% (the widest, min to max, covers 1 - 2^(1-n))."""
    n, ordered = len(values), sorted(values)
    below = [math.comb(n, i) / 2 ** n for i in range(n)]  # P(Binomial(n, 1/2) = i)
    k = 0
    while k + 1 <= n - k and 1 - 2 * sum(below[:k + 1]) >= level:
        k += 1
    return [ordered[k - 1], ordered[n - k]] if k else None


def config_result(runner: _Runner, base: _Runner, settings: argparse.Namespace) -> Dict[str, object]:
    """The JSON record of one configuration, its ratios against the baseline ``base``."""
    def summary(what, unit, ratio="ratio"):  # a speed ratio of times: the baseline's over this one's
        values, base_values = runner.values[what], base.values[what]
        ratios = [v / b if ratio == "ratio" else b / v for v, b in zip(values, base_values)]
        return {unit: values, f"median_{unit}": statistics.median(values), ratio: {
            "min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
            "median_ci95": median_interval(ratios), "per_repeat": ratios}}

    return {
        "arch": runner.config.arch, "baseline": runner.config.baseline, "variant_flags": runner.config.flags,
        "flags": runner.flags, "skipped_width_flags": runner.skipped_width_flags, "model_args": runner.model_args,
        "parameters": count_parameters(runner.model),
        "trainable_parameters": sum(p.numel() for p in runner.model.parameters() if p.requires_grad),
        "train": summary("train", "tokens_per_s"),
        "decode": {**summary("decode", "sentences_per_s"), "decoder_steps": settings.decode_len + 1,
                   "hypothesis_lengths": [settings.decode_len + 1]},  # decode() refuses any other length
        "memory": runner.memory or None,
        "flops": {**runner.flops, **{f"{kind}_ratio": base.flops[kind] / runner.flops[kind] if runner.flops[kind]
                                     else None for kind in runner.flops}} if settings.flops else None,
        "step_cost": {str(n): summary(n, "ms_per_step", "speed_ratio") for n in settings.source_lengths} or None,
    }


def run_benchmark(configs: List[BenchmarkConfig], settings: argparse.Namespace,
                  log: Callable[[str], None] = lambda message: print(message, file=sys.stderr, flush=True)) -> Dict:
    """Measure every configuration (the baseline among them) and return the JSON-ready results."""
    check_settings(settings)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    device = torch.device(settings.device)
    env = {"device": settings.device, "device_name": device_name(device), "dtype": settings.dtype,
           "torch": torch.__version__, "fairseq": fairseq.__version__, "fusion_fairseq": fusion_fairseq.__version__,
           "python": platform.python_version(), "platform": platform.platform(), "threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "cuda": torch.version.cuda, "load_average_start": load_average()}
    dictionary = dictionary_of_size(settings.vocab)
    check_memory(configs, settings, dictionary, device, log)
    samples = synthetic_samples(settings, dictionary, device)
    runners = []
    for config in configs:
        log(f"building {config.name} ({config.arch})")
        runners.append(_Runner(config, settings, dictionary, samples, device))
        for skipped in runners[-1].skipped_width_flags:
            log(f"  {config.name}: width flag {skipped} not applied")
    started = time.perf_counter()
    units = {"train": "{:,.0f} tokens/s", "decode": "{:,.2f} sentences/s",
             **{n: f"source {n}: {{:.2f}} ms" for n in settings.source_lengths}}
    for repeat in range(settings.repeats):  # round-robin, the order rotated by one every round
        order = runners[repeat % len(runners):] + runners[:repeat % len(runners)]
        for what, unit in units.items():
            for runner in order:
                value = unit.format(runner.measure(what))
                log(f"[round {repeat + 1}/{settings.repeats}] {what if what in ('train', 'decode') else 'step':6} "
                    f"{runner.config.name}: {value}")
    timing_seconds = time.perf_counter() - started
    for runner in runners:
        if settings.flops:
            runner.flops = dict(zip(("train_step", "decode_batch"), runner.once(count_flops).values()))
        if settings.memory:
            runner.measure_memory(cuda_transient_peak if device.type == "cuda" else cpu_transient_peak)
    base = next(r for r in runners if r.config.baseline)
    results = {runner.config.name: config_result(runner, base, settings) for runner in runners}
    env["load_average_end"] = load_average()
    settings_record = {**vars(settings), "optimizer": "torch.optim.Adam(betas=(0.9, 0.98), eps=1e-8), loss / "
                       "target tokens", "width_flags": WIDTH_FLAGS}
    return {"environment": env, "settings": settings_record, "baseline": base.config.name,
            "memory_method": MEMORY_METHOD[device.type] if settings.memory else None,
            "timing_seconds": timing_seconds, "configs": results}


def markdown_table(result: Dict) -> str:
    """One row per configuration: absolute medians, ratios to the baseline (the median across rounds and its
    interval, :func:`median_interval`); then, with --source-lengths, per source length each configuration's median
    ms per decoding step and its speed ratio."""
    def ratios(stats):  # the median and its 95% interval, or the rounds' range where too few rounds give none
        interval = stats.get("median_ci95")
        low, high = interval or (stats["min"], stats["max"])
        return f"{stats['median']:.3f} " + (f"[{low:.3f}, {high:.3f}]" if interval else f"({low:.3f} - {high:.3f})")

    env, settings, configs = result["environment"], result["settings"], result["configs"]
    rows = []
    for name, row in configs.items():
        memory, flops = row["memory"] or {}, row["flops"] or {}
        rows.append([name + " (baseline)" * row["baseline"], row["arch"], f"{row['parameters']:,}",
                     f"{row['train']['median_tokens_per_s']:,.0f}", ratios(row["train"]["ratio"]),
                     number(flops.get("train_step_ratio"), ".3f"), f"{row['decode']['median_sentences_per_s']:,.2f}",
                     ratios(row["decode"]["ratio"]), number(flops.get("decode_batch_ratio"), ".3f")]
                    + [number(memory.get(f"{kind}_peak_bytes") and memory[f"{kind}_peak_bytes"] / 2**20, ",.1f")
                       for kind in ("train", "decode")])
    lines = [f"Device: {env['device']} ({env['device_name']}), dtype {env['dtype']}, {env['threads']} thread(s); "
             f"torch {env['torch']}, fairseq {env['fairseq']}; " + "{clock}-clock time. Batch {batch_size} x "
             "{src_len}->{tgt_len} tokens, vocab {vocab}, {repeats} rounds of {steps} steps; decoding beam {beam}, "
             "{decode_batch_size} sentences x {decode_len} tokens + EOS. ".format(**settings) + f"Ratios are config / "
             f"{result['baseline']} within each round: the median over the rounds, with its distribution-free 95% "
             "interval [in brackets] from 6 rounds on, else (the rounds' min - max).", "",
             *markdown_rows(["Config", "Arch", "Params", "Train tok/s", "Train ratio, median [95%]",
                             "Train flop ratio", "Decode sent/s", "Decode ratio, median [95%]", "Decode flop ratio",
                             "Train peak MiB", "Decode peak MiB"], rows, left=2)]
    lengths = list(next(iter(configs.values()))["step_cost"] or {})
    if lengths:
        costs = [[length] + [f"{configs[name]['step_cost'][length]['median_ms_per_step']:.2f} "
                             f"({configs[name]['step_cost'][length]['speed_ratio']['median']:.2f})" for name in configs]
                 for length in lengths]
        lines += ["", "Decoding step cost as the source grows: median ms per step (speed ratio to "
                  f"{result['baseline']}, median over rounds).", "",
                  *markdown_rows(["source tokens", *configs], costs, left=0)]
    return "\n".join(lines) + "\n"


TRAIN_LINE = re.compile(r"\|\s*train_inner\s*\|\s*(\{.*\})\s*$")


def seconds_at(walls: Dict[int, float], update: int) -> Optional[float]:
    """Training seconds at ``update``, linearly interpolated between logged updates (None if beyond)."""
    logged = sorted(walls)
    if not logged or update > logged[-1]:
        return None
    return float(numpy.interp(update, [0] + logged, [0.0] + [walls[u] for u in logged]))


def time_to_loss(reference: str, logs: List[str]) -> Dict:
    """Per fairseq-train log (``--log-format json``, validation every N updates): the first validated
    update at or below the reference's best validation NLL and the training time up to it, and
    their ratios to the reference's (Shen et al., NAACL 2018: DenseNMT's "29% less time to the same
    loss" beside 8.1% slower steps). The training time is the running sum of ``train_wall`` over the
    ``train_inner`` lines, each covering one log interval, validation excluded. fairseq logs each
    interval's ``train_wall`` in whole seconds, so every line up to the target adds up to 0.5 s of
    doubt (``train_seconds_bound``); the time ratio is given only where both times are known to
    within ``TIME_RESOLUTION`` of themselves (log over longer intervals to get it)."""
    rows = []
    for path in [reference, *logs]:
        curve = learning_curve(path)
        if not curve:
            raise BenchmarkError(f"--time-to-loss {path}: " + ("no validation lines (train with --log-format json "
                                 "and --validate-interval-updates N)" if os.path.isfile(path) else "no such file"))
        inner = [json.loads(m.group(1)) for m in map(TRAIN_LINE.search, read_lines(path)) if m]
        updates = [int(stats["num_updates"]) for stats in inner]
        walls = dict(zip(updates, itertools.accumulate(float(stats["train_wall"]) for stats in inner)))
        rows.append({"log": path, "reference": path == reference, "best_nll": min(curve.values()),
                     "last_update": max(curve), "walls": walls, "curve": curve})
    target = rows[0]["best_nll"]
    for row in rows:
        walls, reached = row.pop("walls"), updates_to_reach(row["curve"], target)
        seconds = None if reached is None else seconds_at(walls, reached)
        # the lines summed up to the target, the one it is interpolated into included
        row.update(updates_to_target=reached, train_seconds_to_target=seconds,
                   train_seconds_bound=None if seconds is None else
                   WALL_ROUNDING * (1 + sum(update < reached for update in walls)))
        if reached and rows[0]["updates_to_target"]:
            row["updates_ratio"] = reached / rows[0]["updates_to_target"]
        if resolved(row) and resolved(rows[0]):
            row["time_ratio"] = seconds / rows[0]["train_seconds_to_target"]
    return {"target_nll": target, "time_resolution": TIME_RESOLUTION, "rows": rows}


WALL_ROUNDING = 0.5  # seconds: fairseq rounds each log interval's train_wall to whole seconds
TIME_RESOLUTION = 0.05  # the largest doubt, relative to the time, at which a time ratio is given


def resolved(row: Dict) -> bool:
    """Whether ``row``'s training time to the target is known to within ``TIME_RESOLUTION`` of itself."""
    seconds = row["train_seconds_to_target"]
    return bool(seconds) and row["train_seconds_bound"] <= TIME_RESOLUTION * seconds


def time_to_loss_table(result: Dict) -> str:
    def cells(row):
        updates, seconds = row["updates_to_target"], row["train_seconds_to_target"]
        return [f"{row['best_nll']:.3f}", f"> {row['last_update']}" if updates is None else str(updates),
                number(row.get("updates_ratio"), ".2f"),
                "-" if seconds is None else f"{seconds:.0f} ± {row['train_seconds_bound']:.1f}",
                number(row.get("time_ratio"), ".2f")]

    table = format_matrix(f"target: the reference's best validation NLL, {result['target_nll']:.3f} (base 2)",
                          [cells(row) for row in result["rows"]],
                          [row["log"][-40:] for row in result["rows"]],
                          ["best NLL", "updates", "ratio", "train s", "ratio"], cell=str, corner="log")
    unresolved = [row["log"] for row in result["rows"]
                  if row["train_seconds_to_target"] is not None and not resolved(row)]
    if unresolved:
        table += (f"\nno time ratio where a time is not known to within {result['time_resolution']:.0%} (fairseq "
                  "logs train_wall in whole seconds per log interval; train with a longer --log-interval): "
                  + ", ".join(unresolved))
    return table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    group = parser.add_argument_group("configurations")
    group.add_argument("--archs", nargs="*", metavar="ARCH",
                       help="architectures to run at the matched width (default: every architecture of this "
                            "plugin; give --archs with no names to run only the variants)")
    group.add_argument("--variant", action="append", default=[], metavar="NAME=ARCH:FLAGS",
                       help=f"a named configuration, repeatable, e.g. {VARIANT_EXAMPLE}")
    group.add_argument("--baseline-arch", default="transformer",
                       help=f"architecture of the baseline configuration {BASELINE_NAME!r}")
    group.add_argument("--common-flags", type=lambda text: split_flags(text, "--common-flags"), default="",
                       metavar="FLAGS",
                       help="model flags for every configuration, the baseline included, e.g. '--share-all-embeddings'")
    group.add_argument("--time-to-loss", nargs="+", metavar="LOG",
                       help="instead of measuring: read fairseq-train json logs, the first the reference, and report "
                            "the updates and training time each needs to reach the reference's best validation NLL")

    def one_of(flag, allowed):
        return checked(flag, str, lambda value: value in allowed, f"one of {', '.join(allowed)}")

    def with_eos(flag):  # a sentence length: its last token is EOS
        return checked(flag, int, lambda value: value >= 2, "an integer of at least 2 (the last token is EOS)")

    positive, count = positive_int, non_negative_int
    groups = {  # (flag, type, default, help; a width setting's help: the model flags it sets, from WIDTH_FLAGS)
        "matched width (applied where an architecture defines the flag)": [
            ("--encoder-layers", positive, 3, None), ("--decoder-layers", positive, 3, None),
            ("--embed-dim", positive, 256, None), ("--ffn-dim", positive, 1024, None), ("--heads", positive, 4, None),
            ("--dropout", checked("--dropout", float, lambda value: 0 <= value < 1, "in [0, 1)"), 0.1, None),
            ("--vocab", positive, 8000, "size of the joined dictionary")],
        "training measurement": [
            ("--batch-size", positive, 16, "sentences per batch"),
            ("--src-len", with_eos("--src-len"), 16, "source tokens per sentence (EOS included)"),
            ("--tgt-len", with_eos("--tgt-len"), 16, "target tokens per sentence (EOS included)"),
            ("--warmup", count, 1, "untimed training steps per round"),
            ("--steps", positive, 3, "timed training steps per round"),
            ("--repeats", positive, 3, "rounds over all configurations"), ("--label-smoothing", float, 0.1, None),
            ("--lr", float, 5e-4, None), ("--criterion", one_of("--criterion", CRITERIA), CRITERIA[0], None)],
        "decoding measurement": [
            ("--beam", positive, 5, None), ("--decode-batch-size", positive, 8, None),
            ("--decode-len", positive, None, "output tokens per hypothesis, forced with min_len = max_len "
                                             "(default: --tgt-len)"),
            ("--decode-warmup", count, 1, "untimed decode batches per round"),
            ("--decode-batches", positive, 2, "timed decode batches per round")],
        "device and output": [
            ("--device", one_of("--device", ("cpu", "cuda")), "cpu", "cpu or cuda"),
            ("--dtype", one_of("--dtype", tuple(AUTOCAST)), "fp32", "fp32, or fp16 / bf16 (autocast, CUDA only)"),
            ("--threads", positive, None, "torch.set_num_threads (default: torch's)"),
            ("--clock", one_of("--clock", tuple(CLOCKS)), "wall", "wall: elapsed time; process: this process's CPU "
             "time (CPU only; less sensitive to other work sharing the cores, but it sums the time of all threads)"),
            ("--seed", int, 1, None)],
    }
    for title, arguments in groups.items():
        group = parser.add_argument_group(title)
        for flag, kind, default, text in arguments:
            sets = WIDTH_FLAGS.get(flag[2:].replace("-", "_"))
            text = text or (sets and "sets " + ", else ".join(" and ".join(model_flags) for model_flags in sets))
            group.add_argument(flag, type=kind, default=default, help=text)
        if title == "decoding measurement":
            lengths = checked("--source-lengths", lambda text: [int(n) for n in text.split(",")],
                              lambda values: min(values) >= 2, "integers of at least 2 (the last token is EOS) "
                              "separated by commas")
            group.add_argument("--source-lengths", type=lengths, default=[], metavar="N,N,...",
                               help="also time one decoding step as the source grows, for each source length N (e.g. "
                                    "He et al.'s point that layer-wise coordination attends to the source in every "
                                    "layer)")
    group.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory pass")
    group.add_argument("--no-flops", dest="flops", action="store_false", help="skip counting the matrix-product FLOPs")
    group.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    group.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    add_force_argument(group)
    return parser


def settings(argv=(), **changes) -> argparse.Namespace:
    """The settings of a measurement: the command line ``argv`` parsed, ``changes`` applied and the
    output length resolved (``decode_len``: ``--tgt-len`` by default)."""
    args = build_parser().parse_args(list(argv))
    vars(args).update(changes)
    args.decode_len = args.decode_len or args.tgt_len
    return args


def run(argv: Optional[Iterable[str]] = None) -> Dict:
    """The measurement (or ``--time-to-loss``) of the command line ``argv``: its table printed, its files written,
    its results returned. A bad input exits with status 2 and a message."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # the outputs are checked before any measurement
        args = settings(argv)
        logs = args.time_to_loss or []
        check_outputs(args, [("--json", args.json), ("--markdown", args.markdown)],
                      [("--time-to-loss", log) for log in logs])
        if logs:
            result = time_to_loss(logs[0], logs[1:])
        else:
            result = run_benchmark(build_configs(args.archs, args.variant, args.baseline_arch), args)
        table = time_to_loss_table(result) if logs else markdown_table(result)
    except UsageError as exc:
        build_parser().error(str(exc))
    result["command"] = shlex.join([PROG, *argv])
    print(table)
    if args.json:
        write_json(args.json, result)
    if args.markdown:
        write_markdown(args.markdown, table)
    return result


def main(argv: Optional[Iterable[str]] = None) -> int:
    """Console entry point ``fusion-fairseq-benchmark``: the exit status, 0 after a run (the installed script
    passes what this returns to ``sys.exit``); 2 with a message on bad input."""
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speed benchmark: training throughput, decoding speed, parameters and peak memory of the plugin's
models against fairseq's vanilla Transformer, measured in one process.

Console script ``fusion-fairseq-benchmark`` (or ``python scripts/benchmark.py``)::

    fusion-fairseq-benchmark --repeats 3 --threads 1 \\
        --archs mlrf_iwslt_de_en \\
        --variant "Enc-FNN=fusion_transformer:--fuse-encoder fnn" \\
        --json bench.json --markdown bench.md

What is compared
----------------
*Configurations* are (name, architecture, flags). By default they are every architecture
registered by this plugin -- every ``ARCH_MODEL_REGISTRY`` entry whose model class lives in the
``fusion_fairseq`` package, so model families added later are picked up without changes here --
plus any ``--variant NAME=ARCH:FLAGS`` (``FLAGS`` split like a shell command line), plus the
baseline, fairseq's ``transformer`` (named ``vanilla``), which is always run.

Every configuration is built at one *matched width* (default d=256, FFN 1024, 4 heads, 3+3
layers, dropout 0.1; ``--embed-dim``, ``--ffn-dim``, ``--heads``, ``--encoder-layers``,
``--decoder-layers``, ``--dropout``). A width flag is only passed to an architecture whose own
``add_args`` defines it and parses the value into a number; otherwise it is skipped and the skip is reported
(e.g. fconv's ``--encoder-layers`` is a Python expression: give it in the variant's flags).
Architectures with one shared stack instead of an encoder and a decoder get ``--embed-dim``,
``--ffn-embed-dim`` and ``--attention-heads`` where they define them; their depth (``--layers``)
is left to the architecture, as no number of shared layers matches an N+M encoder-decoder. The
flags reach fairseq's own argument parser in the order: width flags, ``--common-flags``, the
variant's flags, so later ones override earlier ones; the architecture function then fills the
rest. Flags a family owns (e.g. ``--fusion-attn-dim``) keep the architecture's defaults unless
given. The model-specific arguments each model was built with are written to the JSON.

All models use one joined dictionary of ``--vocab`` symbols (default 8000), so embedding and
output-projection costs are equal, and are initialised with the same seed.

What is measured
----------------
* **Training throughput**, target tokens per second of full training steps: forward, the loss
  (fairseq's ``label_smoothed_cross_entropy`` criterion, or ``cross_entropy``), backward, and an
  Adam step (``torch.optim.Adam``; the loss is divided by the number of target tokens, as
  fairseq's trainer does). Every model trains on the *identical* synthetic batch
  (``--batch-size`` sentences of ``--src-len`` source and ``--tgt-len`` target tokens, no padding,
  drawn once from ``--seed``); the dropout RNG is re-seeded before every timed block.
* **Decoding speed**, sentences per second of fairseq's real ``SequenceGenerator`` (beam
  ``--beam``, default 5, incremental decoding with the models' incremental state) on one synthetic
  batch of ``--decode-batch-size`` source sentences.

  *Fixed output length.* The models are untrained, so where they would emit EOS -- and with it
  how many decoder steps beam search runs -- is arbitrary and differs between models; comparing
  sentences/s would then compare output lengths, not per-step cost. The generator is therefore
  built with ``max_len_a=0, max_len_b=L, min_len=L`` (``L = --decode-len``, default
  ``--tgt-len``): EOS is forbidden before step L and is the only choice at step L, so every
  hypothesis of every model is exactly L tokens plus EOS, i.e. L + 1 incremental decoder steps.
  The benchmark checks the length of every returned hypothesis and fails if one differs.
* **Decoding cost per step as the source grows** (``--source-lengths 8,16,32``, off by default):
  for each source length n, the milliseconds of one decoding step, (t(L) - t(L/2)) / (L - L/2),
  the difference of two whole ``generate`` calls with L and L/2 output tokens (each after one
  untimed call), so that what is paid once per sentence -- the encoder, the first step's
  projection of the source, the generator's set-up -- cancels; and the speed ratio, the
  baseline's time / the configuration's, per round. This is the measurement for methods whose
  every decoder layer reads the source (layer-wise coordination, He et al. Sec. 3).
* **Parameters**: ``sum(p.numel() for p in model.parameters())``.
* **Peak memory**, measured in a separate, untimed pass after the timing (the profiler would
  perturb the timings), once per configuration:

  - ``train_peak_bytes`` = bytes of the model's persistent training state at the start of a
    step (parameters and Adam's state tensors; gradients are freed between steps) + the peak of
    the bytes allocated on top of that during one training step (activations, gradients,
    temporaries).
  - ``decode_peak_bytes`` = parameter bytes + the peak of the bytes allocated during one
    ``generate`` call of the decode batch.

  On CUDA the transient peak is ``torch.cuda.max_memory_allocated()`` minus
  ``torch.cuda.memory_allocated()`` before the step (the caching allocator's reserved but unused
  memory is not counted). On CPU it is the running total of the allocations and frees seen by
  PyTorch's CPU allocator, recorded by ``torch.profiler`` with ``profile_memory=True``, relative to
  the start of the step; memory that bypasses PyTorch's allocator (oneDNN/BLAS scratch buffers,
  the Python heap) is not counted. Process RSS is deliberately not used: its high-water mark never
  decreases within one process, so it cannot tell configurations run in the same process apart.
  The two devices thus measure the same quantity, the PyTorch tensor bytes live at the peak.

* **Floating-point operations** (``--no-flops`` skips them), counted once per configuration by
  ``torch.utils.flop_counter.FlopCounterMode`` over one training step (forward and backward) and
  one decode batch: the matrix products (linear layers, attention scores and contexts,
  convolutions) that the method prescribes. ``flop ratio`` = vanilla's count / the
  configuration's, i.e. the speed ratio a device whose time is proportional to these operations
  would show. Measured ratios are usually above it: the work a method does not add (softmax,
  layer norm, beam search bookkeeping, Python) dilutes the products it adds. A ratio far above
  the FLOP ratio, such as a GPU figure where small extra products hide behind kernel-launch
  latency, is a property of the device, not of the method.

How the numbers are made robust
-------------------------------
All configurations are measured in ONE process, interleaved: each of ``--repeats`` rounds runs
the training measurement of every configuration (``--warmup`` untimed steps, then ``--steps``
timed steps), then the decoding measurement of every configuration (``--decode-warmup``
untimed batches, then ``--decode-batches`` timed batches). The order of the configurations is
rotated by one every round, so no configuration always runs first or after the same neighbour,
and slow drift (thermal, other processes) hits all configurations alike. For every round the
ratio config / vanilla is taken within that round, and the report gives the min / median / max of
these ratios across rounds, next to the median absolute numbers. The ratio of the baseline to
itself is exactly 1.0. On a shared CPU the absolute numbers move with the machine's load; the
within-round ratios are what to compare, and the load average is recorded.

The default batch shapes (16 sentences of 16 tokens for training, 8 sentences of 16 tokens +
EOS for decoding, 1 + 3 training steps and 1 + 2 decode batches per round) keep a CPU run of
about ten configurations x 3 rounds within a few minutes; on a GPU use larger ``--batch-size``,
``--decode-batch-size`` and ``--steps`` so that kernel launch overhead does not dominate.

``--dtype fp16|bf16`` (CUDA only) runs under ``torch.autocast`` (automatic mixed precision, like
fairseq's ``--amp``): parameters and Adam's state stay fp32, fp16 training uses a GradScaler.
``--threads N`` sets ``torch.set_num_threads(N)``.

``--clock wall`` (default) times elapsed time. On a CPU shared with other work, elapsed time
includes the time this process waits for a core; ``--clock process`` (CPU only) times this
process's CPU time instead (``time.process_time``), which is much less sensitive to other load
(caches and memory bandwidth are still shared). With ``--threads 1`` it is the compute time of
the one thread; with more threads it sums their CPU time, i.e. it measures work, not latency.

The JSON records the environment (device, dtype, torch / fairseq / Python versions, threads,
load average), the settings, and per configuration: arch, flags, skipped width flags,
model-specific arguments, parameters, per-round tokens/s and sentences/s with their medians,
ratio statistics, decoded hypothesis lengths and memory. ``--json`` and ``--markdown`` are checked
before any measurement: an existing file is overwritten only with ``--force``.
"""

import argparse
import contextlib
import io
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch

import fairseq
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

import fusion_fairseq  # noqa: F401  (registers the plugin's architectures)
from fusion_fairseq.tools.analysis import UsageError, add_force_argument, check_outputs, write_json, write_markdown
from fusion_fairseq.tools.common import (
    count_parameters, device_name, dictionary_of_size, load_average, plugin_architectures, non_negative_int, positive_int)

PROG = "fusion-fairseq-benchmark"  # the console script; scripts/benchmark.py runs the same main()
BASELINE_NAME = "vanilla"
DEFAULT_BASELINE_ARCH = "transformer"
DTYPES = ("fp32", "fp16", "bf16")
DEVICES = ("cpu", "cuda")
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


class BenchmarkError(ValueError):
    """A bad configuration or setting; the message names the flag or the spec at fault."""


@dataclass
class BenchmarkConfig:
    name: str
    arch: str
    flags: List[str] = field(default_factory=list)
    baseline: bool = False


@dataclass
class BenchmarkSettings:
    device: str = "cpu"
    dtype: str = "fp32"
    threads: Optional[int] = None
    clock: str = "wall"
    seed: int = 1
    # matched width
    encoder_layers: int = 3
    decoder_layers: int = 3
    embed_dim: int = 256
    ffn_dim: int = 1024
    heads: int = 4
    dropout: float = 0.1
    common_flags: List[str] = field(default_factory=list)
    vocab: int = 8000
    # training
    batch_size: int = 16
    src_len: int = 16
    tgt_len: int = 16
    warmup: int = 1
    steps: int = 3
    repeats: int = 3
    criterion: str = "label_smoothed_cross_entropy"
    label_smoothing: float = 0.1
    lr: float = 5e-4
    # decoding
    beam: int = 5
    decode_batch_size: int = 8
    decode_len: Optional[int] = None  # None: --tgt-len
    decode_warmup: int = 1
    decode_batches: int = 2
    # decoding cost per step as the source grows (empty: not measured)
    source_lengths: List[int] = field(default_factory=list)
    # memory and floating-point operations
    memory: bool = True
    flops: bool = True

    @property
    def decode_length(self) -> int:
        return self.tgt_len if self.decode_len is None else self.decode_len


# ---------------------------------------------------------------------------------------------
# configurations
# ---------------------------------------------------------------------------------------------
def known_archs_message() -> str:
    plugin = plugin_architectures()
    others = sorted(a for a in ARCH_MODEL_REGISTRY if a not in plugin)
    return f"this plugin's: {', '.join(plugin)}; fairseq's and others: {', '.join(others)}"


def check_arch(arch: str, where: str) -> None:
    if arch not in ARCH_MODEL_REGISTRY:
        raise BenchmarkError(f"{where}: unknown architecture {arch!r}. Known architectures -- {known_archs_message()}")


def split_flags(text: str, where: str) -> List[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BenchmarkError(f"{where}: cannot split flags {text!r}: {exc}") from None


def parse_variant(spec: str) -> BenchmarkConfig:
    """``NAME=ARCH:FLAGS`` (``:FLAGS`` optional) -> a configuration."""
    malformed = f"malformed --variant {spec!r}: expected NAME=ARCH:FLAGS, e.g. {VARIANT_EXAMPLE}"
    if "=" not in spec:
        raise BenchmarkError(f"{malformed} (no '=')")
    name, rest = spec.split("=", 1)
    name = name.strip()
    if not name:
        raise BenchmarkError(f"{malformed} (empty NAME)")
    arch, _, flag_text = rest.partition(":")
    arch = arch.strip()
    if not arch:
        raise BenchmarkError(f"{malformed} (empty ARCH)")
    check_arch(arch, f"--variant {spec!r}")
    return BenchmarkConfig(name, arch, split_flags(flag_text, f"--variant {spec!r}"))


def build_configs(archs: Optional[Sequence[str]] = None, variants: Sequence[str] = (),
                  baseline_arch: str = DEFAULT_BASELINE_ARCH) -> List[BenchmarkConfig]:
    """The baseline first, then ``archs`` (default: every plugin architecture), then the variants."""
    check_arch(baseline_arch, "--baseline-arch")
    configs = [BenchmarkConfig(BASELINE_NAME, baseline_arch, [], baseline=True)]
    for arch in plugin_architectures() if archs is None else archs:
        check_arch(arch, "--archs")
        configs.append(BenchmarkConfig(arch, arch, []))
    configs.extend(parse_variant(spec) for spec in variants)
    seen = set()
    for config in configs:
        if config.name in seen:
            raise BenchmarkError(
                f"duplicate configuration name {config.name!r} ({BASELINE_NAME!r} is the baseline's name, "
                "architectures are named after themselves); give each --variant its own NAME"
            )
        seen.add(config.name)
    return configs


def model_option_actions(arch: str) -> Dict[str, argparse.Action]:
    """The options the architecture's model class defines in ``add_args`` (flag -> action)."""
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    return {flag: action for action in parser._actions for flag in action.option_strings}


def takes_number(action: argparse.Action, value) -> bool:
    """Whether the option parses ``value`` into a number (fconv's ``--encoder-layers`` is a str
    expression; flags with validating types such as ``positive_int`` qualify)."""
    if action.type is None or action.nargs not in (None, 1) or action.const is not None:
        return False
    try:
        parsed = action.type(str(value))
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return isinstance(parsed, (int, float)) and not isinstance(parsed, bool)


def width_flags(arch: str, settings: BenchmarkSettings):
    """(flags to pass, skipped flags with the reason) for the matched width."""
    actions = model_option_actions(arch)
    flags, skipped = [], []
    for setting, alternatives in WIDTH_FLAGS.items():
        value = getattr(settings, setting)
        group = next((g for g in alternatives if any(flag in actions for flag in g)), None)
        if group is None:
            tried = "/".join(flag for g in alternatives for flag in g)
            skipped.append(f"{tried} (not an option of {arch}; left to the architecture)")
            continue
        for flag in group:
            action = actions.get(flag)
            if action is None:
                skipped.append(f"{flag} (not an option of {arch}; left to the architecture)")
            elif not takes_number(action, value):
                skipped.append(f"{flag} (does not take the number {value}; give it in a --variant's flags)")
            else:
                flags += [flag, str(value)]
    return flags, skipped


def parse_model_args(config: BenchmarkConfig, flags: List[str]):
    """Parse like ``fairseq-train`` (architecture defaults included); parser errors become BenchmarkError."""
    parser = options.get_training_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return options.parse_args_and_arch(parser, ["unused-data-dir", "--arch", config.arch, *flags])
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()
        raise BenchmarkError(
            f"configuration {config.name!r} ({config.arch}): fairseq rejected the flags {shlex.join(flags)!r}: "
            f"{message[-1] if message else 'argument error'}"
        ) from None


def json_value(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------
class _Runner:
    """One configuration: its model, optimiser, criterion, generator and the shared batches."""

    def __init__(self, config, settings, dictionary, train_sample, decode_sample, device, autocast_dtype):
        self.config = config
        self.settings = settings
        self.clock = CLOCKS[settings.clock]
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.width_flags, self.skipped_width_flags = width_flags(config.arch, settings)
        self.flags = self.width_flags + list(settings.common_flags) + list(config.flags)
        args = parse_model_args(config, self.flags)
        task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
        torch.manual_seed(settings.seed)
        try:
            model = ARCH_MODEL_REGISTRY[config.arch].build_model(args, task)
        except Exception as exc:
            raise BenchmarkError(f"configuration {config.name!r} ({config.arch}): building the model failed: {exc}") from exc
        self.model = model.to(device)
        self.model_args = {
            action.dest: json_value(getattr(args, action.dest, None))
            for action in model_option_actions(config.arch).values() if action.dest != "help"
        }
        self.parameters = count_parameters(self.model)
        self.trainable_parameters = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        self.optimizer = torch.optim.Adam(
            [p for p in self.model.parameters() if p.requires_grad], lr=settings.lr, betas=(0.9, 0.98), eps=1e-8
        )
        self.scaler = torch.amp.GradScaler("cuda") if autocast_dtype == torch.float16 else None
        self.criterion = self._build_criterion(task)
        self.train_sample = train_sample
        self.decode_sample = decode_sample
        self.generator = SequenceGenerator(
            [self.model], dictionary, beam_size=settings.beam,
            max_len_a=0, max_len_b=settings.decode_length, min_len=settings.decode_length,
        )
        self.half_generator = SequenceGenerator(
            [self.model], dictionary, beam_size=settings.beam,
            max_len_a=0, max_len_b=settings.decode_length // 2, min_len=settings.decode_length // 2,
        )
        self.sweep_samples: Dict[int, Dict] = {}
        self.ms_per_step: Dict[int, List[float]] = {}
        self.tokens_per_s: List[float] = []
        self.sentences_per_s: List[float] = []
        self.decoded_lengths: set = set()
        self.memory: Dict[str, Optional[int]] = {}
        self.flops: Dict[str, int] = {}

    def _build_criterion(self, task):
        if self.settings.criterion == "label_smoothed_cross_entropy":
            from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

            return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=self.settings.label_smoothing)
        from fairseq.criterions.cross_entropy import CrossEntropyCriterion

        return CrossEntropyCriterion(task, sentence_avg=False)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def where(self):
        return f"configuration {self.config.name!r} ({self.config.arch})"

    # training ---------------------------------------------------------------------------------
    def train_step(self):
        with self.autocast():
            loss, sample_size, _ = self.criterion(self.model, self.train_sample)
        loss = loss / sample_size
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def measure_training(self, sync):
        self.model.train()
        torch.manual_seed(self.settings.seed)
        try:
            for _ in range(self.settings.warmup):
                self.train_step()
            sync()
            start = self.clock()
            for _ in range(self.settings.steps):
                self.train_step()
            sync()
            elapsed = self.clock() - start
        except Exception as exc:
            raise BenchmarkError(f"{self.where()}: training step failed: {exc}") from exc
        tokens = self.settings.steps * self.train_sample["ntokens"]
        self.tokens_per_s.append(tokens / elapsed)
        return self.tokens_per_s[-1]

    # decoding ---------------------------------------------------------------------------------
    def decode_batch(self):
        with self.autocast():
            hypos = self.generator.generate([self.model], self.decode_sample)
        expected = self.settings.decode_length + 1
        lengths = {len(h["tokens"]) for sentence in hypos for h in sentence}
        if len(hypos) != self.decode_sample["nsentences"] or lengths != {expected}:
            raise BenchmarkError(
                f"{self.where()}: decoding with min_len = max_len = {self.settings.decode_length} should give "
                f"{self.decode_sample['nsentences']} sentences of exactly {expected} tokens (EOS included), "
                f"got {len(hypos)} sentences with lengths {sorted(lengths)}"
            )
        self.decoded_lengths |= lengths

    def measure_decoding(self, sync):
        self.model.eval()
        try:
            for _ in range(self.settings.decode_warmup):
                self.decode_batch()
            sync()
            start = self.clock()
            for _ in range(self.settings.decode_batches):
                self.decode_batch()
            sync()
            elapsed = self.clock() - start
        except BenchmarkError:
            raise
        except Exception as exc:
            raise BenchmarkError(f"{self.where()}: decoding failed: {exc}") from exc
        sentences = self.settings.decode_batches * self.decode_sample["nsentences"]
        self.sentences_per_s.append(sentences / elapsed)
        return self.sentences_per_s[-1]

    def measure_step_cost(self, length: int, sync) -> float:
        """Milliseconds of one decoding step over sources of ``length`` tokens: (t(L) - t(L/2)) /
        (L - L/2), the difference of two whole ``generate`` calls with L and L/2 output tokens, so
        that what is paid once per sentence (the encoder, the first step's projection of the
        source, the generator's set-up) cancels."""
        self.model.eval()
        sample, full, half = self.sweep_samples[length], self.settings.decode_length, self.settings.decode_length // 2
        times = {}
        try:
            with self.autocast(), torch.no_grad():
                for steps, generator in ((full, self.generator), (half, self.half_generator)):
                    generator.generate([self.model], sample)  # untimed: caches and allocator warm
                    sync()
                    start = self.clock()
                    generator.generate([self.model], sample)
                    sync()
                    times[steps] = self.clock() - start
        except Exception as exc:
            raise BenchmarkError(f"{self.where()}: decoding a {length}-token source failed: {exc}") from exc
        self.ms_per_step.setdefault(length, []).append(1000 * (times[full] - times[half]) / (full - half))
        return self.ms_per_step[length][-1]

    # floating-point operations ------------------------------------------------------------------
    def measure_flops(self):
        """Matrix-product FLOPs of one training step and of one decode batch (untimed)."""
        from torch.utils.flop_counter import FlopCounterMode

        self.model.train()
        torch.manual_seed(self.settings.seed)
        with FlopCounterMode(display=False) as counter:
            self.train_step()
        train = counter.get_total_flops()
        self.model.eval()
        with FlopCounterMode(display=False) as counter:
            self.decode_batch()
        self.flops = {"train_step": train, "decode_batch": counter.get_total_flops()}

    # memory -----------------------------------------------------------------------------------
    def state_bytes(self, with_optimizer: bool) -> int:
        tensors = list(self.model.parameters())
        if with_optimizer:
            for state in self.optimizer.state.values():
                tensors += [v for v in state.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def measure_memory(self, transient_peak: Callable[[Callable[[], None]], Optional[int]]):
        self.model.train()
        torch.manual_seed(self.settings.seed)
        self.optimizer.zero_grad(set_to_none=True)
        train_peak = transient_peak(self.train_step)
        self.model.eval()
        decode_peak = transient_peak(self.decode_batch)
        self.memory = {
            "train_peak_bytes": None if train_peak is None else self.state_bytes(True) + train_peak,
            "decode_peak_bytes": None if decode_peak is None else self.state_bytes(False) + decode_peak,
            "parameter_bytes": self.state_bytes(False),
            "train_state_bytes": self.state_bytes(True),
        }


def cuda_transient_peak(fn) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - base)


def cpu_transient_peak(fn) -> Optional[int]:
    """Peak of the net bytes allocated by PyTorch's CPU allocator while ``fn`` runs, relative to
    its start: the running sum, in time order, of the signed sizes of the allocation / free events
    that torch.profiler (profile_memory=True) records. Blocks allocated before profiling started
    and freed during it are not subtracted (the profiler does not know their size), so the peak
    can only be overestimated by them; gradients and temporaries are allocated within ``fn``.
    (The events' ``total_allocated`` is not used: the CPU reporter's total is cumulative across
    profiling sessions.) None where this torch's profiler does not expose allocation events."""
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError:
        return None
    events, stack = [], list(roots)
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and str(node.extra_fields.device) == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    peak = live = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


MEMORY_METHOD = {
    "cuda": "PyTorch tensor bytes at the peak: parameters + Adam state (+ for training) plus "
            "torch.cuda.max_memory_allocated() - memory_allocated() over one training step / one decode batch",
    "cpu": "PyTorch tensor bytes at the peak: parameters + Adam state (+ for training) plus the peak net "
           "allocation of PyTorch's CPU allocator over one training step / one decode batch "
           "(torch.profiler, profile_memory=True); RSS and non-PyTorch allocations not counted",
}


def synthetic_samples(settings: BenchmarkSettings, dictionary: Dictionary, device):
    generator = torch.Generator().manual_seed(settings.seed)
    low, high, eos = dictionary.nspecial, len(dictionary), dictionary.eos()

    def tokens(rows, length):
        t = torch.randint(low, high, (rows, length), generator=generator)
        t[:, -1] = eos
        return t

    src = tokens(settings.batch_size, settings.src_len)
    tgt = tokens(settings.batch_size, settings.tgt_len)
    prev = torch.cat([torch.full((settings.batch_size, 1), eos), tgt[:, :-1]], dim=1)
    train = {
        "id": torch.arange(settings.batch_size),
        "nsentences": settings.batch_size,
        "ntokens": tgt.numel(),
        "net_input": {
            "src_tokens": src.to(device),
            "src_lengths": torch.full((settings.batch_size,), settings.src_len).to(device),
            "prev_output_tokens": prev.to(device),
        },
        "target": tgt.to(device),
    }
    def decode_batch(length):
        return {
            "id": torch.arange(settings.decode_batch_size).to(device),
            "nsentences": settings.decode_batch_size,
            "net_input": {
                "src_tokens": tokens(settings.decode_batch_size, length).to(device),
                "src_lengths": torch.full((settings.decode_batch_size,), length).to(device),
            },
        }

    decode = decode_batch(settings.src_len)
    return train, decode, {length: decode_batch(length) for length in settings.source_lengths}


def check_settings(settings: BenchmarkSettings) -> None:
    if settings.device not in DEVICES:
        raise BenchmarkError(f"--device must be one of {', '.join(DEVICES)}, got {settings.device!r}")
    if settings.dtype not in DTYPES:
        raise BenchmarkError(f"--dtype must be one of {', '.join(DTYPES)}, got {settings.dtype!r}")
    if settings.dtype != "fp32" and settings.device != "cuda":
        raise BenchmarkError(
            f"--dtype {settings.dtype} is only supported with --device cuda (got --device {settings.device}); "
            "use --dtype fp32 on CPU"
        )
    if settings.clock not in CLOCKS:
        raise BenchmarkError(f"--clock must be one of {', '.join(CLOCKS)}, got {settings.clock!r}")
    if settings.clock == "process" and settings.device != "cpu":
        raise BenchmarkError(
            f"--clock process measures this process's CPU time, which does not include GPU work: "
            f"use --clock wall with --device {settings.device}"
        )
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise BenchmarkError("--device cuda: CUDA is not available in this torch build / on this machine")
    if settings.criterion not in CRITERIA:
        raise BenchmarkError(f"--criterion must be one of {', '.join(CRITERIA)}, got {settings.criterion!r}")
    positive = ["encoder_layers", "decoder_layers", "embed_dim", "ffn_dim", "heads", "vocab", "batch_size",
                "src_len", "tgt_len", "steps", "repeats", "beam", "decode_batch_size", "decode_batches"]
    for name in positive:
        value = getattr(settings, name)
        if not isinstance(value, int) or value <= 0:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    for name in ("warmup", "decode_warmup"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 0:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be a non-negative integer, got {value!r}")
    if settings.threads is not None and settings.threads <= 0:
        raise BenchmarkError(f"--threads must be a positive integer, got {settings.threads!r}")
    if settings.decode_len is not None and settings.decode_len <= 0:
        raise BenchmarkError(f"--decode-len must be a positive integer, got {settings.decode_len!r}")
    if settings.source_lengths and settings.decode_length < 2:
        raise BenchmarkError(f"--source-lengths times L and L/2 output tokens: --decode-len must be at least 2, "
                             f"got {settings.decode_length}")
    if any(not isinstance(n, int) or n < 2 for n in settings.source_lengths):
        raise BenchmarkError(f"--source-lengths must be integers of at least 2 (the last token is EOS), "
                             f"got {','.join(map(str, settings.source_lengths))}")
    if settings.src_len < 2 or settings.tgt_len < 2:
        raise BenchmarkError("--src-len and --tgt-len must be at least 2 (the last token is EOS)")
    if settings.vocab <= 4 + settings.beam:
        raise BenchmarkError(f"--vocab {settings.vocab} is too small for --beam {settings.beam} (4 special symbols)")
    if not 0.0 <= settings.dropout < 1.0:
        raise BenchmarkError(f"--dropout must be in [0, 1), got {settings.dropout!r}")


def ratio_stats(values: List[float], baseline: List[float]) -> Dict[str, object]:
    ratios = [v / b for v, b in zip(values, baseline)]
    return {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios), "per_repeat": ratios}


def environment(settings: BenchmarkSettings, device: torch.device) -> Dict[str, object]:
    return {
        "device": settings.device,
        "device_name": device_name(device),
        "dtype": settings.dtype,
        "autocast": settings.dtype != "fp32",
        "torch": torch.__version__,
        "fairseq": getattr(fairseq, "__version__", "unknown"),
        "fusion_fairseq": getattr(fusion_fairseq, "__version__", "unknown"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.version.cuda if settings.device == "cuda" else None,
        "load_average_start": load_average(),
    }


def flop_stats(runner, base) -> Dict[str, object]:
    """FLOPs per training step / decode batch and the FLOP-proportional speed ratios."""
    stats: Dict[str, object] = dict(runner.flops)
    for kind in ("train_step", "decode_batch"):
        stats[f"{kind}_ratio"] = base.flops[kind] / runner.flops[kind] if runner.flops[kind] else None
    return stats


def build_runners(configs: List[BenchmarkConfig], settings: BenchmarkSettings, device,
                  log: Callable[[str], None]) -> List[_Runner]:
    """One :class:`_Runner` per configuration, on shared synthetic samples."""
    autocast_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[settings.dtype]
    dictionary = dictionary_of_size(settings.vocab)
    train_sample, decode_sample, sweep_samples = synthetic_samples(settings, dictionary, device)
    runners = []
    for config in configs:
        log(f"building {config.name} ({config.arch})")
        runner = _Runner(config, settings, dictionary, train_sample, decode_sample, device, autocast_dtype)
        runner.sweep_samples = sweep_samples
        for skipped in runner.skipped_width_flags:
            log(f"  {config.name}: width flag {skipped} not applied")
        runners.append(runner)
    return runners


def measure_rounds(runners: List[_Runner], settings: BenchmarkSettings, sync: Callable[[], None],
                   log: Callable[[str], None]) -> float:
    """Training and decoding speed of every runner, round-robin with the order rotated by one every
    round; returns the seconds it took."""
    started = time.perf_counter()
    for repeat in range(settings.repeats):
        shift = repeat % len(runners)
        order = runners[shift:] + runners[:shift]
        for runner in order:
            value = runner.measure_training(sync)
            log(f"[round {repeat + 1}/{settings.repeats}] train  {runner.config.name}: {value:,.0f} tokens/s")
        for runner in order:
            value = runner.measure_decoding(sync)
            log(f"[round {repeat + 1}/{settings.repeats}] decode {runner.config.name}: {value:,.2f} sentences/s")
        for length in settings.source_lengths:
            for runner in order:
                value = runner.measure_step_cost(length, sync)
                log(f"[round {repeat + 1}/{settings.repeats}] step   {runner.config.name}, source {length}: "
                    f"{value:.2f} ms")
    return time.perf_counter() - started


def config_result(runner: _Runner, base: _Runner, settings: BenchmarkSettings) -> Dict[str, object]:
    """The JSON record of one configuration, its ratios against the baseline ``base``."""
    return {
        "arch": runner.config.arch,
        "baseline": runner.config.baseline,
        "variant_flags": runner.config.flags,
        "flags": runner.flags,
        "skipped_width_flags": runner.skipped_width_flags,
        "model_args": runner.model_args,
        "parameters": runner.parameters,
        "trainable_parameters": runner.trainable_parameters,
        "train": {
            "tokens_per_s": runner.tokens_per_s,
            "median_tokens_per_s": statistics.median(runner.tokens_per_s),
            "ratio": ratio_stats(runner.tokens_per_s, base.tokens_per_s),
        },
        "decode": {
            "sentences_per_s": runner.sentences_per_s,
            "median_sentences_per_s": statistics.median(runner.sentences_per_s),
            "ratio": ratio_stats(runner.sentences_per_s, base.sentences_per_s),
            "decoder_steps": settings.decode_length + 1,
            "hypothesis_lengths": sorted(runner.decoded_lengths),
        },
        "memory": runner.memory or None,
        "flops": flop_stats(runner, base) if settings.flops else None,
        "step_cost": {
            str(length): {
                "ms_per_step": times,
                "median_ms_per_step": statistics.median(times),
                "speed_ratio": ratio_stats(base.ms_per_step[length], times),  # baseline time / this time
            }
            for length, times in runner.ms_per_step.items()
        } or None,
    }


def settings_record(settings: BenchmarkSettings) -> Dict[str, object]:
    """The settings as the JSON records them, with how the optimiser, decoding and order were set up."""
    record = asdict(settings)
    record["decode_len"] = settings.decode_length
    record.update({
        "optimizer": "torch.optim.Adam(betas=(0.9, 0.98), eps=1e-8), loss / target tokens",
        "decoding": f"fairseq SequenceGenerator, beam {settings.beam}, max_len_a=0, "
                    f"max_len_b=min_len={settings.decode_length} (every hypothesis {settings.decode_length} tokens + EOS)",
        "order": "round-robin; the configuration order is rotated by one every round",
        "step_cost": "per source length: (t(L) - t(L/2)) / (L - L/2) of two generate calls after one untimed "
                     "call each; speed ratio = baseline time / configuration time",
        "width_flags": {k: [list(g) for g in v] for k, v in WIDTH_FLAGS.items()},
    })
    return record


def run_benchmark(configs: List[BenchmarkConfig], settings: BenchmarkSettings,
                  log: Callable[[str], None] = lambda message: print(message, file=sys.stderr, flush=True)) -> Dict:
    """Measure every configuration (the baseline among them) and return the JSON-ready results."""
    check_settings(settings)
    baselines = [c for c in configs if c.baseline]
    if len(baselines) != 1:
        raise BenchmarkError(f"exactly one baseline configuration is needed, got {len(baselines)}")
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    device = torch.device(settings.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    env = environment(settings, device)
    runners = build_runners(configs, settings, device, log)
    timing_seconds = measure_rounds(runners, settings, sync, log)
    if settings.flops:
        for runner in runners:
            runner.measure_flops()
    if settings.memory:
        transient_peak = cuda_transient_peak if device.type == "cuda" else cpu_transient_peak
        for runner in runners:
            runner.measure_memory(transient_peak)
    base = next(r for r in runners if r.config.baseline)
    results = {runner.config.name: config_result(runner, base, settings) for runner in runners}
    env["load_average_end"] = load_average()
    return {
        "environment": env,
        "settings": settings_record(settings),
        "baseline": base.config.name,
        "memory_method": MEMORY_METHOD[device.type] if settings.memory else None,
        "timing_seconds": timing_seconds,
        "configs": results,
    }


# ---------------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------------
def _mib(value):
    return "n/a" if value is None else f"{value / 2**20:,.1f}"


def _ratios(stats):
    return f"{stats['min']:.3f} / {stats['median']:.3f} / {stats['max']:.3f}"


def _flop_ratio(row, kind):
    ratio = (row.get("flops") or {}).get(f"{kind}_ratio")
    return "n/a" if ratio is None else f"{ratio:.3f}"


def _cell(text):
    return str(text).replace("|", "\\|")


def markdown_table(result: Dict) -> str:
    """One row per configuration: absolute medians, ratios to the baseline (min / median / max across rounds)."""
    env, settings = result["environment"], result["settings"]
    lines = [
        f"Device: {env['device']} ({env['device_name']}), dtype {env['dtype']}, {env['threads']} thread(s); "
        f"torch {env['torch']}, fairseq {env['fairseq']}; {settings['clock']}-clock time. Batch {settings['batch_size']} x "
        f"{settings['src_len']}->{settings['tgt_len']} tokens, vocab {settings['vocab']}, {settings['repeats']} rounds of "
        f"{settings['steps']} steps; decoding beam {settings['beam']}, {settings['decode_batch_size']} sentences x "
        f"{settings['decode_len']} tokens + EOS. Ratios are config / {result['baseline']} within each round, "
        "min / median / max across rounds.",
        "",
        "| Config | Arch | Params | Train tok/s | Train ratio (min / med / max) | Train flop ratio | Decode sent/s "
        "| Decode ratio (min / med / max) | Decode flop ratio | Train peak MiB | Decode peak MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in result["configs"].items():
        memory = row["memory"] or {}
        label = f"{name} (baseline)" if row["baseline"] else name
        lines.append(
            f"| {_cell(label)} | {_cell(row['arch'])} | {row['parameters']:,} | {row['train']['median_tokens_per_s']:,.0f} "
            f"| {_ratios(row['train']['ratio'])} | {_flop_ratio(row, 'train_step')} "
            f"| {row['decode']['median_sentences_per_s']:,.2f} "
            f"| {_ratios(row['decode']['ratio'])} | {_flop_ratio(row, 'decode_batch')} "
            f"| {_mib(memory.get('train_peak_bytes'))} "
            f"| {_mib(memory.get('decode_peak_bytes'))} |"
        )
    return "\n".join(lines + step_cost_table(result)) + "\n"


def step_cost_table(result: Dict) -> List[str]:
    """Per source length: each configuration's median ms per decoding step and its speed ratio."""
    lengths = [int(n) for n in next(iter(result["configs"].values()))["step_cost"] or {}]
    if not lengths:
        return []
    names = list(result["configs"])
    lines = ["", "Decoding step cost as the source grows: median ms per step (speed ratio to "
             f"{result['baseline']}, median over rounds).", "",
             "| source tokens | " + " | ".join(_cell(name) for name in names) + " |",
             "|---:|" + "---:|" * len(names)]
    for length in lengths:
        cells = []
        for name in names:
            cost = result["configs"][name]["step_cost"][str(length)]
            cells.append(f"{cost['median_ms_per_step']:.2f} ({cost['speed_ratio']['median']:.2f})")
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    defaults = BenchmarkSettings()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Training and decoding speed, parameters and peak memory of this plugin's models "
                    "against fairseq's vanilla transformer, interleaved in one process. "
                    "See the module docstring of fusion_fairseq.tools.benchmark for the method.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    group = parser.add_argument_group("configurations")
    group.add_argument("--archs", nargs="*", metavar="ARCH",
                       help="architectures to run at the matched width (default: every architecture of this "
                            "plugin; give --archs with no names to run only the variants)")
    group.add_argument("--variant", action="append", default=[], metavar="NAME=ARCH:FLAGS",
                       help=f"a named configuration, repeatable, e.g. {VARIANT_EXAMPLE}")
    group.add_argument("--baseline-arch", default=DEFAULT_BASELINE_ARCH,
                       help=f"architecture of the baseline configuration {BASELINE_NAME!r}")
    group.add_argument("--common-flags", default="", metavar="FLAGS",
                       help="model flags for every configuration, the baseline included, e.g. '--share-all-embeddings'")
    group.add_argument("--list-archs", action="store_true", help="print this plugin's architectures and exit")

    group = parser.add_argument_group("matched width (applied where an architecture defines the flag)")
    group.add_argument("--encoder-layers", type=positive_int, default=defaults.encoder_layers)
    group.add_argument("--decoder-layers", type=positive_int, default=defaults.decoder_layers)
    group.add_argument("--embed-dim", type=positive_int, default=defaults.embed_dim,
                       help="--encoder-embed-dim and --decoder-embed-dim")
    group.add_argument("--ffn-dim", type=positive_int, default=defaults.ffn_dim,
                       help="--encoder-ffn-embed-dim and --decoder-ffn-embed-dim")
    group.add_argument("--heads", type=positive_int, default=defaults.heads,
                       help="--encoder-attention-heads and --decoder-attention-heads")
    group.add_argument("--dropout", type=float, default=defaults.dropout)
    group.add_argument("--vocab", type=positive_int, default=defaults.vocab, help="size of the joined dictionary")

    group = parser.add_argument_group("training measurement")
    group.add_argument("--batch-size", type=positive_int, default=defaults.batch_size, help="sentences per batch")
    group.add_argument("--src-len", type=positive_int, default=defaults.src_len, help="source tokens per sentence (EOS included)")
    group.add_argument("--tgt-len", type=positive_int, default=defaults.tgt_len, help="target tokens per sentence (EOS included)")
    group.add_argument("--warmup", type=non_negative_int, default=defaults.warmup, help="untimed training steps per round")
    group.add_argument("--steps", type=positive_int, default=defaults.steps, help="timed training steps per round")
    group.add_argument("--repeats", type=positive_int, default=defaults.repeats, help="rounds over all configurations")
    group.add_argument("--criterion", choices=CRITERIA, default=defaults.criterion)
    group.add_argument("--label-smoothing", type=float, default=defaults.label_smoothing)
    group.add_argument("--lr", type=float, default=defaults.lr)

    group = parser.add_argument_group("decoding measurement")
    group.add_argument("--beam", type=positive_int, default=defaults.beam)
    group.add_argument("--decode-batch-size", type=positive_int, default=defaults.decode_batch_size)
    group.add_argument("--decode-len", type=positive_int, default=None,
                       help="output tokens per hypothesis, forced with min_len = max_len (default: --tgt-len)")
    group.add_argument("--decode-warmup", type=non_negative_int, default=defaults.decode_warmup,
                       help="untimed decode batches per round")
    group.add_argument("--decode-batches", type=positive_int, default=defaults.decode_batches,
                       help="timed decode batches per round")
    group.add_argument("--source-lengths", type=length_list, default=[], metavar="N,N,...",
                       help="also time one decoding step as the source grows, for each source length N (e.g. "
                            "He et al.'s point that layer-wise coordination attends to the source in every layer)")

    group = parser.add_argument_group("device and output")
    group.add_argument("--device", default=defaults.device, help="cpu or cuda")
    group.add_argument("--dtype", default=defaults.dtype, help="fp32, or fp16 / bf16 (autocast, CUDA only)")
    group.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's)")
    group.add_argument("--clock", default=defaults.clock,
                       help="wall: elapsed time; process: this process's CPU time (CPU only; less sensitive to "
                            "other work sharing the cores, but with several threads it sums their CPU time)")
    group.add_argument("--seed", type=int, default=defaults.seed)
    group.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    group.add_argument("--no-flops", action="store_true", help="skip counting the floating-point operations")
    group.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    group.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    add_force_argument(group)
    return parser


def length_list(text: str) -> List[int]:
    """``8,16,32`` -> [8, 16, 32]; argparse names the flag in its error."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text!r}") from None


def settings_from_args(args) -> BenchmarkSettings:
    return BenchmarkSettings(
        device=args.device, dtype=args.dtype, threads=args.threads, clock=args.clock, seed=args.seed,
        encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers, embed_dim=args.embed_dim,
        ffn_dim=args.ffn_dim, heads=args.heads, dropout=args.dropout,
        common_flags=split_flags(args.common_flags, "--common-flags"), vocab=args.vocab,
        batch_size=args.batch_size, src_len=args.src_len, tgt_len=args.tgt_len, warmup=args.warmup,
        steps=args.steps, repeats=args.repeats, criterion=args.criterion, label_smoothing=args.label_smoothing,
        lr=args.lr, beam=args.beam, decode_batch_size=args.decode_batch_size, decode_len=args.decode_len,
        decode_warmup=args.decode_warmup, decode_batches=args.decode_batches, source_lengths=args.source_lengths,
        memory=not args.no_memory,
        flops=not args.no_flops,
    )


def main(argv: Optional[Iterable[str]] = None) -> Dict:
    """Console entry point ``fusion-fairseq-benchmark``. Exit status 2 with a message on bad input."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.list_archs:
        print("\n".join(plugin_architectures()))
        return {}
    try:
        check_outputs(args, [("--json", args.json), ("--markdown", args.markdown)])
    except UsageError as exc:  # one line, before any measurement
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_status) from None
    try:
        settings = settings_from_args(args)
        check_settings(settings)
        configs = build_configs(args.archs, args.variant, args.baseline_arch)
        result = run_benchmark(configs, settings)
    except BenchmarkError as exc:
        parser.error(str(exc))
    result["command"] = shlex.join([PROG, *argv])
    table = markdown_table(result)
    print(table)
    if args.json:
        write_json(args.json, result)
    if args.markdown:
        write_markdown(args.markdown, table)
    return result


if __name__ == "__main__":
    main()

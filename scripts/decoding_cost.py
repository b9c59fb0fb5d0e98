#!/usr/bin/env python
"""Per-step decoding cost of layer-wise coordination against the vanilla Transformer as the
source sentence grows (He et al., NeurIPS 2018).

    python scripts/decoding_cost.py [--lengths 8,16,32,64,128] [--steps 32] [--repeats 5] \\
        [--clock wall|process] [--threads 1] [--json cost.json] [--markdown cost.md] [--force]

Why: in layer-wise coordination every one of the N (paper: 14) target layers attends, at every
decoding step, to the source states of the layer below, in one softmax with the preceding target
positions (Eq. 3). A Transformer's decoder attends to the top encoder layer in each of its 6
layers. So the part of a decoding step that grows with the source length n is N x n
key/value positions against 6 x n, while the part that does not is N layers of Q/K/V/out
projections and FFN for one position against 6 layers of self-attention + source-attention + FFN.
What this script measures is how the cost of ONE decoding step (one new target token for every
hypothesis of the beam) grows with n, for both models, and their ratio.

What is compared (defaults; every number can be changed):

* ``layerwise_coordination``: ``--layers 14 --embed-dim 256 --ffn-embed-dim 1024
  --attention-heads 4`` (the paper's small configuration, one shared stack);
* fairseq's ``transformer``: 6 + 6 layers, d=256, FFN 1024, 4 heads, ``--share-all-embeddings``
  (the paper compares its 14 shared layers with the 6-layer transformer_small of about the same
  size, Sec. 4.2); both parameter counts are printed.

Both use one joined dictionary of ``--vocab`` symbols (default 8000; the output projection and
the beam search over it cost the same for both models), random untrained weights (seed
``--seed``), dropout off (eval mode), and fairseq's real ``SequenceGenerator`` with beam
``--beam`` (5) over ``--batch-size`` (8) synthetic source sentences of exactly n tokens
(n - 1 random words and EOS, no padding).

Fixed number of steps: untrained models stop at arbitrary points, so the generator is built
with ``max_len_a=0, max_len_b=min_len=S``: EOS is forbidden before step S and forced at step S,
every hypothesis is S tokens + EOS, i.e. S + 1 decoder calls for every model and every n (the
script checks the returned lengths).

How the per-step time is obtained (both are reported):

1. **Differential** (the headline number): ``(t(S) - t(S/2)) / (S - S/2)``, the difference of the
   total ``generate`` times with S and with S/2 output tokens, divided by the difference of the
   step counts. Everything that is paid once per sentence cancels: the encoder, the first
   decoding step's projection of the source keys/values, the generator's set-up and
   finalisation. What remains is the average cost of steps S/2+1 .. S. (A step's cost also grows
   slowly with the number of target positions already decoded; both models see the same ones.)
2. **Total minus encoder**: ``(t(S) - t_encoder) / (S + 1)``, with ``t_encoder`` the time of the
   generator's ``forward_encoder`` call in the same run; it still contains the once-per-sentence
   source projection of the first decoder step and the set-up, spread over the steps.

The S-step run is also broken down (per step) into the model's decoder calls
(``forward_decoder``), the reordering of the cached states after each beam step
(``reorder_incremental_state`` + ``reorder_encoder_out``) and the rest (fairseq's beam-search
bookkeeping, the same for both models). The breakdown wraps the generator's ``EnsembleModel``
methods with a clock; the overhead is one clock read per call.

Robustness: every (model, n) cell is warmed up once, then ``--repeats`` rounds each measure
every cell, interleaved: the rounds walk through the source lengths, and for each length run
the two models in an order that alternates every round (and S before S/2 or the reverse,
alternating too). For every round and length the ratio coordination / vanilla is taken within
the round; the table gives the median time per step (and the minimum) and the median ratio with
its min..max over rounds. On a CPU shared with other work, ``--clock process`` (CPU time of this
process; with ``--threads 1`` the compute time of its one thread) is much less sensitive to the
load than ``--clock wall``; the load average is recorded. Timing values are never checked.

Structural check (independent of timing): forward hooks on the key projections count how often,
and on how many positions, the source is projected:

* coordination: ``layer.attention.k_proj`` of every layer (the one shared by both sides, see
  ``fusion_fairseq/modules/mixed_attention.py``). Expected: in the encoder pass one call per
  source layer (N - 1 with sharing: the top source layer feeds nothing) over the n source
  positions; at the first decoder step one call per target layer over the n source positions
  (the source memory of every layer) plus one over the one new target position; at every later
  step exactly one call per layer over one target position, and never the source again.
* vanilla: ``self_attn.k_proj`` of the encoder and decoder layers and ``encoder_attn.k_proj`` of the
  decoder layers. Expected: the source-attention keys computed once per layer at the first
  decoder step (fairseq caches them as static keys), one target position per step afterwards.

The check also reports the rows of each source projection: fairseq's multi-head attention
projects the source once per *sentence* (it drops the beam copies, ``set_beam_size``), the
coordination decoder once per *hypothesis* (batch x beam rows).

Training tokens/s and decoding sentences/s against the vanilla Transformer are measured by the
project's general benchmark (``fusion_fairseq/tools/benchmark.py``); this script only scans the source
length.

``--json`` and ``--markdown`` are checked before any measurement: their directory must exist, and
an existing file is overwritten only with ``--force``.

Exit status: 0; 1 when the structural check fails; 2 on bad settings (the message names the flag).
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
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.append(REPO_ROOT)

import fairseq  # noqa: E402
from fairseq import options  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.models import ARCH_MODEL_REGISTRY  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

import fusion_fairseq  # noqa: E402,F401  (registers the plugin's models)
from fusion_fairseq.tools.common import (  # noqa: E402
    count_parameters, device_name, dictionary_of_size, load_average, positive_int)
from fusion_fairseq.tools.analysis import (  # noqa: E402
    UsageError,
    add_force_argument,
    check_outputs,
    write_json,
    write_markdown,
)

PROG = "decoding_cost.py"
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
COORDINATION, VANILLA = "coordination", "vanilla"


class CostError(Exception):
    """A bad setting: reported as ``error: MESSAGE`` with exit status 2."""


# --------------------------------------------------------------------------------------------
# arguments


def length_list(text):
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        values = []
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError(
            f"--lengths must be comma-separated integers >= 2 (source tokens, EOS included), got {text!r}")
    return sorted(set(values))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Per-step decoding cost of layerwise_coordination vs fairseq's transformer as the source "
        "length grows (fairseq SequenceGenerator, fixed number of steps), and a structural check of the "
        "source key projections.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--lengths", type=length_list, default=[8, 16, 32, 64, 128],
                        help="source lengths n to scan (tokens per sentence, EOS included)")
    parser.add_argument("--steps", type=positive_int, default=32,
                        help="output tokens S per hypothesis (forced with min_len = max_len); the differential "
                        "uses S and S/2 (S >= 2)")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="source sentences per batch")
    parser.add_argument("--beam", type=positive_int, default=5)
    parser.add_argument("--vocab", type=positive_int, default=8000, help="joined dictionary size")
    parser.add_argument("--embed-dim", type=positive_int, default=256)
    parser.add_argument("--ffn-dim", type=positive_int, default=1024)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--layers", type=positive_int, default=14,
                        help="layers N of the coordination stack")
    parser.add_argument("--baseline-layers", type=positive_int, default=6,
                        help="encoder layers = decoder layers of the vanilla transformer")
    parser.add_argument("--coordination-flags", default="",
                        help="extra flags for layerwise_coordination (shell-quoted string), e.g. '--no-layer-sharing'")
    parser.add_argument("--baseline-flags", default="", help="extra flags for transformer (shell-quoted string)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="interleaved measurement rounds")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: elapsed time; process: this process's CPU time (less sensitive to other load)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--structure-steps", type=positive_int, default=4,
                        help="output tokens of the (untimed) structural-check runs")
    parser.add_argument("--json", metavar="OUT", help="write the settings, environment and every number as JSON")
    parser.add_argument("--markdown", metavar="OUT", help="write the tables as Markdown")
    add_force_argument(parser)
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (the differential needs S and S/2 >= 1), got {args.steps}")
    if args.embed_dim % args.heads:
        parser.error(f"--embed-dim {args.embed_dim} is not divisible by --heads {args.heads}")
    if args.clock == "process" and args.device == "cuda":
        parser.error("--clock process measures CPU time; use --clock wall with --device cuda")
    for flag in ("--coordination-flags", "--baseline-flags"):
        try:
            setattr(args, flag[2:].replace("-", "_"), shlex.split(getattr(args, flag[2:].replace("-", "_"))))
        except ValueError as error:
            parser.error(f"{flag}: {error}")
    return args


# --------------------------------------------------------------------------------------------
# models


def model_flags(args) -> Dict[str, List[str]]:
    d, f, h = str(args.embed_dim), str(args.ffn_dim), str(args.heads)
    coordination = ["--layers", str(args.layers), "--embed-dim", d, "--ffn-embed-dim", f, "--attention-heads", h,
                    "--dropout", "0.1"]
    vanilla = ["--encoder-layers", str(args.baseline_layers), "--decoder-layers", str(args.baseline_layers),
               "--encoder-embed-dim", d, "--decoder-embed-dim", d, "--encoder-ffn-embed-dim", f,
               "--decoder-ffn-embed-dim", f, "--encoder-attention-heads", h, "--decoder-attention-heads", h,
               "--share-all-embeddings", "--dropout", "0.1"]
    return {COORDINATION: coordination + list(args.coordination_flags), VANILLA: vanilla + list(args.baseline_flags)}


ARCHS = {COORDINATION: "layerwise_coordination", VANILLA: "transformer"}


def build_model(name: str, flags: List[str], dictionary: Dictionary, seed: int, device):
    arch = ARCHS[name]
    parser = options.get_training_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            model_args = options.parse_args_and_arch(parser, ["unused-data-dir", "--arch", arch, *flags])
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines()
        flag = "--coordination-flags" if name == COORDINATION else "--baseline-flags"
        raise CostError(f"{flag}: fairseq rejected the {arch} flags {shlex.join(flags)!r}: "
                        f"{lines[-1] if lines else 'argument error'}") from None
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(model_args, task)
    return model.to(device).eval()


def source_sample(dictionary: Dictionary, batch: int, length: int, seed: int, device):
    generator = torch.Generator().manual_seed(seed * 1000 + length)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (batch, length), generator=generator)
    tokens[:, -1] = dictionary.eos()
    return {
        "id": torch.arange(batch).to(device),
        "nsentences": batch,
        "net_input": {"src_tokens": tokens.to(device), "src_lengths": torch.full((batch,), length).to(device)},
    }


# --------------------------------------------------------------------------------------------
# an instrumented generator


class Instrumented:
    """fairseq's SequenceGenerator with the EnsembleModel's calls timed (and counted by phase)."""

    PARTS = ("forward_encoder", "forward_decoder", "reorder_incremental_state", "reorder_encoder_out")

    def __init__(self, model, dictionary, beam: int, steps: int, clock, sync):
        self.model = model
        self.generator = SequenceGenerator([model], dictionary, beam_size=beam,
                                           max_len_a=0, max_len_b=steps, min_len=steps)
        self.steps = steps
        self.clock = clock
        self.sync = sync
        self.times = dict.fromkeys(self.PARTS, 0.0)
        self.phase = None  # ("encoder", 0) or ("decoder", step)
        self.decoder_calls = 0
        ensemble = self.generator.model
        for part in self.PARTS:
            setattr(ensemble, part, self._timed(part, getattr(ensemble, part)))

    def _timed(self, part, method):
        def call(*args, **kwargs):
            if part == "forward_encoder":
                self.phase = ("encoder", 0)
            elif part == "forward_decoder":
                self.phase = ("decoder", self.decoder_calls)
                self.decoder_calls += 1
            self.sync()
            start = self.clock()
            try:
                return method(*args, **kwargs)
            finally:
                self.sync()
                self.times[part] += self.clock() - start
        return call

    def generate(self, sample):
        """Total seconds and the per-part seconds of one ``generate`` call."""
        self.times = dict.fromkeys(self.PARTS, 0.0)
        self.decoder_calls = 0
        self.sync()
        start = self.clock()
        hypos = self.generator.generate([self.model], sample)
        self.sync()
        total = self.clock() - start
        lengths = {len(h["tokens"]) for sentence in hypos for h in sentence}
        if len(hypos) != sample["nsentences"] or lengths != {self.steps + 1}:
            raise RuntimeError(f"min_len = max_len = {self.steps} should give exactly {self.steps + 1} tokens "
                               f"(EOS included) per hypothesis, got lengths {sorted(lengths)}")
        if self.decoder_calls != self.steps + 1:
            raise RuntimeError(f"expected {self.steps + 1} decoder calls, got {self.decoder_calls}")
        return total, dict(self.times)


# --------------------------------------------------------------------------------------------
# structural check


def projection_modules(name: str, model):
    """(label, role, layout, module) of every key projection, each module once."""
    seen, found = set(), []

    def add(label, role, layout, module):
        if id(module) not in seen:
            seen.add(id(module))
            found.append((label, role, layout, module))

    if name == COORDINATION:
        for index, layer in enumerate(model.decoder.layers):
            add(f"layers[{index}].attention.k_proj", "shared" if layer in list(model.encoder.layers) else "target",
                "BTC", layer.attention.k_proj)
        for index, layer in enumerate(model.encoder.layers):
            add(f"encoder.layers[{index}].attention.k_proj", "source", "BTC", layer.attention.k_proj)
    else:
        for index, layer in enumerate(model.encoder.layers):
            add(f"encoder.layers[{index}].self_attn.k_proj", "encoder", "TBC", layer.self_attn.k_proj)
        for index, layer in enumerate(model.decoder.layers):
            add(f"decoder.layers[{index}].self_attn.k_proj", "target", "TBC", layer.self_attn.k_proj)
            add(f"decoder.layers[{index}].encoder_attn.k_proj", "source-attention", "TBC", layer.encoder_attn.k_proj)
    return found


def projection_calls(name: str, model, dictionary, args, length: int, device) -> List[Dict[str, object]]:
    """Generate once and record every key-projection call: module, role, phase, step, rows, positions."""
    runner = Instrumented(model, dictionary, args.beam, args.structure_steps, time.perf_counter, lambda: None)
    calls = []
    handles = []
    for label, role, layout, module in projection_modules(name, model):
        def hook(module, inputs, output, label=label, role=role, layout=layout):
            shape = tuple(inputs[0].shape)
            rows, positions = (shape[0], shape[1]) if layout == "BTC" else (shape[1], shape[0])
            phase, step = runner.phase
            calls.append({"module": label, "role": role, "phase": phase, "step": step, "rows": rows,
                          "positions": positions})
        handles.append(module.register_forward_hook(hook))
    try:
        runner.generate(source_sample(dictionary, args.batch_size, length, args.seed, device))
    finally:
        for handle in handles:
            handle.remove()
    return calls


def coordination_checks(encoder_calls, first, later, per_step, length: int, steps: int, target_layers: int,
                        source_layers: int):
    """The first step's source projections and the checks of the coordination model."""
    first_source = [c for c in first if c["positions"] == length]
    first_target = [c for c in first if c["positions"] == 1]
    checks = {
        "encoder: one call per source layer over the n source positions":
            len(encoder_calls) == source_layers and all(c["positions"] == length for c in encoder_calls),
        "first decoder step: one call per target layer over the n source positions":
            len(first_source) == target_layers,
        "first decoder step: one call per target layer over the one new target position":
            len(first_target) == target_layers and len(first) == 2 * target_layers,
        "every later step: one call per layer, over one target position only":
            len(per_step) == steps
            and all(len(v) == target_layers and all(c["positions"] == 1 for c in v) for v in per_step.values()),
        "the source is never projected after the first step": not any(c["positions"] == length for c in later),
    }
    return first_source, checks


def transformer_checks(first, later, per_step, length: int, steps: int, target_layers: int):
    """The first step's source projections and the checks of the Transformer."""
    first_source = [c for c in first if c["role"] == "source-attention"]
    checks = {
        "first decoder step: source-attention keys once per decoder layer over the n source positions":
            len(first_source) == target_layers and all(c["positions"] == length for c in first_source),
        "every later step: only the self-attention, over one target position":
            len(per_step) == steps
            and all(len(v) == target_layers and all(c["role"] == "target" and c["positions"] == 1 for c in v)
                    for v in per_step.values()),
        "the source is never projected after the first step":
            not any(c["role"] == "source-attention" for c in later),
    }
    return first_source, checks


def structure_check(name: str, model, dictionary, args, length: int, device, target_layers: int,
                    source_layers: int) -> Dict[str, object]:
    """Count the key projections by phase; ``passed`` says whether the source is projected once
    per layer per sentence (first decoder step), never per step."""
    calls = projection_calls(name, model, dictionary, args, length, device)
    batch, hypotheses = args.batch_size, args.batch_size * args.beam
    encoder_calls = [c for c in calls if c["phase"] == "encoder"]
    first = [c for c in calls if c["phase"] == "decoder" and c["step"] == 0]
    later = [c for c in calls if c["phase"] == "decoder" and c["step"] > 0]
    decoder_source = [c for c in calls if c["phase"] == "decoder" and c["positions"] == length]
    per_step = {}
    for c in later:
        per_step.setdefault(c["step"], []).append(c)
    if name == COORDINATION:
        first_source, checks = coordination_checks(encoder_calls, first, later, per_step, length,
                                                    args.structure_steps, target_layers, source_layers)
    else:
        first_source, checks = transformer_checks(first, later, per_step, length, args.structure_steps,
                                                  target_layers)
    source_rows = sorted({c["rows"] for c in first_source})
    return {
        "source_length": length,
        "decoder_steps": args.structure_steps + 1,
        "encoder_calls": len(encoder_calls),
        "first_step_source_projections": len(first_source),
        "first_step_source_projection_rows": source_rows,
        "source_projected_per": ("sentence" if source_rows == [batch] else
                                 "hypothesis (batch x beam)" if source_rows == [hypotheses] else str(source_rows)),
        "later_steps_calls_per_step": sorted({len(v) for v in per_step.values()}),
        "later_steps_positions": sorted({c["positions"] for c in later}),
        "decoder_source_projections_total": len(decoder_source),
        "checks": checks,
        "passed": all(checks.values()),
        "calls": calls,
    }


# --------------------------------------------------------------------------------------------
# the scan


def summarise(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "per_round": values}


def run(args, log=lambda message: print(message, file=sys.stderr, flush=True)) -> Dict[str, object]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CostError("--device cuda: CUDA is not available")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = CLOCKS[args.clock]
    dictionary = dictionary_of_size(args.vocab)
    flags = model_flags(args)
    models = {name: build_model(name, flags[name], dictionary, args.seed, device) for name in (COORDINATION, VANILLA)}
    parameters = {name: count_parameters(model) for name, model in models.items()}
    target_layers = {COORDINATION: len(models[COORDINATION].decoder.layers),
                     VANILLA: len(models[VANILLA].decoder.layers)}
    source_layers = {COORDINATION: len(models[COORDINATION].encoder.source_layers()),
                     VANILLA: len(models[VANILLA].encoder.layers)}
    for name in models:
        log(f"{name}: {ARCHS[name]} {shlex.join(flags[name])}: {parameters[name]:,} parameters")

    half = args.steps // 2
    runners = {(name, steps): Instrumented(model, dictionary, args.beam, steps, clock, sync)
               for name, model in models.items() for steps in (args.steps, half)}
    samples = {n: source_sample(dictionary, args.batch_size, n, args.seed, device) for n in args.lengths}
    env = {
        "device": args.device, "device_name": device_name(device), "torch": torch.__version__,
        "fairseq": getattr(fairseq, "__version__", "unknown"), "python": platform.python_version(),
        "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "clock": args.clock,
        "load_average_start": load_average(),
    }

    with torch.no_grad():
        structure = {name: {n: structure_check(name, model, dictionary, args, n, device, target_layers[name],
                                               source_layers[name])
                            for n in (args.lengths[0], args.lengths[-1])}
                     for name, model in models.items()}
        raw, timing_seconds = timed_rounds(runners, samples, args, half, log)
    names = [COORDINATION, VANILLA]
    rows = [length_row(n, raw, args.steps, half) for n in args.lengths]
    env["load_average_end"] = load_average()
    return {
        "settings": {
            "lengths": args.lengths, "steps": args.steps, "half_steps": half, "batch_size": args.batch_size,
            "beam": args.beam, "vocab": args.vocab, "embed_dim": args.embed_dim, "ffn_dim": args.ffn_dim,
            "heads": args.heads, "repeats": args.repeats, "seed": args.seed,
            "decoding": f"fairseq SequenceGenerator, beam {args.beam}, max_len_a=0, max_len_b=min_len=S "
                        f"(S={args.steps} and S/2={half}; every hypothesis S tokens + EOS, S + 1 decoder calls)",
            "ms_per_step": f"(t(S) - t(S/2)) / (S - S/2), median over {args.repeats} interleaved rounds",
            "ms_per_step_excl_encoder": "(t(S) - t_forward_encoder) / (S + 1)",
        },
        "environment": env,
        "timing_seconds": timing_seconds,
        "models": {name: {"arch": ARCHS[name], "flags": flags[name], "parameters": parameters[name],
                          "target_layers": target_layers[name], "source_layers": source_layers[name]}
                   for name in names},
        "rows": rows,
        "structure": {name: {str(n): check for n, check in by_length.items()} for name, by_length in structure.items()},
        "structure_passed": all(check["passed"] for by_length in structure.values() for check in by_length.values()),
    }


def timed_rounds(runners, samples, args, half: int, log):
    """Every (model, length) cell timed at S and S/2 steps, after one untimed warm-up of each; the
    models and the step counts alternate their order from round to round. Returns ({(model, length):
    [{steps: (seconds, parts)} per round]}, the seconds it took)."""
    names = [COORDINATION, VANILLA]
    for runner in runners.values():  # warm-up: every cell once, untimed
        for n in args.lengths:
            runner.generate(samples[n])
    raw = {(name, n): [] for name in names for n in args.lengths}
    started = time.perf_counter()
    for round_index in range(args.repeats):
        order = names if round_index % 2 == 0 else names[::-1]
        step_order = (args.steps, half) if round_index % 2 == 0 else (half, args.steps)
        for n in args.lengths:
            for name in order:
                raw[(name, n)].append({steps: runners[(name, steps)].generate(samples[n]) for steps in step_order})
            log(f"[round {round_index + 1}/{args.repeats}] n={n}: " + ", ".join(
                f"{name} {1000 * per_step_differential(raw[(name, n)][-1], args.steps, half):.2f} ms/step"
                for name in names))
    return raw, time.perf_counter() - started


def length_row(n: int, raw, steps: int, half: int) -> Dict[str, object]:
    """One source length's row: per model the per-step cost and its parts (ms), and the ratios."""
    row = {"source_length": n}
    per_round = {}
    for name in (COORDINATION, VANILLA):
        measurements = raw[(name, n)]
        differential = [1000 * per_step_differential(m, steps, half) for m in measurements]
        total, parts = zip(*(m[steps] for m in measurements))
        calls = steps + 1
        excl_encoder = [1000 * (t - p["forward_encoder"]) / calls for t, p in zip(total, parts)]
        decoder = [1000 * p["forward_decoder"] / calls for p in parts]
        reorder_state = [1000 * p["reorder_incremental_state"] / calls for p in parts]
        reorder_encoder = [1000 * p["reorder_encoder_out"] / calls for p in parts]
        reorder = [a + b for a, b in zip(reorder_state, reorder_encoder)]
        search = [e - d - r for e, d, r in zip(excl_encoder, decoder, reorder)]
        per_round[name] = {"differential": differential, "excl_encoder": excl_encoder}
        row[name] = {
            "ms_per_step": summarise(differential),
            "ms_per_step_excl_encoder": summarise(excl_encoder),
            "decoder_ms_per_step": summarise(decoder),
            "reorder_ms_per_step": summarise(reorder),
            "reorder_incremental_state_ms_per_step": summarise(reorder_state),
            "reorder_encoder_out_ms_per_step": summarise(reorder_encoder),
            "search_ms_per_step": summarise(search),
            "encoder_ms": summarise([1000 * p["forward_encoder"] for p in parts]),
            "generate_ms": summarise([1000 * t for t in total]),
        }
    for key, label in (("differential", "ratio"), ("excl_encoder", "ratio_excl_encoder")):
        row[label] = summarise([c / v for c, v in zip(per_round[COORDINATION][key], per_round[VANILLA][key])])
    return row


def per_step_differential(measured, steps: int, half: int) -> float:
    return (measured[steps][0] - measured[half][0]) / (steps - half)


# --------------------------------------------------------------------------------------------
# reports


def _ms(stats):
    return f"{stats['median']:.2f} ({stats['min']:.2f})"


def _ratio(stats):
    return f"{stats['median']:.2f} [{stats['min']:.2f}-{stats['max']:.2f}]"


def table_rows(result) -> List[List[str]]:
    header = ["n (src tokens)", "coord ms/step", "vanilla ms/step", "ratio coord/vanilla",
              "coord excl. enc", "vanilla excl. enc", "ratio excl. enc",
              "coord decoder+reorder", "vanilla decoder+reorder", "coord encoder ms", "vanilla encoder ms"]
    lines = [header]
    for row in result["rows"]:
        c, v = row[COORDINATION], row[VANILLA]
        lines.append([
            str(row["source_length"]), _ms(c["ms_per_step"]), _ms(v["ms_per_step"]), _ratio(row["ratio"]),
            _ms(c["ms_per_step_excl_encoder"]), _ms(v["ms_per_step_excl_encoder"]), _ratio(row["ratio_excl_encoder"]),
            f"{c['decoder_ms_per_step']['median']:.2f}+{c['reorder_ms_per_step']['median']:.2f}",
            f"{v['decoder_ms_per_step']['median']:.2f}+{v['reorder_ms_per_step']['median']:.2f}",
            f"{c['encoder_ms']['median']:.1f}", f"{v['encoder_ms']['median']:.1f}",
        ])
    return lines


def describe(result) -> List[str]:
    s, env, m = result["settings"], result["environment"], result["models"]
    return [
        f"coordination: layerwise_coordination, {m[COORDINATION]['target_layers']} layers "
        f"({shlex.join(m[COORDINATION]['flags'])}): {m[COORDINATION]['parameters']:,} parameters",
        f"vanilla: transformer {m[VANILLA]['source_layers']}+{m[VANILLA]['target_layers']} layers "
        f"({shlex.join(m[VANILLA]['flags'])}): {m[VANILLA]['parameters']:,} parameters",
        f"{s['decoding']}; batch {s['batch_size']} sentences; joined dictionary of {s['vocab']} symbols; "
        f"random weights, eval mode",
        f"ms/step = {s['ms_per_step']}; 'excl. enc' = {s['ms_per_step_excl_encoder']}; cells: median (min); "
        f"ratios: median [min-max] of the per-round ratios; decoder+reorder: the decoder calls and the "
        f"reordering of cached states per step (the rest of a step is fairseq's beam search)",
        f"device: {env['device']} ({env['device_name']}), {env['threads']} thread(s), clock {env['clock']}, "
        f"load average {fmt_load(env['load_average_start'])} -> {fmt_load(env['load_average_end'])}; "
        f"torch {env['torch']}, fairseq {env['fairseq']}",
    ]


def fmt_load(load):
    return "n/a" if load is None else "/".join(f"{v:.2f}" for v in load)


def structure_lines(result) -> List[str]:
    lines = []
    for name, by_length in result["structure"].items():
        for n, check in by_length.items():
            status = "PASS" if check["passed"] else "FAIL"
            lines.append(
                f"{status} {name}, n={n}: encoder pass {check['encoder_calls']} key projections; first decoder step "
                f"{check['first_step_source_projections']} source projections ({check['source_projected_per']}: "
                f"rows {check['first_step_source_projection_rows']}); later steps "
                f"{check['later_steps_calls_per_step']} calls per step over {check['later_steps_positions']} "
                f"position(s); source projections in the whole decode: {check['decoder_source_projections_total']}")
            for description, ok in check["checks"].items():
                lines.append(f"    [{'x' if ok else ' '}] {description}")
    return lines


def format_text(result) -> str:
    table = table_rows(result)
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    out = describe(result) + [""]
    out += ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in table]
    out += ["", "structural check (forward hooks on the key projections, untimed):"] + structure_lines(result)
    return "\n".join(out)


def format_markdown(result) -> str:
    table = table_rows(result)
    out = ["# Per-step decoding cost vs source length", ""]
    out += [f"- {line}" for line in describe(result)]
    out += ["", "| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    out += ["| " + " | ".join(line) + " |" for line in table[1:]]
    out += ["", "## Structural check", "", "```"] + structure_lines(result) + ["```", ""]
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        check_outputs(args, [("--json", args.json), ("--markdown", args.markdown)])
        result = run(args)
    except (CostError, UsageError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(format_text(result))
    if args.json:
        write_json(args.json, result)
    if args.markdown:
        write_markdown(args.markdown, format_markdown(result))
    return 0 if result["structure_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

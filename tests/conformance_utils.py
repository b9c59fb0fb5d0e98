"""Helpers of the conformance suite (``tests/test_conformance.py``).

Everything here drives the plugin's models through fairseq's own machinery (argument parsing,
task, collater, incremental-state API, checkpoint files, SequenceGenerator, console entry
points), so that a model that passes behaves like any fairseq encoder-decoder wherever fairseq
puts it.
"""

import json
import os
import subprocess
import sys
from argparse import Namespace
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
from fairseq.sequence_generator import SequenceGenerator
from omegaconf import OmegaConf

import fusion_fairseq.models  # noqa: F401  (registers the plugin)
from conftest import TINY_MLRF_FLAGS, run_cli
from fusion_fairseq.cli import user_dir
from fusion_lab import common
from fusion_fairseq.models import activation_checkpointing

TOLERANCE = 1e-5


# --------------------------------------------------------------------------- discovery


def plugin_architectures() -> Dict[str, str]:
    """``{arch name: registered model name}`` for every architecture of this plugin, sorted."""
    return {arch: ARCH_MODEL_NAME_REGISTRY[arch] for arch in sorted(common.plugin_architectures())}


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class Tiny:
    """Command-line overrides that make a registered model tiny, and the corpus it needs."""

    flags: Sequence[str]
    joined_dictionary: bool = False  # models sharing one vocabulary between source and target


@dataclass(frozen=True)
class Variant:
    """One configuration under test: an architecture plus extra command-line flags."""

    id: str
    arch: str
    flags: Sequence[str] = ()


@dataclass
class Built:
    args: Namespace
    task: object
    model: torch.nn.Module


def build_like_fairseq_train(data_bin: str, arch: str, flags: Sequence[str], seed: int = 1) -> Built:
    """Parse ``flags`` exactly as ``fairseq-train`` does, then ``setup_task`` / ``build_model``.
    The model is fp32 and in eval mode (no dropout), so every comparison is deterministic."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_bin, "--arch", arch, *flags, "--user-dir", user_dir()])
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    model = task.build_model(args).float().eval()
    return Built(args, task, model)


def distinct_length_indices(dataset, count: int) -> List[int]:
    """Indices of ``count`` sentences with pairwise different source lengths, longest first,
    spread over the range of lengths."""
    by_length = {}
    for index in range(len(dataset)):
        by_length.setdefault(int(dataset.src_sizes[index]), index)
    lengths = sorted(by_length, reverse=True)
    picks = [lengths[round(i * (len(lengths) - 1) / (count - 1))] for i in range(count)]
    return [by_length[length] for length in picks]


@dataclass
class Corpus:
    """A binarised corpus with its training split and a real collated batch of 4 sentences of
    different lengths (source LEFT-padded, target right-padded, as fairseq's collater does)."""

    data_bin: str
    train_set: object
    batch: dict
    checkpoint_writer: "CheckpointWriter"

    @classmethod
    def load(cls, data_bin: str, built: Built) -> "Corpus":
        built.task.load_dataset("train")
        train_set = built.task.dataset("train")
        batch = train_set.collater([train_set[i] for i in distinct_length_indices(train_set, 4)])
        pad = train_set.src_dict.pad()
        assert batch["net_input"]["src_tokens"][:, 0].eq(pad).any(), "expected left-padded sources"
        assert batch["net_input"]["prev_output_tokens"][:, -1].eq(pad).any(), "expected right-padded targets"
        return cls(data_bin, train_set, batch, CheckpointWriter(built.args))


# --------------------------------------------------------------------------- tiny configurations

TINY_TRANSFORMER_FLAGS = (
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
)
# Tiny command-line overrides per registered *model* name (they apply to all its archs). A model
# registered without an entry here fails ``test_every_registered_model_has_tiny_overrides`` and
# every test of its archs.
TINY_OVERRIDES = {
    "fusion_transformer": Tiny(TINY_MLRF_FLAGS),
    "dense_transformer": Tiny((*TINY_TRANSFORMER_FLAGS, "--growth-dim", "8")),
    "dense_fconv": Tiny((
        "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--decoder-out-embed-dim", "16",
        "--encoder-layers", "[(8, 3)] * 3", "--decoder-layers", "[(8, 3)] * 3",
    )),
    "layerwise_coordination": Tiny(
        ("--layers", "2", "--embed-dim", "16", "--ffn-embed-dim", "32", "--attention-heads", "2"),
        joined_dictionary=True,  # one stack and one embedding for both languages
    ),
}

ARCHITECTURES = plugin_architectures()  # {arch: model name}, read after ``import fusion_fairseq``
# ConvS2S's defaults densely connected: 982M parameters, about 20 GB in fp16 training with Adam. On a
# 2-core CPU it takes minutes; on one GPU, several such runs at once beside the others overflow 80 GB.
LARGEST_ARCHITECTURES = {"dense_fconv"}

# One configuration per family; fusion_transformer's composes the three papers it implements
# (hierarchical aggregation and multi-layer attention, MLRF decoder fusion, SurfaceFusion).
FAMILY_FLAGS = {
    "fusion_transformer": ("--aggregate-encoder", "hierarchical", "--fuse-decoder", "sa", "--surface-fusion", "hard",
                           "--multi-layer-attention", "2", "--encoder-layers", "3", "--decoder-layers", "3"),
}
FAMILIES = [Variant(model, model, FAMILY_FLAGS.get(model, ())) for model in sorted(TINY_OVERRIDES)
            if model in ARCHITECTURES.values()]


def tiny_config(variant) -> Tiny:
    model_name = ARCHITECTURES.get(variant.arch)
    if model_name not in TINY_OVERRIDES:
        pytest.fail(
            f"architecture {variant.arch!r} (model {model_name!r}) has no tiny overrides: add an entry "
            f"for {model_name!r} to TINY_OVERRIDES in tests/conformance_utils.py"
        )
    return TINY_OVERRIDES[model_name]


def flags_of(variant):
    return [*tiny_config(variant).flags, *variant.flags]


def data_bin_fixture(variant):
    return "tiny_joined_data_bin" if tiny_config(variant).joined_dictionary else "tiny_data_bin"


# --------------------------------------------------------------------------- forward passes


def normalized(model, decoder_out):
    """(raw logits, log-probabilities) of a decoder output, the latter as generation reads them."""
    return decoder_out[0], model.get_normalized_probs(decoder_out, log_probs=True)


def full_forward(model, net_input):
    """Teacher-forced forward: encoder output, logits and log-probs for all target positions."""
    encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    decoder_out = model.decoder(net_input["prev_output_tokens"], encoder_out=encoder_out)
    return (encoder_out, *normalized(model, decoder_out))


def decode_incrementally(model, encoder_out, prev_output_tokens, reorder_after: Optional[int] = None, new_order=None):
    """Logits and log-probs computed one target position at a time, as beam search does: the
    decoder gets the growing prefix ``prev_output_tokens[:, :t+1]`` plus its incremental state.

    With ``reorder_after=k`` the encoder output and the cached states are reordered by
    ``new_order`` before step ``k`` (``reorder_encoder_out`` / ``reorder_incremental_state_scripting``,
    the two calls SequenceGenerator makes) and decoding continues on the reordered prefixes.
    Returns ``(logits, lprobs)`` for the steps before the reorder and for the steps from it on,
    each ``batch x steps x vocab`` (the second pair is ``None`` without a reorder).
    """
    prev = prev_output_tokens
    state: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}
    before, after = [], []
    for step in range(prev.size(1)):
        if step == reorder_after:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            prev = prev.index_select(0, new_order)
        decoder_out = model.decoder(prev[:, : step + 1], encoder_out=encoder_out, incremental_state=state)
        (after if reorder_after is not None and step >= reorder_after else before).append(normalized(model, decoder_out))

    def stack(steps):
        return tuple(torch.cat(parts, dim=1) for parts in zip(*steps)) if steps else None

    return stack(before), stack(after)


def assert_close(actual, expected, what: str, mask=None, tolerance: float = TOLERANCE):
    """max |actual - expected| <= tolerance over the positions where ``mask`` (batch x time) is
    True; the message names the check and the first offending position. NaN always fails."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = (actual.float() - expected.float()).abs()
    if mask is not None:
        diff = diff.masked_fill(~mask.unsqueeze(-1), 0.0)
    bad = (diff > tolerance) | diff.isnan()
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: max abs diff {diff.max().item():.3g} > {tolerance:g}; first bad (batch, time, feature) = {where}"
        )


class SavedActivationBytes:
    """Counts the bytes of the tensors autograd keeps for backward while the context is open
    (each storage once, parameters excluded): the activation memory that is live when backward
    starts, i.e. the peak that activation checkpointing lowers. fairseq's re-entrant checkpoint
    saves a layer's inputs only (the layer runs without autograd), which the hooks see; torch's
    non-re-entrant one (the plugin's ``call_checkpointed``) drops what is saved inside its
    region and keeps the region's inputs for the recomputation outside autograd's saved
    tensors, so those inputs are counted where the plugin hands them to torch's checkpoint."""

    def __init__(self, model):
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages = {}

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.parameters:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def checkpoint_counting_inputs(self, function, *args, **kwargs):
        for value in [*args, *kwargs.values()]:
            for tensor in value if isinstance(value, (list, tuple)) else [value]:
                if torch.is_tensor(tensor):
                    self.pack(tensor)
        return self.checkpoint(function, *args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self.checkpoint = activation_checkpointing.checkpoint
        activation_checkpointing.checkpoint = self.checkpoint_counting_inputs
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        activation_checkpointing.checkpoint = self.checkpoint


def training_step(model, batch, seed: int = 7):
    """Summed NLL of ``batch``'s targets in training mode (dropout on, its masks fixed by
    ``seed``), its gradients ``{name: grad}``, and the bytes kept for backward."""
    model.train()
    model.zero_grad()
    torch.manual_seed(seed)
    with SavedActivationBytes(model) as saved:
        _, _, lprobs = full_forward(model, batch["net_input"])
        target = batch["target"]
        pad = model.decoder.dictionary.pad()
        token_nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        loss = token_nll.masked_fill(target.eq(pad), 0.0).sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.eval()
    return loss.detach(), grads, saved.total


# --------------------------------------------------------------------------- checkpoints


class CheckpointWriter:
    """Writes checkpoints with the layout of ``fairseq.trainer.Trainer.state_dict``, through
    ``checkpoint_utils.torch_persistent_save`` (what fairseq-train itself calls).

    The configuration is stored as plain containers. Models configured by a registered dataclass
    (this plugin's) get fairseq's full flags-to-configuration conversion (a hydra compose, a second
    or more); for argparse-registered models (fairseq's ``transformer``) it runs once per corpus,
    here, and per model only the ``model`` section, an ``argparse.Namespace`` of every flag plus
    ``_name`` (the arch), is replaced, as the conversion would do it (checked on the template's own
    flags when they are such a model's).
    """

    def __init__(self, args: Namespace):
        self.template = self.full_config(args)
        if isinstance(self.template["model"], Namespace):
            assert vars(self.template["model"]) == vars(self.model_section(args)), "fairseq's legacy model config changed"

    @staticmethod
    def full_config(args: Namespace) -> dict:
        return OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)

    @staticmethod
    def model_section(args: Namespace) -> Namespace:
        section = Namespace(**vars(args))
        section._name = args.arch
        return section

    def config(self, args: Namespace) -> dict:
        if ARCH_MODEL_NAME_REGISTRY[args.arch] in MODEL_DATACLASS_REGISTRY:
            return self.full_config(args)
        return {**self.template, "model": self.model_section(args)}

    def save(self, model, args: Namespace, path: str):
        state = {
            "args": None,
            "cfg": self.config(args),
            "model": model.state_dict(),
            "criterion": None,
            "optimizer_history": [
                {"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                 "lr_scheduler_state": {"best": None}, "num_updates": 0}
            ],
            "task_state": {},
            "extra_state": {},
        }
        checkpoint_utils.torch_persistent_save(state, path)


# --------------------------------------------------------------------------- generation


class LinearWorkRecorder:
    """Counts, per decoder call, the input rows (positions x hypotheses) that go through the
    decoder's ``nn.Linear`` modules, and records the prefix length and how many entries the
    incremental state already held.

    A decoder that decodes from its cache does the same projection work at every step after the
    first (the first also projects the source memory); one that recomputes its prefix does work
    growing with the prefix. Works for any decoder built from ``nn.Linear`` (fairseq attention,
    FFNs, fusion modules). SequenceGenerator calls ``model.decoder.forward(...)`` directly (no
    module hooks fire on the decoder itself), so ``forward`` is wrapped on the instance. Use as a
    context manager; everything is undone on exit.
    """

    def __init__(self, model):
        self.decoder = model.decoder
        self.calls: List[dict] = []
        self.handles = []

    def __enter__(self):
        original = self.decoder.forward

        def forward(prev_output_tokens, *args, incremental_state=None, **kwargs):
            self.calls.append({
                "prefix_len": prev_output_tokens.size(1),
                "state_entries_before": None if incremental_state is None else len(incremental_state),
                "linear_rows": 0,
            })
            return original(prev_output_tokens, *args, incremental_state=incremental_state, **kwargs)

        def count(module, inputs):
            if self.calls:
                self.calls[-1]["linear_rows"] += inputs[0].numel() // inputs[0].size(-1)

        self.decoder.forward = forward
        self.handles = [m.register_forward_pre_hook(count) for m in self.decoder.modules() if isinstance(m, torch.nn.Linear)]
        return self

    def __exit__(self, *exc):
        del self.decoder.forward  # back to the class's method
        for handle in self.handles:
            handle.remove()


def beam_search(model, task, sample, beam: int = 3, length: int = 6):
    """fairseq's SequenceGenerator (the engine of fairseq-generate/-interactive) on ``sample``,
    made to decode exactly ``length`` tokens plus EOS (``min_len`` = ``max_len``), so every run
    has the same number of steps whatever the (untrained) model prefers."""
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                                  min_len=length)
    with torch.no_grad():
        return generator.generate([model], sample)


def teacher_forced_token_scores(model, src_tokens, src_lengths, hypothesis_tokens, eos: int):
    """Log-probability of each token of a hypothesis (EOS-terminated) when the whole hypothesis is
    fed at once: what beam search should have computed step by step."""
    prev = torch.cat([hypothesis_tokens.new_tensor([eos]), hypothesis_tokens[:-1]]).unsqueeze(0)
    _, _, lprobs = full_forward(model, {"src_tokens": src_tokens, "src_lengths": src_lengths, "prev_output_tokens": prev})
    return lprobs[0].gather(-1, hypothesis_tokens.unsqueeze(-1)).squeeze(-1)


# --------------------------------------------------------------------------- command line


@dataclass
class CliRun:
    """One console entry point invocation and what came out of it."""

    name: str
    module: str
    args: Sequence[str]
    stdin: str = ""
    stdout: str = ""
    log: str = ""
    error: Optional[str] = None


# Data loading in the command's own thread, as the tools do (common.BATCHES_IN_THREAD): commands run one after
# another in one interpreter, where a left-over loader worker would hold up the next command for seconds.
IN_PROCESS = common.BATCHES_IN_THREAD


def cli_pipeline(data_bin: str, arch: str, flags: Sequence[str], save_dir: str) -> List[CliRun]:
    """fairseq-train (5 updates) -> fairseq-generate (beam 3) -> fairseq-interactive (beam 3, two
    sentences on stdin), each with ``--user-dir``."""
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    return [
        CliRun("train", "fairseq_cli.train", [
            data_bin, "--user-dir", user_dir(), "--arch", arch, *flags,
            "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "5",
            "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints", *IN_PROCESS,
        ]),
        # with fairseq's default --required-batch-size-multiple 8 it would drop 4 of the 12 test
        # sentences (fairseq #5036, left as it is by the plugin): all 12 must be translated
        CliRun("generate", "fairseq_cli.generate", [
            data_bin, "--user-dir", user_dir(), "--path", checkpoint, "--beam", "3", *IN_PROCESS,
            "--required-batch-size-multiple", "1",
        ]),
        CliRun("interactive", "fairseq_cli.interactive", [
            data_bin, "--user-dir", user_dir(), "--path", checkpoint, "--beam", "3", *IN_PROCESS,
            "--source-lang", "src", "--target-lang", "tgt",
        ], stdin="w1 w2 w3\nw4 w5 w6 w7\n"),
    ]


def run_each_in_fresh_interpreter(runs: List[CliRun]) -> List[CliRun]:
    """``python -m MODULE ARGS`` per run, a new interpreter each (conftest.run_cli)."""
    for run in runs:
        try:
            result = run_cli(run.module, *run.args, stdin=run.stdin)
            run.stdout, run.log = result.stdout, result.stderr
        except AssertionError as failure:
            run.error = str(failure)
    return runs


# Executed by ``python -c``: runs the entry points of a plan one after another in ONE interpreter,
# each as ``python -m MODULE ARGS`` does (runpy, ``__main__``, its own argv and stdin), capturing
# its stdout and its log records. Saves the ~5 s of imports per run that a fresh interpreter
# costs; the plugin arrives only through the runs' ``--user-dir``, as in a fresh one.
CLI_DRIVER = r"""
import contextlib, io, json, logging, runpy, sys, traceback
plan_path, report_path = sys.argv[1:]
logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                    stream=sys.stderr)
report = []
for run in json.load(open(plan_path)):
    out, log = io.StringIO(), io.StringIO()
    capture = logging.StreamHandler(log)
    capture.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    logging.getLogger().addHandler(capture)
    sys.argv, sys.stdin, error = [run["module"], *run["args"]], io.StringIO(run["stdin"]), None
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(run["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        error = None if exit.code in (0, None) else f"SystemExit({exit.code!r})"
    except BaseException:
        error = traceback.format_exc()
    finally:
        logging.getLogger().removeHandler(capture)
    report.append({"stdout": out.getvalue(), "log": log.getvalue(), "error": error})
json.dump(report, open(report_path, "w"))
"""


def run_in_one_interpreter(runs: List[CliRun], work_dir: str, timeout: int = 600) -> List[CliRun]:
    """All ``runs`` through :data:`CLI_DRIVER` in one ``python`` subprocess."""
    plan, report = os.path.join(work_dir, "plan.json"), os.path.join(work_dir, "report.json")
    with open(plan, "w") as handle:
        json.dump([{"module": r.module, "args": list(map(str, r.args)), "stdin": r.stdin} for r in runs], handle)
    result = subprocess.run([sys.executable, "-c", CLI_DRIVER, plan, report], capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if result.returncode != 0 or not os.path.exists(report):
        for run in runs:
            run.error = f"CLI driver crashed (exit {result.returncode}):\n{result.stderr[-5000:]}"
        return runs
    with open(report) as handle:
        for run, outcome in zip(runs, json.load(handle)):
            run.stdout, run.log, run.error = outcome["stdout"], outcome["log"], outcome["error"]
    return runs


def hypothesis_ids(output: str) -> List[int]:
    """Sentence ids of the ``H-<id>\\t<score>\\t<text>`` lines fairseq-generate/-interactive print."""
    return [int(line.split("\t", 1)[0][2:]) for line in output.splitlines() if line.startswith("H-")]

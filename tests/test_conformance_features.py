"""Conformance suite, part 2: fairseq's generation and training features on one configuration per
registered model family (``FAMILIES``: every model in ``conformance_utils.TINY_OVERRIDES``, so a
new family is covered as soon as it has its tiny overrides), as fairseq's own
``tests/test_binaries.py`` exercises them on its models:

fairseq-generate with sampling (top-k), diverse beam search, diverse siblings, ``--prefix-size``,
``--match-source-len``, ``--nbest``, ``--print-alignment``, ``--score-reference``, ``--lenpen`` /
``--unkpen`` and ``--retain-dropout``; fairseq-validate; fairseq-interactive, plain and with
lexically constrained decoding; the hub API (``from_pretrained`` -> ``translate`` / ``sample`` /
``generate``); and resuming training from ``checkpoint_last.pt``. Every command that translates or
scores runs with ``--required-batch-size-multiple 1`` (fairseq's default 8 drops the last partial
batch, fairseq #5036, which the plugin leaves as fairseq has it), and checks that every sentence is
translated or scored. Activation checkpointing and alignments
of every configuration are checked in process by ``test_conformance.py``.

Each family trains one tiny checkpoint, once per session; all its commands then run in ONE
interpreter (``conformance_utils.run_in_one_interpreter``), each exactly as ``python -m``.
"""

import math
import os
import re
from dataclasses import dataclass
from typing import Dict, List

import pytest
import torch

from conformance_utils import (
    FAMILIES,
    IN_PROCESS,
    CliRun,
    Variant,
    data_bin_fixture,
    flags_of,
    hypothesis_ids,
    run_in_one_interpreter,
)
from fairseq.models import ARCH_MODEL_REGISTRY
from fusion_fairseq.cli import user_dir

pytestmark = pytest.mark.slow  # fairseq command-line runs and trained checkpoints: CI runs them

TEST_SENTENCES, VALID_SENTENCES = 12, 30  # conftest.write_reversal_corpus


#: every sentence in the batches (see the module's docstring)
ALL_SENTENCES = ("--required-batch-size-multiple", "1")
# fairseq-generate flags per feature (beam 3 unless the feature needs otherwise)
GENERATE_FEATURES = {
    "beam": ("--beam", "3"),
    "sampling-topk": ("--sampling", "--sampling-topk", "3", "--beam", "2", "--nbest", "2", "--seed", "1"),
    # all 12 sentences in one batch (ALL_SENTENCES gives it): fairseq's DiverseBeamSearch indexes its
    # per-batch state by the sentences' dataset ids, which overrun it in a batch whose ids are not
    # 0..size-1 (a fairseq bug, with or without the plugin)
    "diverse-beam": ("--diverse-beam-groups", "2", "--diverse-beam-strength", "0.5", "--beam", "4"),
    "diverse-siblings": ("--diversity-rate", "0.5", "--beam", "6"),
    "prefix-size": ("--prefix-size", "2", "--beam", "3"),
    "match-source-len": ("--match-source-len", "--beam", "3"),
    "nbest+print-alignment": ("--nbest", "3", "--print-alignment", "--beam", "3"),
    "score-reference": ("--score-reference",),
    "lenpen+unkpen+retain-dropout": ("--lenpen", "0.5", "--unkpen", "5", "--retain-dropout", "--beam", "3"),
}
NBEST = {"nbest+print-alignment": 3, "sampling-topk": 2}
SHORT_OUTPUT = ("--max-len-b", "12")  # an untrained model rarely ends early: fairseq's default is 200 tokens
INTERACTIVE_INPUT = "w1 w2 w3\nw4 w5 w6 w7\n"
CONSTRAINED_INPUT = "w1 w2 w3\tW9 W8\nw4 w5 w6 w7\tW0\n"  # source TAB constraints (target words)


@dataclass
class FamilyRuns:
    """What one family's commands printed, by name, and where its files are."""

    variant: Variant
    data_bin: str
    save_dir: str
    runs: Dict[str, CliRun]

    def run(self, name: str) -> CliRun:
        run = self.runs[name]
        assert run.error is None, f"{run.module} {' '.join(run.args)} failed:\n{run.error}\n{run.log[-3000:]}"
        return run


def family_plan(variant: Variant, data_bin: str, save_dir: str) -> List[CliRun]:
    """train (5 updates) -> every generate feature -> validate -> interactive (plain, constrained)
    -> train again to 8 updates, resuming from checkpoint_last.pt."""
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")

    def train(updates: int) -> List[str]:
        return [data_bin, "--user-dir", user_dir(), "--arch", variant.arch, *flags_of(variant),
                "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", str(updates),
                "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints", *IN_PROCESS]

    plan = [CliRun("train", "fairseq_cli.train", train(5))]
    plan += [CliRun(f"generate:{name}", "fairseq_cli.generate",
                    [data_bin, "--user-dir", user_dir(), "--path", checkpoint, *SHORT_OUTPUT, *IN_PROCESS, *ALL_SENTENCES,
                     *flags])
             for name, flags in GENERATE_FEATURES.items()]
    plan.append(CliRun("validate", "fairseq_cli.validate", [
        data_bin, "--user-dir", user_dir(), "--task", "translation", "--path", checkpoint, "--valid-subset", "valid",
        "--batch-size", "16", *IN_PROCESS, *ALL_SENTENCES,
    ]))
    interactive = [data_bin, "--user-dir", user_dir(), "--path", checkpoint, *SHORT_OUTPUT, *IN_PROCESS, *ALL_SENTENCES,
                   "--beam", "3",
                   "--source-lang", "src", "--target-lang", "tgt"]
    plan.append(CliRun("interactive", "fairseq_cli.interactive", interactive, stdin=INTERACTIVE_INPUT))
    plan.append(CliRun("interactive:constraints", "fairseq_cli.interactive", [*interactive, "--constraints"],
                       stdin=CONSTRAINED_INPUT))
    plan.append(CliRun("resume", "fairseq_cli.train", train(8)))
    return plan


@pytest.fixture(scope="session")
def family_runs(request, tmp_path_factory):
    """``{model name: FamilyRuns}``, each family's plan run once per session."""
    cache = {}

    def get(variant: Variant) -> FamilyRuns:
        if variant.id not in cache:
            data_bin = request.getfixturevalue(data_bin_fixture(variant))
            save_dir = str(tmp_path_factory.mktemp(f"features-{variant.id}"))
            plan = family_plan(variant, data_bin, save_dir)
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("OMP_NUM_THREADS", "1")
                run_in_one_interpreter(plan, save_dir, timeout=600)
            cache[variant.id] = FamilyRuns(variant, data_bin, save_dir, {run.name: run for run in plan})
        return cache[variant.id]

    return get


# --------------------------------------------------------------------------- reading fairseq's output


def lines_by_id(output: str, prefix: str) -> Dict[int, List[List[str]]]:
    """``{sentence id: [fields after the id, per line]}`` of the ``<prefix>-<id>\\t...`` lines."""
    found: Dict[int, List[List[str]]] = {}
    for line in output.splitlines():
        if line.startswith(prefix + "-") and line[len(prefix) + 1:].split("\t", 1)[0].isdigit():
            head, *fields = line.split("\t")
            found.setdefault(int(head[len(prefix) + 1:]), []).append(fields)
    return found


def hypotheses(output: str) -> Dict[int, List[List[str]]]:
    """``{id: [hypothesis tokens, best first]}``."""
    return {i: [fields[1].split() for fields in rows] for i, rows in lines_by_id(output, "H").items()}


def single(output: str, prefix: str) -> Dict[int, List[str]]:
    return {i: rows[0][-1].split() for i, rows in lines_by_id(output, prefix).items()}


def assert_every_sentence(output: str, nbest: int = 1):
    found = hypotheses(output)
    assert sorted(found) == list(range(TEST_SENTENCES)), f"hypotheses for {sorted(found)}\n{output[-2000:]}"
    assert all(len(rows) == nbest for rows in found.values()), {i: len(rows) for i, rows in found.items()}
    assert re.search(r"Generate test with beam=\d+: BLEU4 = \d", output), output[-2000:]


# --------------------------------------------------------------------------- the tests

family_ids = pytest.mark.parametrize("family", FAMILIES, ids=lambda v: v.id)


@family_ids
@pytest.mark.parametrize("feature", sorted(GENERATE_FEATURES))
def test_generate_feature_translates_every_sentence(family, feature, family_runs):
    """A hypothesis (--nbest of them) for every test sentence, and a BLEU line."""
    assert_every_sentence(family_runs(family).run(f"generate:{feature}").stdout, nbest=NBEST.get(feature, 1))


@family_ids
def test_generate_prefix_and_source_length(family, family_runs):
    """--prefix-size 2: every hypothesis starts with its reference's first two tokens;
    --match-source-len: every hypothesis is as long as its source in tokens (fairseq counts the
    source's EOS: one word more than the source)."""
    runs = family_runs(family)
    prefixed = runs.run("generate:prefix-size").stdout
    targets = single(prefixed, "T")
    for i, (best,) in hypotheses(prefixed).items():
        assert best[:2] == targets[i][:2], (i, best, targets[i])
    matched = runs.run("generate:match-source-len").stdout
    sources = single(matched, "S")
    for i, (best,) in hypotheses(matched).items():
        assert len(best) == len(sources[i]) + 1, (i, best, sources[i])


@family_ids
def test_generate_score_reference_scores_the_reference(family, family_runs):
    output = family_runs(family).run("generate:score-reference").stdout
    targets = single(output, "T")
    for i, (best,) in hypotheses(output).items():
        assert best == targets[i], (i, best, targets[i])
    scores = [float(rows[0][0]) for rows in lines_by_id(output, "H").values()]
    assert all(math.isfinite(score) and score < 0 for score in scores), scores


@family_ids
def test_generate_print_alignment(family, family_runs):
    """One ``A-`` line per hypothesis: a source-target pair for each hypothesis token (EOS
    excluded), the source index within the source's words."""
    output = family_runs(family).run("generate:nbest+print-alignment").stdout
    sources, found = single(output, "S"), hypotheses(output)
    alignments = lines_by_id(output, "A")
    assert sorted(alignments) == list(range(TEST_SENTENCES)), output[-2000:]
    for i, rows in alignments.items():
        assert len(rows) == len(found[i]) == 3
        for row, hypothesis in zip(rows, found[i]):
            pairs = [tuple(map(int, pair.split("-"))) for pair in row[0].split()]
            assert [t for _, t in pairs] == list(range(len(hypothesis))), (i, pairs, hypothesis)
            assert all(0 <= s < len(sources[i]) for s, _ in pairs), (i, pairs, sources[i])


@family_ids
def test_validate_scores_every_sentence(family, family_runs):
    """fairseq-validate with 16 sentences a batch over the 30 validation sentences (16 + 14:
    the last batch is not a multiple of 8): a finite loss over all 30."""
    log = family_runs(family).run("validate").log
    match = re.search(r"valid on 'valid' subset \| loss ([^ ]+) .*\| bsz ([^ ]+)", log)
    assert match, log[-2000:]
    assert math.isfinite(float(match.group(1)))
    assert float(match.group(2)) == VALID_SENTENCES, match.group(0)


@family_ids
def test_interactive_plain_and_constrained(family, family_runs):
    """fairseq-interactive translates each input line; with --constraints every hypothesis
    contains its constraints, in order."""
    runs = family_runs(family)
    assert sorted(hypothesis_ids(runs.run("interactive").stdout)) == [0, 1]
    output = runs.run("interactive:constraints").stdout
    found = hypotheses(output)
    assert sorted(found) == [0, 1], output[-2000:]
    for i, line in enumerate(CONSTRAINED_INPUT.splitlines()):
        constraints = line.split("\t")[1].split()
        tokens = found[i][0]
        positions = [tokens.index(word) for word in constraints]  # ValueError: a constraint is missing
        assert positions == sorted(positions), (tokens, constraints)


@family_ids
def test_resume_training_from_checkpoint_last(family, family_runs):
    """A second fairseq-train into the same --save-dir continues from checkpoint_last.pt (5
    updates) up to --max-update 8, with the optimizer state restored."""
    runs = family_runs(family)
    first, resumed = runs.run("train"), runs.run("resume")
    assert "| train | epoch" in first.log
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 5 updates\)", resumed.log), resumed.log[-3000:]
    checkpoint = torch.load(os.path.join(runs.save_dir, "checkpoint_last.pt"))
    assert checkpoint["optimizer_history"][-1]["num_updates"] == 8
    losses = [float(x) for x in re.findall(r"\| train \| epoch \d+ \| loss ([^ ]+)", resumed.log)]
    assert losses and all(math.isfinite(x) for x in losses), resumed.log[-2000:]


@family_ids
def test_hub_interface(family, family_runs):
    """``from_pretrained`` on the trained checkpoint (the plugin imported in this process), then
    ``translate``, ``sample`` (top-k) and ``generate`` on tokenised input, as fairseq's hub docs
    use them."""
    runs = family_runs(family)
    runs.run("train")
    model_class = ARCH_MODEL_REGISTRY[family.arch]
    hub = model_class.from_pretrained(runs.save_dir, checkpoint_file="checkpoint_last.pt",
                                      data_name_or_path=runs.data_bin, source_lang="src", target_lang="tgt")
    hub.eval()
    translation = hub.translate("w1 w2 w3", beam=3)
    assert isinstance(translation, str) and translation.split(), translation
    sampled = hub.sample(["w1 w2 w3", "w4 w5"], beam=1, sampling=True, sampling_topk=3)
    assert len(sampled) == 2 and all(isinstance(text, str) for text in sampled)
    tokens = hub.encode("w4 w5 w6")
    (beam,) = hub.generate([tokens], beam=3)  # every hypothesis of the beam, best first
    assert len(beam) == 3 and all(hypothesis["tokens"][-1] == hub.tgt_dict.eos() for hypothesis in beam)
    scores = [float(hypothesis["score"]) for hypothesis in beam]
    assert scores == sorted(scores, reverse=True), scores

"""examples/gpu/run.sh: the commands prepared for a GPU machine run, at toy size on the CPU
(``SMOKE=1``: the same flags, later ones shrinking the models and moving them to the CPU), so that
GPU time is not spent finding a wrong flag. The half-precision step runs pytest on
``tests/test_gpu_training.py`` and ``tests/test_half_precision.py``; here, without CUDA, its tests skip."""

import json
import os
import subprocess
import sys
import tarfile
from xml.etree import ElementTree

import pytest
import torch

from conformance_utils import ARCHITECTURES
from conftest import REPO_ROOT, write_multi30k_slice
from test_gpu_training import LAYER_FUSION_OPTIONS

RUNBOOK = os.path.join(REPO_ROOT, "examples", "gpu", "run.sh")


def runbook(step, *args, smoke=True, env=None):
    environment = {**os.environ, "PYTHON": sys.executable, "SMOKE": "1" if smoke else "0", **(env or {})}
    return subprocess.run(["bash", RUNBOOK, step, *map(str, args)], cwd=REPO_ROOT, env=environment,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    write_multi30k_slice(root / "raw")
    result = runbook("prepare", root / "kit", env={"MULTI30K_RAW": str(root / "raw")})
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "kit"


@pytest.mark.slow
def test_prepare_makes_the_data_the_comparison_reads(kit):
    assert (kit / "multi30k" / "data-bin" / "recipe.env").is_file()
    assert (kit / "multi30k" / "code").is_file()  # the BPE codes the test sets are segmented with
    assert sorted(os.listdir(kit / "multi30k" / "test-raw")) == sorted(
        f"{name}.{lang}" for name in ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
        for lang in ("de", "en"))


@pytest.mark.slow
def test_prepare_again_keeps_the_kit_and_never_touches_a_folder_it_did_not_make(kit, tmp_path):
    dictionary = kit / "multi30k" / "data-bin" / "dict.en.txt"
    before = dictionary.stat().st_mtime_ns
    again = runbook("prepare", kit, env={"MULTI30K_RAW": str(kit.parent / "raw")})
    assert again.returncode == 0 and dictionary.stat().st_mtime_ns == before, again.stderr[-2000:]

    foreign = tmp_path / "kit" / "multi30k"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    refused = runbook("prepare", tmp_path / "kit", env={"MULTI30K_RAW": str(kit.parent / "raw")})
    assert refused.returncode == 2 and "exists without prepared data" in refused.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_the_speed_commands_run_every_configuration(tmp_path):
    result = runbook("speed", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {config for name in ("speed.json", "speed-densenmt.json")
            for config in json.load(open(tmp_path / "out" / name))["configs"]}
    assert {"Dense", "Linear", "Iterative", "Hierarchical", "MLA-k2", "MLRF Dec-SA", "SurfaceFusion-hard",
            "Fine-LA", "BASE-4L", "DenseNMT-4L-2"} <= rows, rows


@pytest.mark.slow
def test_the_comparison_command_trains_and_scores(kit, tmp_path):
    """The runs train in WORK; OUT holds the report and the runs' small results packed in one archive."""
    out, work = tmp_path / "out", tmp_path / "work"
    result = runbook("compare", out, kit, env={"WORK": str(work)})
    assert result.returncode == 0, result.stderr[-3000:]
    methods = json.load(open(out / "results.json"))["methods"]
    runs = {(m["method"], run["seed"]): run["status"] for m in methods for run in m["runs"]}
    assert runs == {("transformer", 1): "done", ("transformer", 2): "done"}  # --deep: a third seed for the Transformer
    scored = {"test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr", "all"}
    assert all(set(m["test"]) == scored for m in methods), [m["test"].keys() for m in methods]
    assert sorted(os.listdir(out)) == [".written_by", "compare.log", "compare.tar.gz", "learning_curves.png",
                                       "results.json", "results.md"]  # .written_by: OUT is run.sh's own
    with tarfile.open(out / "compare.tar.gz") as packed:
        members = packed.getnames()
    assert {"results.md", "runs/transformer/seed2/done.json", "runs/transformer/seed2/run.log",
            "runs/transformer/seed1/eval-beam5/average/test_2018_flickr/hyp.detok"} <= set(members), members
    assert not [name for name in members if name.endswith(".pt") or name.startswith("data")]
    assert list((work / "runs" / "transformer" / "seed1" / "checkpoints").glob("*.pt"))


def test_a_time_limited_comparison_stops_and_still_packs_what_exists(tmp_path):
    """Stopped within its imports (so no kit is needed), the runner leaves what an earlier call trained."""
    out, work = tmp_path / "out", tmp_path / "work"
    (work / "runs" / "transformer" / "seed1").mkdir(parents=True)
    (work / "runs" / "transformer" / "seed1" / "run.log").write_text("trained before\n")
    result = runbook("compare", out, tmp_path / "kit", env={"WORK": str(work), "TIME_LIMIT": "1"})
    assert result.returncode == 124 and "stopped after TIME_LIMIT=1 s; the same command resumes" in result.stderr
    with tarfile.open(out / "compare.tar.gz") as packed:
        assert packed.getnames() == ["runs/transformer/seed1/run.log"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the step runs the tests themselves")
def test_the_half_precision_step_runs_the_gpu_tests_and_reports_them(tmp_path):
    """The step itself, with its pytest flags, without pytest-xdist (``WORKERS=1``): here, without
    CUDA, every selected test is collected and skips."""
    result = runbook("half", tmp_path, smoke=False, env={"WORKERS": "1"})
    assert result.returncode == 0, result.stdout[-3000:]
    cases = ElementTree.parse(tmp_path / "half.xml").getroot().iter("testcase")
    names = [(case.get("classname").rsplit(".", 1)[-1], case.get("name")) for case in cases]
    trainings = [name for module, name in names if module == "test_gpu_training"]
    assert len(trainings) == 3 * (len(ARCHITECTURES) + len(LAYER_FUSION_OPTIONS))
    assert all(name.endswith("-cuda]") for module, name in names if module == "test_half_precision")
    assert "skipped" in (tmp_path / "half.log").read_text()


def test_a_step_without_its_output_folder_is_refused():
    result = runbook("speed")
    assert result.returncode == 2 and "missing the output folder OUT" in result.stderr

"""examples/gpu/run.sh: the commands prepared for a GPU machine run, at toy size on the CPU
(``SMOKE=1``: the same flags, later ones shrinking the models and moving them to the CPU), so that
GPU time is not spent finding a wrong flag. The half-precision step runs pytest on
``tests/test_gpu_training.py`` and ``tests/test_half_precision.py``; here, without CUDA, its tests skip."""

import importlib.metadata
import json
import os
import subprocess
import sys
from xml.etree import ElementTree

import pytest
import torch

from fusion_lab.benchmark import median_interval

from conformance_utils import ARCHITECTURES
from conftest import REPO_ROOT
from test_gpu_training import LAYER_FUSION_OPTIONS

TODAYS_LAYER_FUSION = {"DenseFormer-1x1", "SHCx4", "DHCx4", "mHCx4", "MUDDFormer"}

RUNBOOK = os.path.join(REPO_ROOT, "examples", "gpu", "run.sh")


def runbook(step, *args, smoke=True, env=None):
    environment = {**os.environ, "PYTHON": sys.executable, "SMOKE": "1" if smoke else "0", **(env or {})}
    return subprocess.run(["bash", RUNBOOK, step, *map(str, args)], cwd=REPO_ROOT, env=environment,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("step, results", [
    ("speed", {"speed": {"transformer again", "Dense", "Linear", "Iterative", "Hierarchical", "MLA-k2", "MLRF Dec-SA",
                         "SurfaceFusion-hard", "Fine-LA", *TODAYS_LAYER_FUSION}}),
    ("speed-more", {"speed-large": {"transformer again", *TODAYS_LAYER_FUSION},
                    "speed-densenmt": {"fconv again", "BASE-4L", "DenseNMT-4L-2"}})])
def test_the_speed_commands_run_every_configuration_and_record_the_machine(step, results, tmp_path):
    result = runbook(step, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    for name, configs in results.items():
        found = json.load(open(tmp_path / "out" / f"{name}.json"))
        assert configs <= set(found["configs"]), found["configs"].keys()
        assert found["settings"]["repeats"] == 1  # SMOKE's, after the step's own 7
    assert "torch" in (tmp_path / "out" / "device.txt").read_text()
    assert "fairseq" in (tmp_path / "out" / "pip-freeze.txt").read_text()


def test_every_speed_measurement_takes_seven_rounds_and_a_noise_floor():
    """The flags the GPU runs with (without SMOKE): enough rounds for the median's 95% interval."""
    script = open(RUNBOOK).read()
    base_size = script[script.index("BASE_SIZE=("):script.index(")", script.index("BASE_SIZE=("))]
    assert "--repeats 7" in base_size and "--steps 25" in base_size and "--warmup 3" in base_size
    for name in ("SPEED", "SPEED_LARGE", "SPEED_DENSENMT"):
        assert f'{name}=("${{BASE_SIZE[@]}}"' in script
        flags = script[script.index(f"{name}=("):script.index(")\n", script.index(f"{name}=("))]
        assert '"${NOISE_FLOOR[@]}"' in flags or name == "SPEED_DENSENMT"
    assert '--variant "fconv again=fconv_iwslt_de_en:"' in script
    assert median_interval([1.0] * 7) is not None


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
    assert "torch" in (tmp_path / "device.txt").read_text() and "fairseq" in (tmp_path / "pip-freeze.txt").read_text()


def test_a_step_without_its_output_folder_is_refused():
    result = runbook("speed")
    assert result.returncode == 2 and "missing the output folder OUT" in result.stderr


def test_an_unknown_step_prints_the_steps():
    result = runbook("compare", "out")
    assert result.returncode == 2 and "run.sh speed OUT" in result.stderr and "compare" not in result.stderr


def test_the_kit_brings_the_test_extra_that_install_installs(tmp_path):
    """``install`` installs ``.[test]`` offline, so ``prepare`` downloads pyproject's test extra into the kit
    (the wheelhouse holds what the plugin needs to run): recorded here by a stand-in Python."""
    kit, calls = tmp_path / "kit", tmp_path / "calls.txt"
    (kit / "wheels").mkdir(parents=True)  # an existing wheelhouse is kept; only the extra is fetched
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> {calls}\n')
    stand_in.chmod(0o755)
    result = runbook("prepare", kit, smoke=False, env={"PYTHON": str(stand_in)})
    assert result.returncode == 0, result.stderr
    extra = [requirement.split(";")[0].strip() for requirement in importlib.metadata.requires("fusion-fairseq")
             if 'extra == "test"' in requirement]
    download = calls.read_text().strip()
    assert download.startswith("-m pip download") and f"--dest {kit / 'wheels'}" in download
    assert download.split()[-len(extra):] == extra

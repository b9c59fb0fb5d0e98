"""Packaging: the dependencies admit the torch versions the plugin is tested with, setup.py defers to
pyproject.toml, and the offline wheelhouse (scripts/wheelhouse.sh) installs with ``--no-index``."""

import ast
import importlib.metadata
import os
import subprocess
import sys
import tomllib
import venv
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import REPO_ROOT, TINY_MLRF_FLAGS

sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
import wheelhouse_needs  # noqa: E402

# The CPU wheel of this project's CI and the torch of a CUDA image it is used on, with and
# without the local version label the PyTorch wheels carry.
TESTED_TORCH_VERSIONS = ("2.11.0", "2.11.0+cu128", "2.13.0", "2.13.0+cpu")
WHEELHOUSE = os.path.join(REPO_ROOT, "scripts", "wheelhouse.sh")


def project_metadata():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)["project"]


def project_requirements():
    return [Requirement(line) for line in project_metadata()["dependencies"]]


def torch_requirements(requirements, python_version):
    """The requirements on torch among ``requirements`` that apply on ``python_version``."""
    environment = wheelhouse_needs.target_environment(python_version)
    return [r for r in requirements if r.name == "torch" and wheelhouse_needs.applies(r, environment, "")]


@pytest.mark.parametrize("python_version", ["3.11", "3.12"])
@pytest.mark.parametrize("torch_version", TESTED_TORCH_VERSIONS)
def test_plugin_requirements_admit_the_tested_torch(python_version, torch_version):
    requirements = torch_requirements(project_requirements(), python_version)
    assert requirements, "torch must stay a declared dependency"
    for requirement in requirements:
        assert requirement.specifier.contains(torch_version), f"{requirement} refuses torch {torch_version}"


@pytest.mark.parametrize("torch_version", TESTED_TORCH_VERSIONS)
def test_fairseq_requirements_admit_the_tested_torch(torch_version):
    fairseq = next(r for r in project_requirements() if r.name == "ve-fairseq")
    installed = [Requirement(line) for line in importlib.metadata.requires(fairseq.name)]
    for requirement in torch_requirements(installed, "3.11"):
        assert requirement.specifier.contains(torch_version), f"{fairseq.name}: {requirement} refuses torch {torch_version}"


def test_python_versions_are_those_fairseq_has_wheels_for():
    supported = SpecifierSet(project_metadata()["requires-python"])
    assert [v for v in ("3.11", "3.12", "3.13") if supported.contains(v)] == ["3.11", "3.12"]


def test_setup_py_defers_to_pyproject():
    with open(os.path.join(REPO_ROOT, "setup.py")) as handle:
        tree = ast.parse(handle.read())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"]
    assert len(calls) == 1 and not calls[0].args and not calls[0].keywords, "setup() must take everything from pyproject.toml"


def test_setup_py_reads_name_and_version_from_pyproject():
    result = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["fusion-fairseq", "0.1.0"]


@pytest.mark.slow
def test_importing_the_plugin_leaves_torchaudio_out():
    """ve-fairseq installs a torchaudio that may not match torch; the plugin must not need it."""
    check = "import sys, fusion_fairseq; print('torchaudio' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --- the dependency closure of a wheelhouse ---------------------------------------------------

def report_item(name, version, requires=(), requested=False):
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}, "requested": requested}


FAKE_REPORT = {"install": [
    report_item("fusion-fairseq", "0.1.0", ["torch>=2.4", "ve-fairseq==0.12.3", "sacrebleu>=2.0"], requested=True),
    report_item("ve-fairseq", "0.12.3", ["torch>=1.13", "numpy>=1.21", "tomli; python_version < '3.12'",
                                         "black; extra == 'dev'"]),
    report_item("torch", "2.13.0", ["sympy>=1.13", "numpy", "nvidia-cublas; platform_system == 'Linux'"]),
    report_item("sacrebleu", "2.6.0", ["portalocker[windows]"]),
    report_item("portalocker", "4.4.2", ["pywin32; extra == 'windows'"]),
    report_item("pywin32", "311"),
    report_item("numpy", "2.4.6"), report_item("sympy", "1.14"), report_item("nvidia-cublas", "13.0"),
    report_item("tomli", "2.3.0"), report_item("black", "25.1"),
]}


def test_wheelhouse_leaves_out_torch_and_what_only_torch_needs():
    needed = wheelhouse_needs.needed(FAKE_REPORT, "3.12", {"torch"})
    assert needed == ["numpy==2.4.6", "portalocker==4.4.2", "pywin32==311", "sacrebleu==2.6.0", "ve-fairseq==0.12.3"]


def test_wheelhouse_exclusions_may_have_spaces_after_the_commas(tmp_path, capsys):
    """--exclude "torch, numpy" left numpy in: ' numpy' is no package name."""
    import json

    report = tmp_path / "report.json"
    report.write_text(json.dumps(FAKE_REPORT))
    wheelhouse_needs.main([str(report), "--python", "3.12", "--exclude", "torch, numpy"])
    assert capsys.readouterr().out.split() == ["portalocker==4.4.2", "pywin32==311", "sacrebleu==2.6.0",
                                               "ve-fairseq==0.12.3"]


def test_wheelhouse_evaluates_markers_for_the_target_python():
    assert "tomli==2.3.0" in wheelhouse_needs.needed(FAKE_REPORT, "3.11", {"torch"})
    assert "tomli==2.3.0" not in wheelhouse_needs.needed(FAKE_REPORT, "3.12", {"torch"})


@pytest.mark.parametrize("args, message", [
    (["--python", "3.13"], "--python 3.13: ve-fairseq"),
    (["--python", "3.10"], "--python '3.10' is not supported (allowed: 3.11, 3.12)"),
    (["--glibc", "2.12"], "--glibc '2.12' is older than manylinux2014"),
    (["--frobnicate"], "unknown option --frobnicate"),
])
def test_wheelhouse_bad_input_is_one_line_naming_the_flag(tmp_path, args, message):
    result = subprocess.run(["bash", WHEELHOUSE, str(tmp_path / "wheels"), *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "wheels").exists()


def test_wheelhouse_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "mine.txt").write_text("kept")
    result = subprocess.run(["bash", WHEELHOUSE, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "exists and is not empty" in result.stderr
    assert os.listdir(tmp_path) == ["mine.txt"] and (tmp_path / "mine.txt").read_text() == "kept"


# --- both build paths, and the offline install (CI: they build wheels and reach the indexes) -----

in_ci = pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI=true only: builds wheels, needs the package indexes")


def wheel_contents(wheel_dir):
    (wheel,) = [name for name in os.listdir(wheel_dir) if name.endswith(".whl")]
    with zipfile.ZipFile(os.path.join(wheel_dir, wheel)) as archive:
        names = sorted(n for n in archive.namelist() if not n.endswith("RECORD"))
        return wheel, names, {n: archive.read(n) for n in names if n.endswith(("METADATA", "entry_points.txt"))}


@in_ci
def test_setup_py_and_pip_build_the_same_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", tmp_path / "pip", REPO_ROOT],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "setup.py", "--quiet", "bdist_wheel", "--dist-dir", tmp_path / "setup_py",
                    "--bdist-dir", tmp_path / "build"], cwd=REPO_ROOT, check=True, capture_output=True)
    assert wheel_contents(tmp_path / "pip") == wheel_contents(tmp_path / "setup_py")


def run_in(venv_dir, *args, env=None):
    """Run the virtualenv's Python outside the checkout, so that it imports the installed plugin."""
    result = subprocess.run([os.path.join(venv_dir, "bin", "python"), *map(str, args)], capture_output=True, text=True,
                            env=env, timeout=900, cwd=venv_dir)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def offline_pip_environment():
    """Only the wheelhouse: no index, no find-links or configuration file of this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}


@in_ci
def test_offline_install_from_a_wheelhouse_beside_an_existing_torch(tmp_path, tiny_data_bin):
    import torch

    wheels = tmp_path / "wheels"
    subprocess.run(["bash", WHEELHOUSE, wheels, "--python", "%d.%d" % sys.version_info[:2]], check=True, capture_output=True)
    assert not [name for name in os.listdir(wheels) if name.startswith(("torch-", "nvidia", "triton"))]
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    torch_version = torch.__version__.split("+")[0]
    run_in(environment, "-m", "pip", "install", "--quiet", f"torch=={torch_version}")  # the target's own torch
    run_in(environment, "-m", "pip", "install", "--quiet", "--find-links", wheels, "fusion-fairseq", env=offline_pip_environment())
    assert run_in(environment, "-c", "import torch; print(torch.__version__)").strip() == torch.__version__
    smoke = "import sys; from fairseq_cli.train import cli_main; cli_main()\n"
    user_dir = run_in(environment, "-c", "from fusion_fairseq.cli import user_dir; print(user_dir())").strip()
    assert user_dir.startswith(str(environment))
    run_in(environment, "-c", smoke + "assert 'torchaudio' not in sys.modules, 'torchaudio was imported'",
           tiny_data_bin, "--user-dir", user_dir, "--arch", "mlrf_iwslt_de_en", *TINY_MLRF_FLAGS,
           "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "2",
           "--save-dir", tmp_path / "checkpoints", "--no-progress-bar", "--no-save")

"""The plugin can be loaded with --user-dir from anywhere, and loading it twice is harmless."""

import os
import shutil
import subprocess
import sys
from argparse import Namespace

import pytest
from fairseq import utils
from fairseq.models import BaseFairseqModel

from fusion_fairseq.cli import user_dir
from fusion_fairseq.registry import register_model as register_model_once
from fusion_fairseq.registry import register_model_architecture as register_architecture_once


def run_python(code, cwd):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_user_dir_command_prints_the_package_directory(tmp_path):
    result = subprocess.run(["fusion-fairseq-user-dir"], cwd=tmp_path, capture_output=True, text=True, check=True)
    path = result.stdout.strip()
    assert path == user_dir()
    assert os.path.isfile(os.path.join(path, "__init__.py"))


def test_import_user_module_twice_after_import():
    import fusion_fairseq  # noqa: F401

    utils.import_user_module(Namespace(user_dir=user_dir()))
    utils.import_user_module(Namespace(user_dir=user_dir()))


def test_the_same_files_under_a_second_module_name_do_not_clash(tmp_path):
    """E.g. an installed copy imported as ``fusion_fairseq`` and a checkout passed to --user-dir."""
    copy = tmp_path / "fusion_fairseq_checkout"
    shutil.copytree(user_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import fusion_fairseq\n"
        "from argparse import Namespace\n"
        "from fairseq import utils\n"
        f"utils.import_user_module(Namespace(user_dir={str(copy)!r}))\n"
        "import sys; assert 'fusion_fairseq_checkout.models.fusion_transformer' in sys.modules\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "print(ARCH_MODEL_REGISTRY['mlrf_iwslt_de_en'].__module__)\n"
    )
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("fusion_fairseq.models.fusion_transformer")


def test_a_genuine_name_clash_still_raises():
    class SomebodyElsesModel(BaseFairseqModel):
        pass

    with pytest.raises(ValueError, match="Cannot register duplicate model"):
        register_model_once("fusion_transformer")(SomebodyElsesModel)
    with pytest.raises(ValueError, match="Cannot register duplicate model architecture"):
        register_architecture_once("fusion_transformer", "mlrf_iwslt_de_en")(lambda args: None)

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


@pytest.mark.slow
def test_user_dir_command_prints_the_package_directory(tmp_path):
    result = subprocess.run(["fusion-fairseq-user-dir"], cwd=tmp_path, capture_output=True, text=True, check=True)
    path = result.stdout.strip()
    assert path == user_dir()
    assert os.path.isfile(os.path.join(path, "__init__.py"))


def test_import_user_module_twice_after_import():
    import fusion_fairseq  # noqa: F401

    from fairseq.models import ARCH_MODEL_REGISTRY

    registered = ARCH_MODEL_REGISTRY["fusion_transformer"]
    utils.import_user_module(Namespace(user_dir=user_dir()))
    utils.import_user_module(Namespace(user_dir=user_dir()))
    assert ARCH_MODEL_REGISTRY["fusion_transformer"] is registered  # no second registration replaced it


@pytest.mark.slow
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


def _run_python(code):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow
def test_only_configuration_errors_print_as_one_line():
    """A ConfigurationError that ends a program prints as "PROG: error: MESSAGE"; any other
    exception, a ValueError raised in the plugin's own code included (a bug), keeps its traceback."""
    refused = _run_python("import fusion_fairseq\nfrom fusion_fairseq.errors import ConfigurationError\n"
                          "raise ConfigurationError('--fusion-hops must be a positive integer, got 0')")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == "-c: error: --fusion-hops must be a positive integer, got 0"
    assert "Traceback" not in refused.stderr
    bug = _run_python("import fusion_fairseq\nfrom fusion_fairseq.modules.layer_aggregation import build_layer_aggregation\n"
                      "build_layer_aggregation('bogus', 2, 8, 16)")
    assert bug.returncode == 1 and "Traceback (most recent call last)" in bug.stderr
    assert "ValueError: unknown aggregation 'bogus'" in bug.stderr


@pytest.mark.slow
def test_every_global_change_is_applied_once():
    """fusion_fairseq.global_changes lists every change the plugin makes at import; after import each
    one is in place, and applying them again (the plugin imported under a second name) changes
    nothing. Each also has a test of its own, named in that module's table. In a fresh interpreter:
    other tests' torch.distributed wraps sys.excepthook in this one."""
    checked = _run_python(
        "import sys\n"
        "import fusion_fairseq\n"
        "from fairseq import checkpoint_utils\n"
        "from fairseq.data import data_utils\n"
        "from fairseq.distributed import utils as distributed_utils\n"
        "from fairseq import models\n"
        "from fairseq.dataclass import utils as dataclass_utils\n"
        "from fairseq.tasks import FairseqTask\n"
        "from fusion_fairseq import global_changes\n"
        "def installed():\n"
        "    return (sys.excepthook, data_utils.batch_by_size, distributed_utils.call_main,\n"
        "            checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.torch,\n"
        "            models.merge_with_parent, dataclass_utils.merge_with_parent, FairseqTask.get_batch_iterator)\n"
        "before = installed()\n"
        "marked = [(sys.excepthook, 'prints_configuration_errors_in_one_line'),\n"
        "          (data_utils.batch_by_size, '_keeps_last_partial_batch'),\n"
        "          (distributed_utils.call_main, '_trains_in_cpu_processes'),\n"
        "          (checkpoint_utils.load_checkpoint_to_cpu, 'checks_loaded_configurations'),\n"
        "          (distributed_utils.call_main, '_trains_bf16_without_tpu'),\n"
        "          (models.merge_with_parent, 'checks_model_configs'),\n"
        "          (dataclass_utils.merge_with_parent, 'checks_model_configs'),\n"
        "          (FairseqTask.get_batch_iterator, '_resumes_with_the_batches_of_an_unbroken_run')]\n"
        "print(len(global_changes.CHANGES), [bool(getattr(f, m, False)) for f, m in marked])\n"
        "global_changes.apply_all()\n"
        "print(installed() == before)\n")
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert checked.stdout.split("\n")[:2] == ["8 [True, True, True, True, True, True, True, True]", "True"]

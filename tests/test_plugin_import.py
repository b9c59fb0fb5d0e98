"""Loading the plugin registers it and changes nothing else in fairseq than docs/safety.md lists; it is
loaded once, as ``fusion_fairseq``, and a name it cannot take fails naming both definitions."""

import os
import shutil
import subprocess
import sys
from argparse import Namespace

import pytest
from fairseq import utils
from fairseq.models import BaseFairseqModel

from fusion_fairseq.cli import package_dir, user_dir
from fusion_fairseq.registry import register_model, register_model_architecture
from conftest import TINY_MLRF_FLAGS, run_cli


def run_python(code, cwd=None):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def plugin_modules_after(statement):
    """The plugin's modules a fresh interpreter holds after ``statement``."""
    result = run_python(f"{statement}\nimport sys\n"
                        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'fusion_fairseq'))")
    assert result.returncode == 0, result.stderr[-3000:]
    return eval(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_user_dir_command_prints_the_package_directory(tmp_path):
    result = subprocess.run(["fusion-fairseq-user-dir"], cwd=tmp_path, capture_output=True, text=True, check=True)
    path = result.stdout.strip()
    assert path == user_dir() == os.path.join(os.path.dirname(package_dir()), "fusion_fairseq_plugin")
    assert os.path.isfile(os.path.join(path, "__init__.py"))


def test_the_plugin_package_holds_the_plugin_only():
    """What --user-dir names is what it imports (models, modules, criterion, scheduler, optimizer and what they
    need); the laboratory (quickstart, corpus pipeline, benchmark, comparison) lives beside it, in fusion_lab."""
    import ast

    plugin = package_dir()
    for folder, _, files in os.walk(plugin):
        for name in files:
            if name.endswith(".py"):
                tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
                imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)] + [
                    alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
                assert not [module for module in imported if module.split(".")[0] == "fusion_lab"], name
    assert not os.path.exists(os.path.join(plugin, "tools"))  # the laboratory's old place inside the plugin


@pytest.mark.slow
@pytest.mark.parametrize("module,loaded", [
    ("checkpoint_safety", ["fusion_fairseq", "fusion_fairseq.checkpoint_safety", "fusion_fairseq.errors"]),
    ("cli", ["fusion_fairseq", "fusion_fairseq.cli"]),
])
def test_a_helper_imports_no_model(module, loaded):
    """A helper loads the package and what it needs itself: no model, no registration (41 modules before)."""
    assert plugin_modules_after(f"import fusion_fairseq.{module}") == loaded


@pytest.mark.slow
def test_importing_the_plugin_leaves_vanilla_fairseq_unchanged():
    """In a fresh interpreter: fairseq's batching (its last partial batch dropped, fairseq #5036) and the
    process's exception printing are the same objects, giving the same results, before and after the plugin
    registers; fairseq's hydra merge (checked first for the plugin's own configs, docs/safety.md) merges a
    config of fairseq's own Transformer as before."""
    result = run_python(
        "import sys, numpy as np\n"
        "from omegaconf import OmegaConf\n"
        "from fairseq.data import data_utils\n"
        "from fairseq.dataclass import utils as dataclass_utils\n"
        "from fairseq.models.transformer import TransformerConfig\n"
        "def state():\n"
        "    batches = data_utils.batch_by_size(np.arange(10), None, num_tokens_vec=np.ones(10, dtype=np.int64),\n"
        "                                       max_sentences=4, required_batch_size_multiple=4)\n"
        "    merged = dataclass_utils.merge_with_parent(TransformerConfig(), OmegaConf.create(\n"
        "        {'dropout': 0.3, 'encoder': {'layers': 3}}))\n"
        "    return ([len(batch) for batch in batches], sys.excepthook, data_utils.batch_by_size,\n"
        "            OmegaConf.to_yaml(merged))\n"
        "before = state()\n"
        "import fusion_fairseq.models\n"
        "after = state()\n"
        "print(before[0], after[0], before == after)\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[4, 4] [4, 4] True"


@pytest.mark.slow
def test_reading_a_checkpoint_with_the_helper_leaves_fairseqs_reader_as_it_is(tmp_path):
    """read_checkpoint_state (averaging, corpus evaluate) made fairseq's checkpoint reader the plugin's."""
    path = tmp_path / "checkpoint.pt"
    result = run_python(
        "import types, torch\nfrom fairseq import checkpoint_utils\n"
        "from fusion_fairseq.checkpoint_safety import read_checkpoint_state\n"
        f"torch.save({{'model': {{'w': torch.ones(2)}}, 'args': None, 'cfg': {{'model': {{'_name': 'transformer'}}}}}}, {str(path)!r})\n"
        f"print(read_checkpoint_state({str(path)!r})['model']['w'].tolist(), "
        "isinstance(checkpoint_utils.torch, types.ModuleType))\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[1.0, 1.0] True"


@pytest.mark.slow
def test_a_plain_transformer_checkpoint_loads_as_with_safe_loading_alone(tiny_data_bin, tmp_path):
    """A checkpoint fairseq-train wrote without the plugin: under torch >= 2.6 fairseq alone cannot read it
    (its configuration objects are not weights); with fairseq's checkpoint types allow-listed (the safe
    loading of docs/safety.md) it loads, and the plugin's registration loads the same model."""
    run_cli("fairseq_cli.train", tiny_data_bin, "--arch", "transformer", *TINY_MLRF_FLAGS[:16],
            "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "2",
            "--save-dir", tmp_path, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints")
    checkpoint = str(tmp_path / "checkpoint_last.pt")
    result = run_python(
        "import pickle, torch\n"
        "from fairseq import checkpoint_utils\n"
        f"path, data = {checkpoint!r}, {tiny_data_bin!r}\n"
        "def translation_scores():\n"
        "    (model,), _ = checkpoint_utils.load_model_ensemble([path], arg_overrides={'data': data})\n"
        "    tokens = torch.tensor([[4, 5, 6, 2]])\n"
        "    return model.eval()(tokens, torch.tensor([4]), tokens)[0]\n"
        "try:\n"
        "    translation_scores()\n"
        "except pickle.UnpicklingError:\n"
        "    print('fairseq alone: refused')\n"
        "from fusion_fairseq.checkpoint_safety import FAIRSEQ_CHECKPOINT_TYPES\n"
        "torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_TYPES))\n"
        "safe_loading_alone = translation_scores()\n"
        "import fusion_fairseq.models\n"
        "print(torch.equal(safe_loading_alone, translation_scores()))\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-2:] == ["fairseq alone: refused", "True"]


def test_import_user_module_after_import_registers_nothing_twice():
    import fusion_fairseq.models  # noqa: F401

    from fairseq.models import ARCH_MODEL_REGISTRY

    registered = ARCH_MODEL_REGISTRY["fusion_transformer"]
    utils.import_user_module(Namespace(user_dir=user_dir()))
    utils.import_user_module(Namespace(user_dir=user_dir()))
    assert ARCH_MODEL_REGISTRY["fusion_transformer"] is registered


@pytest.mark.slow
@pytest.mark.parametrize("first", ["import fusion_fairseq", "from fusion_fairseq.cli import user_dir",
                                   "import fusion_fairseq.checkpoint_safety"])
def test_the_user_dir_registers_after_a_part_of_the_plugin_was_imported(first):
    """fairseq skips a --user-dir whose module is imported: naming the package itself, a script that imported a
    helper first got "invalid choice: 'fusion_transformer'"."""
    result = run_python(f"{first}\nfrom fairseq import options\n"
                        "args = options.parse_args_and_arch(options.get_training_parser(), ['data', '--user-dir', "
                        f"{user_dir()!r}, '--arch', 'mlrf_iwslt_de_en'])\nprint(args.arch, args.fuse_encoder)\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "mlrf_iwslt_de_en fnn"


@pytest.mark.slow
def test_the_user_dir_of_another_checkout_is_refused_once_the_plugin_is_imported(tmp_path):
    checkout = tmp_path / "checkout"
    for package in (package_dir(), user_dir()):
        shutil.copytree(package, checkout / os.path.basename(package), ignore=shutil.ignore_patterns("__pycache__"))
    assert user_dir_error(checkout / "fusion_fairseq_plugin", tmp_path) == (
        f"ImportError: --user-dir {checkout / 'fusion_fairseq_plugin'} registers the plugin at "
        f"{checkout / 'fusion_fairseq'}, but this Python imported fusion_fairseq from {package_dir()}: pass the "
        "--user-dir that fusion-fairseq-user-dir prints, or install the copy you want (pip install -e its checkout)")


def user_dir_error(copy, tmp_path):
    """The last line of a fresh interpreter that imports the installed plugin, then fairseq's --user-dir ``copy``."""
    result = run_python("import fusion_fairseq.models\nfrom argparse import Namespace\nfrom fairseq import utils\n"
                        f"utils.import_user_module(Namespace(user_dir={str(copy)!r}))\n", cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_user_dir_with_another_copy_of_the_plugin_is_refused_naming_both(tmp_path):
    """A second checkout passed to --user-dir ran the installed copy's models without a word."""
    copy = tmp_path / "fusion_fairseq_checkout"
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert user_dir_error(copy, tmp_path) == (
        f"ImportError: --user-dir {copy} is another copy of the plugin than {package_dir()}, the one this Python "
        f"imports as fusion_fairseq: pass --user-dir {package_dir()}, or install the copy you want (pip install -e its "
        "checkout)")


@pytest.mark.slow
def test_a_user_dir_with_another_checkout_runs_that_checkout_alone_in_a_fresh_process(tmp_path):
    """What fairseq-train --user-dir CHECKOUT/fusion_fairseq does: every module of the plugin from the checkout."""
    copy = tmp_path / "checkout" / "fusion_fairseq"
    shutil.copytree(package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    result = run_python("import sys\nfrom argparse import Namespace\nfrom fairseq import utils\n"
                        f"utils.import_user_module(Namespace(user_dir={str(copy)!r}))\n"
                        "print(sorted({m.__file__.split('fusion_fairseq')[0] for name, m in sys.modules.items()\n"
                        "              if name.split('.')[0] == 'fusion_fairseq' and getattr(m, '__file__', None)}))\n"
                        "print('fusion_transformer' in __import__('fairseq.models').models.ARCH_MODEL_REGISTRY)\n",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-2:] == [repr([str(copy.parent) + os.sep]), "True"]


@pytest.mark.slow
def test_the_plugin_under_a_second_module_name_is_refused(tmp_path):
    """The same files under another folder name would register every model a second time."""
    link = tmp_path / "plugin"
    link.symlink_to(package_dir())
    assert user_dir_error(link, tmp_path) == (
        f"ImportError: --user-dir {link} loads the plugin as plugin: pass --user-dir {package_dir()}, its folder named "
        "fusion_fairseq (under two names it would register everything twice)")


def test_a_name_clash_names_both_definitions():
    class SomebodyElsesModel(BaseFairseqModel):
        pass

    def somebody_elses_architecture(args):
        pass

    with pytest.raises(ValueError) as error:
        register_model("fusion_transformer")(SomebodyElsesModel)
    message = str(error.value)
    assert message.startswith("Cannot register duplicate model (fusion_transformer): "
                              f"{__name__}.test_a_name_clash_names_both_definitions.<locals>.SomebodyElsesModel (")
    assert "would replace fusion_fairseq.models.fusion_transformer.FusionTransformerModel (" in message
    with pytest.raises(ValueError, match=r"Cannot register duplicate model architecture \(mlrf_iwslt_de_en\): .*"
                                         r"somebody_elses_architecture .* would replace fusion_fairseq\.models\."):
        register_model_architecture("fusion_transformer", "mlrf_iwslt_de_en")(somebody_elses_architecture)


@pytest.mark.slow
def test_every_change_to_fairseq_is_listed_and_applied_once():
    """fusion_fairseq.global_changes lists every change loading the plugin makes; after registration each one
    is in place, and applying them again changes nothing. Each also has a test of its own, named in the table
    of docs/safety.md."""
    checked = run_python(
        "import fusion_fairseq.models\n"
        "from fairseq import checkpoint_utils, hub_utils\n"
        "from fairseq.distributed import utils as distributed_utils\n"
        "from fairseq.models import distributed_fairseq_model\n"
        "from fairseq.tasks import FairseqTask\n"
        "from fairseq.dataclass import utils as dataclass_utils\n"
        "from fusion_fairseq import global_changes\n"
        "def installed():\n"
        "    return (checkpoint_utils.torch, checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.load_checkpoint,\n"
        "            checkpoint_utils.load_model_ensemble_and_task, hub_utils.from_pretrained,\n"
        "            distributed_utils.call_main, distributed_fairseq_model.DistributedDataParallel,\n"
        "            FairseqTask.get_batch_iterator, dataclass_utils.merge_with_parent)\n"
        "before = installed()\n"
        "marked = [(distributed_utils.call_main, '_trains_in_cpu_processes'),\n"
        "          (distributed_utils.call_main, '_trains_bf16_without_tpu'),\n"
        "          (checkpoint_utils.load_checkpoint_to_cpu, 'checks_loaded_configurations'),\n"
        "          (FairseqTask.get_batch_iterator, '_resumes_with_the_batches_of_an_unbroken_run'),\n"
        "          (dataclass_utils.merge_with_parent, 'checks_model_configs')]\n"
        "print(len(global_changes.CHANGES), [bool(getattr(f, m, False)) for f, m in marked])\n"
        "global_changes.apply_all()\n"
        "print(installed() == before)\n")
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert checked.stdout.split("\n")[:2] == ["6 [True, True, True, True, True]", "True"]

"""Shared fixtures: a tiny parallel corpus binarised by fairseq-preprocess, and helpers to run
fairseq's real command-line entry points with this plugin as ``--user-dir``."""

import importlib.util
import os
import random
import subprocess
import sys

import pytest

import fusion_fairseq.models  # noqa: F401  (registers the plugin, as --user-dir does)
from fusion_fairseq.cli import user_dir

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = user_dir()
SCRIPTS = os.path.join(REPO_ROOT, "scripts")


def pytest_configure(config):
    """Under pytest-xdist each worker, and every command it starts (through the environment), takes its share
    of the cores: torch takes them all by default, so two workers on two cores ran four threads spinning
    against each other. An OMP_NUM_THREADS the user set is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def load_script(name):
    """``scripts/NAME.py`` imported as a module, so that tests call its functions directly."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(module, capsys, *argv):
    """``module.main(argv)`` (arguments as strings): its exit code, stdout and stderr."""
    code = module.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def load_checkpoint(checkpoint, data_bin, **overrides):
    """(model in eval mode, task) of a checkpoint, through fairseq's own loader."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data_bin, **overrides})
    models[0].eval()
    return models[0], task


def token_ids(dictionary, text):
    """The ids of the words of ``text`` and EOS, as a sentence of a binarised split."""
    import torch

    return torch.tensor([dictionary.index(w) for w in text.split()] + [dictionary.eos()])


def write_reversal_corpus(directory, sizes=(("train", 300), ("valid", 30), ("test", 12)), seed=0):
    """A toy language pair: the target is the source reversed and upper-cased."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(30)]
    os.makedirs(directory, exist_ok=True)
    for split, count in sizes:
        with open(os.path.join(directory, f"{split}.src"), "w") as src, open(os.path.join(directory, f"{split}.tgt"), "w") as tgt:
            for _ in range(count):
                words = rng.choices(vocabulary, k=rng.randint(2, 9))
                src.write(" ".join(words) + "\n")
                tgt.write(" ".join(w.upper() for w in reversed(words)) + "\n")


MULTI30K_SLICE = {"train": 300, "val": 50, "test_2016_flickr": 50, "test_2017_flickr": 20, "test_2017_mscoco": 20,
                  "test_2018_flickr": 20}


def write_multi30k_slice(directory):
    """A synthetic corpus with the file names and sizes (:data:`MULTI30K_SLICE`) of Multi30k De-En: the
    same on every machine, with no data from outside the repository."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(0)
    words = {"de": "ein mann eine frau hund spielt im park auf der straße mit einem ball".split(),
             "en": "a man woman dog plays in the park on street with ball".split()}
    for split, count in MULTI30K_SLICE.items():
        for lang in ("de", "en"):
            with open(os.path.join(directory, f"{split}.{lang}"), "w", encoding="utf-8") as out:
                state = random.Random(f"{split}{count}")
                for _ in range(count):
                    out.write(" ".join(state.choice(words[lang]) for _ in range(rng.randint(3, 9))).capitalize() + ".\n")


def run_cli(module, *args, cwd=None, timeout=600, stdin=None):
    """Run a fairseq console entry point (``fairseq_cli.train`` ...) in a fresh interpreter, with ``stdin`` as
    its standard input (fairseq-interactive reads its source sentences there)."""
    result = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        input=stdin, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if result.returncode != 0:
        raise AssertionError(f"{module} {' '.join(map(str, args))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


def preprocess(raw_dir, dest_dir, joined=False):
    args = ["--source-lang", "src", "--target-lang", "tgt", "--workers", "1", "--destdir", dest_dir]
    for split in ("train", "valid", "test"):
        args += [f"--{split}pref", os.path.join(raw_dir, split)]
    if joined:
        args.append("--joined-dictionary")
    run_cli("fairseq_cli.preprocess", *args)
    return dest_dir


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("raw"))
    write_reversal_corpus(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_data_bin(tiny_raw, tmp_path_factory):
    """Binarised tiny corpus with separate source and target dictionaries."""
    return preprocess(tiny_raw, str(tmp_path_factory.mktemp("bin")))


@pytest.fixture(scope="session")
def tiny_joined_data_bin(tiny_raw, tmp_path_factory):
    """Binarised tiny corpus with one joined dictionary (for shared embeddings / shared stacks)."""
    return preprocess(tiny_raw, str(tmp_path_factory.mktemp("bin_joined")), joined=True)


TINY_MLRF_FLAGS = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--fusion-attn-dim", "12", "--fusion-ffn-dim", "20",
]


@pytest.fixture(scope="session")
def tiny_mlrf_checkpoint(tiny_data_bin, tmp_path_factory):
    """A Both-FNN-SA checkpoint (``mlrf_iwslt_de_en`` at tiny width) trained for a few updates."""
    save_dir = str(tmp_path_factory.mktemp("ckpt"))
    run_cli(
        "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "mlrf_iwslt_de_en", *TINY_MLRF_FLAGS,
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "30",
        "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
    )
    return os.path.join(save_dir, "checkpoint_last.pt")

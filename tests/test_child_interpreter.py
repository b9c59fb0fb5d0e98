"""Child processes use the interpreter their parent runs under, not the python3 first on PATH (a
virtualenv's python called by its path, without activating the environment)."""

import os
import stat
import sys
from types import SimpleNamespace

import pytest

from fusion_lab import comparison


@pytest.fixture
def path_without_this_interpreter(tmp_path, monkeypatch):
    """PATH without the running interpreter's directory, and first on it a python3 (and python)
    that cannot run anything."""
    decoy = tmp_path / "decoy-bin"
    decoy.mkdir()
    for name in ("python3", "python"):
        (decoy / name).write_text("#!/bin/sh\necho 'this is the python3 first on PATH' >&2\nexit 1\n")
        (decoy / name).chmod(stat.S_IRWXU)
    here = os.path.realpath(os.path.dirname(sys.executable))
    kept = [entry for entry in os.environ["PATH"].split(os.pathsep) if entry and os.path.realpath(entry) != here]
    monkeypatch.setenv("PATH", os.pathsep.join([str(decoy), *kept]))


def write_multi30k(directory, lines=40):
    """Multi30k's file names (train, val, test_2016_flickr; .de and .en) with a few toy sentences."""
    directory.mkdir()
    words = ["ein", "hund", "eine", "katze", "der", "mann", "läuft", "springt"]
    for split in ("train", "val", "test_2016_flickr"):
        for lang, shift in (("de", 0), ("en", 3)):
            sentences = [" ".join(words[(i + j + shift) % len(words)] for j in range(5)) + " ." for i in range(lines)]
            (directory / f"{split}.{lang}").write_text("\n".join(sentences) + "\n")


@pytest.mark.slow
def test_the_comparison_prepares_its_data_with_its_own_interpreter(path_without_this_interpreter, tmp_path):
    write_multi30k(tmp_path / "raw")
    args = SimpleNamespace(data_bin=None, out=str(tmp_path / "out"), report_only=False, raw=str(tmp_path / "raw"),
                           bpe_merges=20)
    data_bin = comparison.prepare_data(args)
    assert os.path.isfile(os.path.join(data_bin, "recipe.env"))
    with open(os.path.join(args.out, "logs", "prepare.log")) as log:
        assert "first on PATH" not in log.read()

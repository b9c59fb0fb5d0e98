"""scripts/average_checkpoints.py (fusion_fairseq/tools/averaging.py): parameter means of fairseq
checkpoints that fairseq then loads, and its refusals."""

import os

import pytest
import torch
from fairseq import checkpoint_utils

from fusion_fairseq.tools.averaging import average_checkpoints, last_checkpoints, main

pytestmark = pytest.mark.slow  # fairseq command-line runs and trained checkpoints: CI runs them


@pytest.fixture
def three_checkpoints(tiny_mlrf_checkpoint, tmp_path):
    """checkpoint1..3.pt: a trained checkpoint with its parameters shifted by 0, 1 and 2."""
    state = torch.load(tiny_mlrf_checkpoint, weights_only=True)
    paths = []
    for epoch in (1, 2, 3):
        shifted = dict(state, model={name: tensor + (epoch - 1) for name, tensor in state["model"].items()})
        path = str(tmp_path / f"checkpoint{epoch}.pt")
        torch.save(shifted, path)
        paths.append(path)
    return state, paths


def test_average_is_the_mean_and_fairseq_loads_it(three_checkpoints, tmp_path):
    state, paths = three_checkpoints
    out = average_checkpoints(paths, str(tmp_path / "averaged.pt"))
    averaged = torch.load(out, weights_only=True)
    for name, tensor in state["model"].items():
        assert torch.allclose(averaged["model"][name], tensor + 1, atol=1e-6), name  # (0 + 1 + 2) / 3
    assert averaged["last_optimizer_state"] is None
    models, _ = checkpoint_utils.load_model_ensemble([out])
    assert sum(p.numel() for p in models[0].parameters()) > 0


def test_dir_last_picks_the_newest(three_checkpoints, tmp_path):
    _, paths = three_checkpoints
    assert last_checkpoints(str(tmp_path), 2) == paths[1:]
    out = main(["--dir", str(tmp_path), "--last", "2", "--output", str(tmp_path / "avg.pt")])
    assert os.path.isfile(out)


def test_refusals_are_one_line_and_keep_files(three_checkpoints, tmp_path):
    _, paths = three_checkpoints
    before = open(paths[0], "rb").read()
    os.link(paths[0], tmp_path / "hardlink.pt")
    cases = [
        (["--inputs", *paths, "--output", str(tmp_path / "hardlink.pt"), "--force"], "is one of the checkpoints"),
        (["--inputs", *paths, "--output", paths[1]], "is one of the checkpoints"),
        (["--dir", str(tmp_path), "--last", "9", "--output", str(tmp_path / "x.pt")], "3 epoch checkpoint(s), --last asks for 9"),
        (["--inputs", str(tmp_path / "nope.pt"), "--output", str(tmp_path / "x.pt")], "no such file"),
    ]
    (tmp_path / "taken.pt").write_bytes(b"mine")
    cases.append((["--inputs", *paths, "--output", str(tmp_path / "taken.pt")], "exists; pass --force"))
    (tmp_path / "text.pt").write_text("not a checkpoint")
    cases.append((["--inputs", paths[0], str(tmp_path / "text.pt"), "--output", str(tmp_path / "y.pt")], "cannot average"))
    for argv, message in cases:
        with pytest.raises(SystemExit) as error:
            main(argv)
        assert message in str(error.value.code) and "\n" not in str(error.value.code), argv
    assert open(paths[0], "rb").read() == before and (tmp_path / "taken.pt").read_bytes() == b"mine"

"""scripts/average_checkpoints.py (fusion_lab/averaging.py): parameter means of fairseq
checkpoints that fairseq then loads, and its refusals."""

import os
from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils

from fusion_lab.averaging import average_checkpoints, last_checkpoints, main

slow = pytest.mark.slow  # trained checkpoints: CI runs them


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


@slow
def test_average_is_the_mean_and_fairseq_loads_it(three_checkpoints, tmp_path):
    state, paths = three_checkpoints
    out = average_checkpoints(paths, str(tmp_path / "averaged.pt"))
    averaged = torch.load(out, weights_only=True)
    for name, tensor in state["model"].items():
        assert torch.allclose(averaged["model"][name], tensor + 1, atol=1e-6), name  # (0 + 1 + 2) / 3
    assert averaged["last_optimizer_state"] is None
    models, _ = checkpoint_utils.load_model_ensemble([out])
    assert sum(p.numel() for p in models[0].parameters()) > 0


@slow
def test_dir_last_picks_the_newest(three_checkpoints, tmp_path):
    _, paths = three_checkpoints
    assert last_checkpoints(str(tmp_path), 2) == paths[1:]
    out = main(["--dir", str(tmp_path), "--last", "2", "--output", str(tmp_path / "avg.pt")])
    assert os.path.isfile(out)


def test_the_newest_epoch_or_interval_checkpoints_are_picked_by_number_oldest_first(tmp_path):
    for name in ("checkpoint_1_100.pt", "checkpoint_2_300.pt", "checkpoint_1_200.pt", "checkpoint9.pt",
                 "checkpoint10.pt", "checkpoint_last.pt", "checkpoint_best.pt"):
        (tmp_path / name).touch()
    assert last_checkpoints(str(tmp_path), 2, by_update=True) == [str(tmp_path / "checkpoint_1_200.pt"),
                                                                  str(tmp_path / "checkpoint_2_300.pt")]
    assert last_checkpoints(str(tmp_path), 5) == [str(tmp_path / "checkpoint9.pt"), str(tmp_path / "checkpoint10.pt")]


@slow
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


@pytest.mark.parametrize("flags, named", [(["--last", "3"], "--last"), (["--by-update"], "--by-update")])
def test_dir_only_flags_are_refused_with_inputs(tmp_path, flags, named):
    """--inputs a.pt b.pt --last 3 averaged both, the flag ignored."""
    paths = [small_checkpoint(tmp_path / f"checkpoint{k}.pt", w=[float(k)]) for k in (1, 2)]
    with pytest.raises(SystemExit) as error:
        main(["--inputs", *paths, *flags, "--output", str(tmp_path / "avg.pt")])
    assert str(error.value.code) == (f"average_checkpoints.py: error: {named} picks the checkpoints of --dir; with "
                                     "--inputs the checkpoints are the ones named")
    assert not (tmp_path / "avg.pt").exists()


def small_checkpoint(path, **tensors):
    """A checkpoint fairseq's loaders read: its weights and the model configuration they belong to."""
    torch.save({"cfg": {"model": Namespace(arch="transformer")},
                "model": {name: torch.tensor(value) for name, value in tensors.items()}}, path)
    return str(path)


@pytest.mark.parametrize("name", ["averaged.pt", "checkpoint2.pt"])
def test_an_input_named_like_the_old_temporary_file_is_kept(tmp_path, name):
    """The average was written to OUTPUT.tmp first: an input of that name was replaced, then removed."""
    first = small_checkpoint(tmp_path / "checkpoint1.pt", w=[1.0])
    kept = small_checkpoint(tmp_path / f"{name}.tmp", w=[3.0])
    out = main(["--inputs", first, kept, "--output", str(tmp_path / name)])
    assert torch.load(out, weights_only=True)["model"]["w"].tolist() == [2.0]
    assert torch.load(kept, weights_only=True)["model"]["w"].tolist() == [3.0]
    assert sorted(os.listdir(tmp_path)) == sorted(["checkpoint1.pt", f"{name}.tmp", name])


@pytest.mark.parametrize("link", ["res.pt.tmp", "res.pt"])
def test_a_link_is_never_written_through(tmp_path, link):
    users = tmp_path / "users_file"
    users.write_bytes(b"mine")
    (tmp_path / link).symlink_to(users)
    inputs = [small_checkpoint(tmp_path / f"c{i}.pt", w=[float(i)]) for i in (1, 2)]
    main(["--inputs", *inputs, "--output", str(tmp_path / "res.pt"), "--force"])
    assert users.read_bytes() == b"mine"
    assert torch.load(tmp_path / "res.pt", weights_only=True)["model"]["w"].tolist() == [1.5]


def test_a_dangling_link_as_output_needs_force(tmp_path):
    (tmp_path / "res.pt").symlink_to(tmp_path / "elsewhere.pt")
    inputs = [small_checkpoint(tmp_path / f"c{i}.pt", w=[float(i)]) for i in (1, 2)]
    with pytest.raises(SystemExit) as error:
        main(["--inputs", *inputs, "--output", str(tmp_path / "res.pt")])
    assert "exists; pass --force" in str(error.value.code)
    assert not (tmp_path / "elsewhere.pt").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_directory_or_a_missing_directory_as_output_is_refused_and_leaves_nothing(tmp_path, force):
    inputs = [small_checkpoint(tmp_path / f"c{i}.pt", w=[float(i)]) for i in (1, 2)]
    (tmp_path / "out").mkdir()
    for output, message in [(tmp_path / "out", f"--output {tmp_path / 'out'} is a directory; give the name"),
                            (tmp_path / "no" / "x.pt", f"--output {tmp_path / 'no' / 'x.pt'}: its directory does not")]:
        with pytest.raises(SystemExit) as error:
            main(["--inputs", *inputs, "--output", str(output), *force])
        assert message in str(error.value.code)
    assert sorted(os.listdir(tmp_path)) == ["c1.pt", "c2.pt", "out"] and os.listdir(tmp_path / "out") == []


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    inputs = [small_checkpoint(tmp_path / f"c{i}.pt", w=[float(i)]) for i in (1, 2)]

    def full_disk(obj, file):
        file.write(b"part")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(SystemExit) as error:
        main(["--inputs", *inputs, "--output", str(tmp_path / "avg.pt")])
    assert "No space left on device" in str(error.value.code)
    assert sorted(os.listdir(tmp_path)) == ["c1.pt", "c2.pt"]


def configured_checkpoint(path, shape=(2,), **model_config):
    config = {"arch": "transformer", "encoder_normalize_before": False, "encoder_attention_heads": 4,
              "activation_fn": "relu", **model_config}
    torch.save({"cfg": {"model": Namespace(**config)}, "model": {"w": torch.zeros(shape)}}, path)
    return str(path)


@pytest.mark.parametrize("change", [
    {"encoder_normalize_before": True}, {"encoder_attention_heads": 8}, {"activation_fn": "gelu"},
    {"arch": "fusion_transformer"}, {"decoder_layers": 7},
])
def test_checkpoints_of_another_structure_are_refused_naming_the_file_and_field(tmp_path, change):
    """Same parameter names and shapes (a post-norm and a pre-norm model): the mean would be neither."""
    [(field, value)] = change.items()
    base = {"decoder_layers": 6}
    first = configured_checkpoint(tmp_path / "post.pt", **base)
    second = configured_checkpoint(tmp_path / "other.pt", **{**base, **change})
    with pytest.raises(SystemExit) as error:
        main(["--inputs", second, first, "--output", str(tmp_path / "avg.pt")])
    assert f"{second} was trained with {field} {value!r} but {first} with" in str(error.value.code)
    assert not (tmp_path / "avg.pt").exists()


def test_a_plugin_structural_flag_that_differs_is_refused(tmp_path):
    first = configured_checkpoint(tmp_path / "a.pt", arch="fusion_transformer", fuse_decoder="sa")
    second = configured_checkpoint(tmp_path / "b.pt", arch="fusion_transformer", fuse_decoder="avg")
    with pytest.raises(SystemExit, match=f"{first} was trained with fuse_decoder 'sa' but {second} with 'avg'"):
        main(["--inputs", first, second, "--output", str(tmp_path / "avg.pt")])


def test_parameters_of_another_shape_are_refused_not_broadcast(tmp_path):
    first = configured_checkpoint(tmp_path / "a.pt", shape=(1,))
    second = configured_checkpoint(tmp_path / "b.pt", shape=(3,))
    with pytest.raises(SystemExit, match=f"{first}: parameter w has shape \\[1\\] but \\[3\\] in {second}"):
        main(["--inputs", first, second, "--output", str(tmp_path / "avg.pt")])
    third = configured_checkpoint(tmp_path / "c.pt", shape=(3,))
    main(["--inputs", second, third, "--output", str(tmp_path / "avg.pt")])  # one model: averaged


def test_a_weight_that_is_not_finite_is_refused_naming_the_file_and_parameter(tmp_path):
    """The mean of a diverged checkpoint and others is NaN too: refused as fairseq's loaders refuse it."""
    first = configured_checkpoint(tmp_path / "a.pt")
    diverged = str(tmp_path / "b.pt")
    torch.save({"cfg": {"model": Namespace(arch="transformer")}, "model": {"w": torch.tensor([0.0, float("nan")])}},
               diverged)
    with pytest.raises(SystemExit, match=f"{diverged}: parameter w holds 1 NaN or infinite value of 2"):
        main(["--inputs", first, diverged, "--output", str(tmp_path / "avg.pt")])
    assert not (tmp_path / "avg.pt").exists()

"""scripts/plot_connection_weights.py on checkpoints trained by fairseq-train."""

import json
import os

import pytest

from conftest import TINY_MLRF_FLAGS, USER_DIR, load_script, run_cli

plot_connection_weights = load_script("plot_connection_weights")
TINY = TINY_MLRF_FLAGS[:16]


def train(data_bin, save_dir, *flags):
    run_cli(
        "fairseq_cli.train", data_bin, "--user-dir", USER_DIR, "--arch", "fusion_transformer", *TINY, *flags,
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "8",
        "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
    )
    return os.path.join(save_dir, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def trained(tiny_data_bin, tmp_path_factory):
    """DenseFormer 1x2 in the encoder, manifold-constrained hyper-connections (n = 2) in the decoder."""
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("connections")), "--denseformer-encoder",
                 "--encoder-layers", "4", "--denseformer-period", "2", "--hyper-connections-decoder", "manifold",
                 "--hyper-connections-rate", "2")


def test_plots_the_averages_and_the_connection_matrices(trained, tiny_data_bin, tmp_path, capsys):
    out, weights = str(tmp_path / "w.png"), str(tmp_path / "w.json")
    assert plot_connection_weights.main(["--path", trained, "--data", tiny_data_bin, "--out", out, "--json", weights]) == 0
    assert os.path.getsize(out) > 0
    with open(weights) as handle:
        matrices = json.load(handle)
    assert sorted(matrices) == ["decoder hyper-connections", "encoder DenseFormer"]
    dwa = matrices["encoder DenseFormer"]
    assert len(dwa) == 2 and [cell is None for cell in dwa[0]] == [False, False, False, True, True]  # after layer 2
    assert all(cell is not None for cell in dwa[1])  # after layer 4: X_0..X_4
    assert dwa[1][4] != 1.0  # trained away from the identity start
    rows = matrices["decoder hyper-connections"]
    assert len(rows) == 3 and len(rows[0]) == 2 * 3 * 4  # n + 1 rows; 2 layers x 3 sublayers of (n+1) + a gap
    assert "encoder DenseFormer" in capsys.readouterr().out


def test_a_checkpoint_without_either_option_is_refused(tiny_mlrf_checkpoint, tiny_data_bin, tmp_path, capsys):
    code = plot_connection_weights.main(["--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
                                         "--out", str(tmp_path / "w.png")])
    assert code == 2
    assert "has no DenseFormer averages, hyper-connections or MUDD connections" in capsys.readouterr().err


def test_mudd_weights_are_drawn_per_way():
    """One block per way (query, key, value, residual), rows the aggregates after layers 1..L, columns
    X_0..X_L and a gap; the last aggregate fills the residual block only."""
    import torch
    from model_building import build_model

    model = build_model("fusion_transformer", *TINY, "--mudd-encoder", "--encoder-layers", "3")
    with torch.no_grad():
        model.encoder.aggregation.generators[1].static[2, 0] = -0.5  # after layer 2: the value way's weight on X_0
    weights = plot_connection_weights.side_weights(model)
    assert sorted(weights) == ["encoder MUDD"]
    matrix = weights["encoder MUDD"]
    assert matrix.shape == (3, 4 * 5)
    value_block, residual_block = matrix[:, 10:15], matrix[:, 15:20]
    assert value_block[1, 0] == -0.5 and value_block[1, 2] == 1.0 and all(value_block[1, 3:] != value_block[1, 3:])
    assert all(value_block[2] != value_block[2])  # the last aggregate has no value way: blank
    assert list(residual_block[2, :4]) == [0.0, 0.0, 0.0, 1.0]  # a_L one-hot on X_L

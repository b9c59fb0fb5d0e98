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


@pytest.mark.parametrize("order", ["columns-first", "rows-first"])
def test_mhc_residual_matrix_is_drawn_with_the_connections_own_sinkhorn_order(order):
    """A model trained with --hyper-connections-sinkhorn-order rows-first was drawn with the columns-first matrix."""
    import torch

    from fusion_fairseq.modules.hyper_connection import ManifoldHyperConnection, sinkhorn

    script = load_script("plot_connection_weights")
    connection = ManifoldHyperConnection(4, 8, order)
    with torch.no_grad():
        connection.bias.normal_(0, 3)
    res = connection.bias.split([4, 4, 16])[2].view(4, 4)
    drawn = torch.from_numpy(script.connection_matrix(connection))[1:, 1:]
    torch.testing.assert_close(drawn, sinkhorn(res, order=order).T.detach())


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


SOURCE, TARGET = "w3 w17 w5", "W5 W17 W3"


@pytest.fixture(scope="module")
def trained_mudd(tiny_data_bin, tmp_path_factory):
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("mudd")), "--mudd-encoder", "--mudd-decoder")


def test_mudd_dynamic_weights_of_a_sentence_are_drawn_beside_the_static_ones(trained_mudd, tiny_data_bin, tmp_path):
    out, weights = str(tmp_path / "w.png"), str(tmp_path / "w.json")
    assert plot_connection_weights.main(["--path", trained_mudd, "--data", tiny_data_bin, "--out", out, "--json",
                                         weights, "--source", SOURCE, "--target", TARGET]) == 0
    with open(weights) as handle:
        matrices = json.load(handle)
    sides = [f"{side} MUDD{panel}" for side in ("encoder", "decoder")
             for panel in ("", ", mean over the sentence", ", std over the sentence")]
    assert sorted(matrices) == sorted(sides)
    for side in ("encoder", "decoder"):
        static, mean, spread = (matrices[f"{side} MUDD{panel}"] for panel in
                                ("", ", mean over the sentence", ", std over the sentence"))
        assert [[cell is None for cell in row] for row in mean] == [[cell is None for cell in row] for row in static]
        cells = [(m, s, a) for rows in zip(mean, spread, static) for m, s, a in zip(*rows) if m is not None]
        assert all(s >= 0 for _, s, _ in cells) and any(s > 1e-6 for _, s, _ in cells)  # trained: W_2 != 0
        assert any(abs(m - a) > 1e-6 for m, _, a in cells)


def test_weights_that_do_not_depend_on_the_input_have_no_spread(trained_mudd, tiny_data_bin):
    """With W_2 = 0 (as at initialisation) A_i(X_i) = a_i at every position: the mean is the static
    weights and the spread 0 on that side, while the other side still varies."""
    import argparse

    import torch
    from fusion_lab.analysis import load_model

    model, _, task = load_model(trained_mudd, tiny_data_bin)
    with torch.no_grad():
        for generator in model.encoder.aggregation.generators:
            generator.w2.weight.zero_()
    args = argparse.Namespace(source=SOURCE, target=TARGET, bpe=None, bpe_codes=None, allow_unk=False, beam=5)
    found = plot_connection_weights.sentence_weights(args, model, task)
    static = plot_connection_weights.side_weights(model)["encoder MUDD"]
    mean, spread = found["encoder MUDD, mean over the sentence"], found["encoder MUDD, std over the sentence"]
    cells = static == static
    assert (abs(mean[cells] - static[cells]) < 1e-6).all() and (spread[cells] == 0).all()
    decoder = found["decoder MUDD, std over the sentence"]
    assert (decoder[decoder == decoder] > 1e-6).any()


@pytest.mark.parametrize("flags, message", [
    (["--source", SOURCE], "--source: the checkpoint's model has no MUDD connections"),
    (["--target", TARGET], "--target: only with --source"),
])
def test_a_sentence_is_refused_where_no_weight_depends_on_it(trained, tiny_data_bin, tmp_path, capsys, flags,
                                                             message):
    code = plot_connection_weights.main(["--path", trained, "--data", tiny_data_bin, "--out", str(tmp_path / "w.png"),
                                         *flags])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "w.png")


@pytest.mark.parametrize("arch", ["fconv", "dense_fconv"])
def test_a_convolutional_model_has_no_connection_weights_to_draw(arch):
    """Its stacks have no ``layers``: the script's one-line refusal, not an AttributeError."""
    from model_building import build_model

    script = load_script("plot_connection_weights")
    layers = ("--encoder-layers", "[(8, 3)] * 2", "--decoder-layers", "[(8, 3)] * 2", "--encoder-embed-dim", "8",
              "--decoder-embed-dim", "8", "--decoder-out-embed-dim", "8")
    assert script.side_weights(build_model(arch, *layers)) == {}

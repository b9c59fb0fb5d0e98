"""scripts/plot_fusion_attention.py: MLRF Figure 5 (hop-by-layer attention of self-attention fusion)."""

import argparse
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils

from conftest import load_checkpoint, load_script, REPO_ROOT, run_script, token_ids

SCRIPT = os.path.join(REPO_ROOT, "scripts", "plot_fusion_attention.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SOURCE, TARGET = "w3 w17 w5", "W5 W17 W3"


@pytest.fixture(scope="module")
def plot_script():
    return load_script("plot_fusion_attention")


@pytest.fixture(scope="module")
def encoder_sa_checkpoint(tiny_mlrf_checkpoint, tiny_data_bin, tmp_path_factory):
    """The tiny checkpoint rebuilt as Enc-SA + Dec-FNN without the embedding layer (freshly
    initialised weights: enough for shapes, normalisation and labels; no training needed)."""
    _, task = load_checkpoint(tiny_mlrf_checkpoint, tiny_data_bin)
    state = checkpoint_utils.load_checkpoint_to_cpu(tiny_mlrf_checkpoint)
    args = copy.deepcopy(state["cfg"]["model"])  # the fields of the model's dataclass
    args.fuse_encoder, args.fuse_decoder, args.fusion_no_embedding_layer = "sa", "fnn", True
    torch.manual_seed(0)
    model = task.build_model(args)
    state["cfg"]["model"] = args
    state["model"] = model.state_dict()
    state["last_optimizer_state"] = None
    path = str(tmp_path_factory.mktemp("ckpt_enc_sa") / "checkpoint_enc_sa.pt")
    torch.save(state, path)
    return path


def test_decoder_png_json_and_text(plot_script, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    png, out_json = tmp_path / "fig.png", tmp_path / "weights.json"
    code, out, err = run_script(
        plot_script, capsys, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
        "--source", SOURCE, "--target", TARGET, "--out", str(png), "--json", str(out_json),
    )
    assert code == 0, err
    data = png.read_bytes()
    assert len(data) > 0 and data.startswith(PNG_MAGIC)
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3  # decodes as an image

    result = json.loads(out_json.read_text())
    weights = torch.tensor(result["weights"])
    nhop, num_layers, length = 4, 3, len(TARGET.split()) + 1  # hops x (l0, l1, l2) x (target + EOS)
    assert list(weights.shape) == [nhop, num_layers, length] == result["shape"]
    assert result["layer_labels"] == ["l0", "l1", "l2"] and result["include_embedding_layer"] is True
    assert result["predicted_tokens"] == TARGET.split() + ["</s>"] == result["x_labels"]
    assert result["fed_tokens"] == ["</s>"] + TARGET.split()
    assert result["source_tokens"] == SOURCE.split() + ["</s>"]
    assert torch.allclose(weights.sum(dim=1), torch.ones(nhop, length), atol=1e-5)
    assert ((weights >= 0) & (weights <= 1)).all()

    # the text dump: one matrix per hop, top layer first, same numbers as the JSON
    for hop in range(nhop):
        assert f"({'abcd'[hop]}) Hop {hop + 1}" in out
    lines = out.splitlines()
    first = lines.index("(a) Hop 1")
    assert lines[first + 1].split() == result["x_labels"]
    assert [line.split()[0] for line in lines[first + 2:first + 5]] == ["l2", "l1", "l0"]
    l0_row = [float(v) for v in lines[first + 4].split()[1:]]
    assert l0_row == pytest.approx(weights[0, 0].tolist(), abs=6e-4)
    assert "predicted" in out  # the axis says what the columns are


def test_weights_equal_decoder_forward(plot_script, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    out_json = tmp_path / "weights.json"
    code, _, err = run_script(
        plot_script, capsys, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
        "--source", SOURCE, "--target", TARGET, "--out", str(tmp_path / "fig.png"), "--json", str(out_json),
    )
    assert code == 0, err
    weights = torch.tensor(json.loads(out_json.read_text())["weights"])

    model, task = load_checkpoint(tiny_mlrf_checkpoint, tiny_data_bin)
    src = token_ids(task.source_dictionary, SOURCE).unsqueeze(0)
    tgt = token_ids(task.target_dictionary, TARGET)
    prev = torch.cat([tgt.new_tensor([task.target_dictionary.eos()]), tgt[:-1]]).unsqueeze(0)
    with torch.no_grad():
        _, extra = model(src, torch.tensor([src.size(1)]), prev)
    direct = extra["fusion_attn"]  # (batch, tgt_len, nhop, layers)
    assert direct.shape == (1, tgt.numel(), 4, 3)
    assert torch.allclose(weights, direct[0].permute(1, 2, 0), atol=1e-6)

    # and from the paper's equations on the layer stack (Eqs. 4-6), independently of the module's forward
    fusion = model.decoder.output_fusion.function
    states = extra["inner_states"]
    top = states[-1] if model.decoder.layer_norm is None else model.decoder.layer_norm(states[-1])
    with torch.no_grad():
        layers = torch.stack(states[:-1] + [top], dim=-2)  # T x B x L x d
        if fusion.layer_embedding is not None:
            layers = layers + fusion.layer_embedding.weight[: layers.size(-2)]
        energy = fusion.w2(torch.tanh(fusion.w1(layers)))  # T x B x L x nhop
        expected = torch.softmax(energy, dim=-2)[:, 0].permute(2, 1, 0)  # nhop x L x T
    assert torch.allclose(weights, expected, atol=1e-5)


def test_translates_when_target_omitted(plot_script, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    out_json = tmp_path / "weights.json"
    code, _, err = run_script(
        plot_script, capsys, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
        "--source", SOURCE, "--out", str(tmp_path / "fig.png"), "--json", str(out_json), "--xlabels", "fed",
    )
    assert code == 0, err
    result = json.loads(out_json.read_text())
    assert result["target_from"].startswith("beam search (beam 5)")
    hypothesis = result["predicted_tokens"]
    assert hypothesis[-1] == "</s>" and result["x_labels"] == ["</s>"] + hypothesis[:-1]
    assert result["shape"] == [4, 3, len(hypothesis)]

    model, task = load_checkpoint(tiny_mlrf_checkpoint, tiny_data_bin)
    generator = task.build_generator([model], argparse.Namespace(beam=5))
    src = token_ids(task.source_dictionary, SOURCE)
    hypos = task.inference_step(generator, [model], {"net_input": {"src_tokens": src.unsqueeze(0),
                                                                   "src_lengths": torch.tensor([src.numel()])}})
    assert [task.target_dictionary[int(i)] for i in hypos[0][0]["tokens"]] == hypothesis


def test_encoder_side(plot_script, capsys, encoder_sa_checkpoint, tiny_data_bin, tmp_path):
    png, out_json = tmp_path / "enc.png", tmp_path / "enc.json"
    code, out, err = run_script(
        plot_script, capsys, "--path", encoder_sa_checkpoint, "--data", tiny_data_bin, "--side", "encoder",
        "--source", SOURCE, "--out", str(png), "--json", str(out_json),
    )
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    result = json.loads(out_json.read_text())
    weights = torch.tensor(result["weights"])
    assert result["layer_labels"] == ["l1", "l2"] and result["include_embedding_layer"] is False  # no h0
    assert result["x_labels"] == SOURCE.split() + ["</s>"]
    assert list(weights.shape) == [4, 2, len(SOURCE.split()) + 1]
    assert torch.allclose(weights.sum(dim=1), torch.ones(4, weights.size(2)), atol=1e-5)

    model, task = load_checkpoint(encoder_sa_checkpoint, tiny_data_bin)
    src = token_ids(task.source_dictionary, SOURCE).unsqueeze(0)
    with torch.no_grad():
        direct = model.encoder.fusion_weights(src, torch.tensor([src.size(1)]))  # (src_len, batch, nhop, layers)
    assert torch.allclose(weights, direct[:, 0].permute(1, 2, 0), atol=1e-6)
    assert "l0" not in out.split()


def test_side_without_sa_fusion_is_a_clear_error(plot_script, capsys, encoder_sa_checkpoint, tiny_mlrf_checkpoint,
                                                 tiny_data_bin, tmp_path):
    png = tmp_path / "fig.png"
    code, _, err = run_script(plot_script, capsys, "--path", encoder_sa_checkpoint, "--data", tiny_data_bin,
                              "--source", SOURCE, "--target", TARGET, "--out", str(png))
    assert code == 2
    assert "--side decoder" in err and "--fuse-decoder fnn" in err and "--fuse-decoder sa is needed" in err
    assert "try --side encoder" in err
    assert not png.exists()

    # the tiny MLRF checkpoint is Both-FNN-SA: its encoder fuses by FNN
    code, _, err = run_script(plot_script, capsys, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
                              "--side", "encoder", "--source", SOURCE, "--out", str(png))
    assert code == 2 and "--fuse-encoder fnn" in err and "--fuse-encoder sa is needed" in err


@pytest.mark.parametrize("flags, named", [(("--target", TARGET), "--target"), (("--beam", "3"), "--beam"),
                                           (("--xlabels", "fed"), "--xlabels")])
def test_decoder_flags_are_refused_on_the_encoder_side(plot_script, capsys, encoder_sa_checkpoint, tiny_data_bin,
                                                       tmp_path, flags, named):
    """They were ignored: the encoder's fusion was plotted for the source alone."""
    code, _, err = run_script(plot_script, capsys, "--path", encoder_sa_checkpoint, "--data", tiny_data_bin,
                              "--side", "encoder", "--source", SOURCE, *flags, "--out", str(tmp_path / "fig.png"))
    assert code == 2 and f"{named}: the decoder side's; --side encoder plots the source alone" in err
    assert not (tmp_path / "fig.png").exists()


def test_the_bpe_codes_are_an_input_that_not_even_force_replaces(plot_script, capsys, tiny_mlrf_checkpoint,
                                                                  tiny_data_bin, tmp_path):
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\n")
    code, _, err = run_script(plot_script, capsys, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
                              "--source", SOURCE, "--bpe", "subword_nmt", "--bpe-codes", str(codes),
                              "--out", str(tmp_path / "fig.png"), "--json", str(codes), "--force")
    assert code == 2 and f"--json {codes} is the same file as --bpe-codes {codes}" in err
    assert codes.read_text() == "#version: 0.2\n"


@pytest.mark.slow
def test_command_line_exit_status(tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    """The real script: non-zero exit and a message naming the flag and the word."""
    result = subprocess.run(
        [sys.executable, SCRIPT, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin,
         "--source", "w3 nosuchword w5", "--out", str(tmp_path / "fig.png")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 2
    assert "error: --source: word 'nosuchword' is not in the dictionary" in result.stderr
    assert "--allow-unk" in result.stderr


def test_unknown_word_with_allow_unk(plot_script, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    out_json = tmp_path / "weights.json"
    code, _, err = run_script(
        plot_script, capsys, "--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin, "--source", SOURCE,
        "--target", "W5 NOSUCH W3", "--allow-unk", "--out", str(tmp_path / "fig.png"), "--json", str(out_json),
    )
    assert code == 0, err
    assert "warning: --target: word 'NOSUCH'" in err and "<unk>" in err
    assert json.loads(out_json.read_text())["predicted_tokens"] == ["W5", "<unk>", "W3", "</s>"]


def test_bpe(plot_script, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    codes = tmp_path / "codes"
    merges = ["w 3</w>", "w 5</w>", "w 1", "w1 7</w>", "W 3</w>", "W 5</w>", "W 1", "W1 7</w>"]
    codes.write_text("#version: 0.2\n" + "\n".join(merges) + "\n")  # rebuilds w3 w17 w5 and W3 W17 W5 only
    out_json = tmp_path / "weights.json"
    common = ["--path", tiny_mlrf_checkpoint, "--data", tiny_data_bin, "--side", "decoder", "--target", TARGET,
              "--bpe", "subword_nmt", "--bpe-codes", str(codes), "--out", str(tmp_path / "fig.png")]
    code, _, err = run_script(plot_script, capsys, *common, "--source", SOURCE, "--json", str(out_json))
    assert code == 0, err
    assert json.loads(out_json.read_text())["source_tokens"] == SOURCE.split() + ["</s>"]
    code, _, err = run_script(plot_script, capsys, *common, "--source", "w3 w8", "--force")
    assert code == 2 and "--source: word 'w@@' after BPE is not in the dictionary" in err

"""Layer-wise coordination analysis tools: scripts/plot_mixed_attention.py (He et al. 2018,
Figure 4)."""

import argparse
import json
import os
import shlex

import pytest
import torch
from fairseq import checkpoint_utils

from conftest import load_checkpoint, load_script, REPO_ROOT, run_cli, token_ids, USER_DIR
from model_building import parse_model_args

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SOURCE, TARGET = "w3 w17 w5", "W5 W17 W3"


@pytest.fixture(scope="module")
def plot_script():
    return load_script("plot_mixed_attention")


@pytest.fixture(scope="module")
def coordination_checkpoint(tiny_joined_data_bin, tmp_path_factory):
    """A 2-layer layerwise_coordination model at width 16 trained for a few updates."""
    save_dir = str(tmp_path_factory.mktemp("ckpt_lwc"))
    run_cli(
        "fairseq_cli.train", tiny_joined_data_bin, "--user-dir", USER_DIR, "--arch", "layerwise_coordination",
        "--layers", "2", "--embed-dim", "16", "--ffn-embed-dim", "32", "--attention-heads", "2",
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "4",
        "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
        "--no-save-optimizer-state", "--disable-validation",
    )
    return os.path.join(save_dir, "checkpoint_last.pt")






def run_plot(plot_script, capsys, *argv):
    code = plot_script.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_plot_png_json_text_and_weights(plot_script, capsys, coordination_checkpoint, tiny_joined_data_bin, tmp_path):
    png, out_json = tmp_path / "fig.png", tmp_path / "weights.json"
    code, out, err = run_plot(
        plot_script, capsys, "--path", coordination_checkpoint, "--data", tiny_joined_data_bin,
        "--source", SOURCE, "--target", TARGET, "--layer", "2", "--out", str(png), "--json", str(out_json),
    )
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3  # decodes as an image

    result = json.loads(out_json.read_text())
    n, m = len(SOURCE.split()) + 1, len(TARGET.split()) + 1  # words + EOS; start symbol + words
    weights = torch.tensor(result["weights"])
    assert list(weights.shape) == [m, n + m] == result["shape"]
    assert (result["layer"], result["layer_index"], result["num_layers"]) == (2, 1, 2)
    assert result["source_tokens"] == SOURCE.split() + ["</s>"]
    assert result["target_fed_tokens"] == ["</s>"] + TARGET.split()
    assert result["predicted_tokens"] == TARGET.split() + ["</s>"]
    assert result["column_labels"] == result["source_tokens"] + result["target_fed_tokens"]
    assert torch.allclose(weights.sum(dim=1), torch.ones(m), atol=1e-5)  # each row is one softmax
    assert (weights >= 0).all()
    for row in range(m):  # Eq. 3: target row i sees target columns 0..i only
        assert (weights[row, n + row + 1:] == 0).all()
        assert (weights[row, : n + row + 1] > 0).all()
        assert result["masked"][row] == [False] * (n + row + 1) + [True] * (m - row - 1)

    # the same numbers as the decoder's extra["mixed_attn"] for alignment_layer = 1 (0-based)
    model, task = load_checkpoint(coordination_checkpoint, tiny_joined_data_bin)
    src = token_ids(task.source_dictionary, SOURCE).unsqueeze(0)
    tgt = token_ids(task.target_dictionary, TARGET)
    prev = torch.cat([tgt.new_tensor([task.target_dictionary.eos()]), tgt[:-1]]).unsqueeze(0)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=torch.tensor([src.size(1)]))
        _, extra = model.decoder(prev, encoder_out=encoder_out, alignment_layer=1)
        _, extra_first = model.decoder(prev, encoder_out=encoder_out, alignment_layer=0)
    assert torch.allclose(weights, extra["mixed_attn"][0][0], atol=1e-6)
    assert not torch.allclose(weights, extra_first["mixed_attn"][0][0], atol=1e-4)  # --layer 2 is not layer 1

    # text dump: header of source | target columns, one row per target position, '-' = masked
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:n] == result["source_tokens"])
    assert lines[header].split() == result["source_tokens"] + ["|"] + result["target_fed_tokens"]
    first_row = lines[header + 1].split()
    assert first_row[0] == "</s>->W5" and first_row[n + 1] == "|" and first_row[-(m - 1):] == ["-"] * (m - 1)
    assert [float(v) for v in first_row[1:n + 1]] == pytest.approx(weights[0, :n].tolist(), abs=6e-4)
    assert "1-based" in out


def test_plot_translates_when_target_omitted(plot_script, capsys, coordination_checkpoint, tiny_joined_data_bin,
                                             tmp_path):
    out_json = tmp_path / "weights.json"
    code, _, err = run_plot(plot_script, capsys, "--path", coordination_checkpoint, "--data", tiny_joined_data_bin,
                            "--source", SOURCE, "--layer", "1", "--out", str(tmp_path / "fig.png"),
                            "--json", str(out_json), "--beam", "3", "--max-len", "6")
    assert code == 0, err
    result = json.loads(out_json.read_text())
    assert result["target_from"].startswith("beam search (beam 3")
    hypothesis = result["predicted_tokens"]
    assert len(hypothesis) <= 7 and hypothesis[-1] == "</s>"  # --max-len 6 tokens + EOS
    assert result["target_fed_tokens"] == ["</s>"] + hypothesis[:-1]
    weights = torch.tensor(result["weights"])
    assert list(weights.shape) == [len(hypothesis), 4 + len(hypothesis)]
    assert torch.allclose(weights.sum(dim=1), torch.ones(len(hypothesis)), atol=1e-5)


@pytest.mark.parametrize("layer", ["0", "3", "-1"])
def test_plot_layer_out_of_range(plot_script, capsys, coordination_checkpoint, tiny_joined_data_bin, tmp_path,
                                 layer):
    png = tmp_path / "fig.png"
    code, _, err = run_plot(plot_script, capsys, "--path", coordination_checkpoint, "--data", tiny_joined_data_bin,
                            "--source", SOURCE, "--target", TARGET, "--layer", layer, "--out", str(png))
    assert code == 2
    assert f"--layer {layer}" in err and "allowed 1..2" in err
    assert not png.exists()


def test_plot_unknown_word_and_non_coordination_checkpoint(plot_script, capsys, coordination_checkpoint,
                                                           tiny_joined_data_bin, tmp_path):
    png = tmp_path / "fig.png"
    code, _, err = run_plot(plot_script, capsys, "--path", coordination_checkpoint, "--data", tiny_joined_data_bin,
                            "--source", "w3 nosuchword", "--target", TARGET, "--layer", "1", "--out", str(png))
    assert code == 2 and "--source: word 'nosuchword' is not in the dictionary" in err

    # the same checkpoint file rebuilt as a vanilla transformer (fresh weights)
    _, task = load_checkpoint(coordination_checkpoint, tiny_joined_data_bin)
    state = checkpoint_utils.load_checkpoint_to_cpu(coordination_checkpoint)
    args = parse_model_args("transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                            "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                            "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                            "--decoder-attention-heads", "2", "--share-all-embeddings")
    assert isinstance(args, argparse.Namespace)
    state["cfg"]["model"] = args
    state["model"] = task.build_model(args).state_dict()
    transformer_path = str(tmp_path / "transformer.pt")
    torch.save(state, transformer_path)
    code, _, err = run_plot(plot_script, capsys, "--path", transformer_path, "--data", tiny_joined_data_bin,
                            "--source", SOURCE, "--target", TARGET, "--layer", "1", "--out", str(png))
    assert code == 2
    assert f"--path {transformer_path}" in err and "TransformerModel" in err and "not layerwise_coordination" in err
    assert not png.exists()


def test_plot_refuses_a_source_longer_than_the_model_reads(plot_script, capsys, coordination_checkpoint,
                                                           tiny_joined_data_bin, tmp_path):
    """Beyond its positions the model fails, or the figure grows to gigabytes."""
    model, _ = load_checkpoint(coordination_checkpoint, tiny_joined_data_bin)
    limit = model.encoder.max_positions()
    png = tmp_path / "fig.png"
    code, _, err = run_plot(plot_script, capsys, "--path", coordination_checkpoint, "--data", tiny_joined_data_bin,
                            "--source", " ".join([SOURCE.split()[0]] * limit), "--target", TARGET, "--layer", "1",
                            "--out", str(png))
    assert code == 2 and f"--source has {limit + 1} tokens (end of sentence included), but the model reads at " \
        f"most {limit} positions" in err
    assert not png.exists()


TRAIN_SH = os.path.join(REPO_ROOT, "examples", "layerwise_coordination", "train.sh")


def dry_run(data_bin, *argv):
    import subprocess

    return subprocess.run(["bash", TRAIN_SH, data_bin, *argv, "--dry-run", "--user-dir", USER_DIR],
                          capture_output=True, text=True, timeout=60)


def test_train_sh_paper_recipe_and_ablations(tmp_path):
    for name in ("dict.src.txt", "dict.tgt.txt"):
        (tmp_path / name).write_text("a 1\nb 1\n")
    result = dry_run(str(tmp_path), "coordination")
    assert result.returncode == 0, result.stderr
    command = result.stdout
    for expected in ("--arch layerwise_coordination_iwslt_de_en", "--layers 14", "--adam-eps 1e-9",
                     "--lr-scheduler inverse_sqrt", "--warmup-updates 4000", "--max-tokens 2048"):
        assert expected in command
    words = shlex.split(command)
    assert words[words.index("--adam-betas") + 1] == "(0.9, 0.98)"
    assert words[words.index("--lr") + 1] == "0.000988" and words[0] == "fairseq-train"
    for variant, flags in (("no-sharing", "--no-layer-sharing --layers 7"), ("no-mixed", "--no-mixed-attention"),
                           ("no-language", "--no-language-embedding"), ("no-position", "--no-position-embedding")):
        result = dry_run(str(tmp_path), variant)
        assert result.returncode == 0 and flags in result.stdout and f"lwc-iwslt14-de-en/{variant} " in result.stdout
    result = dry_run(str(tmp_path), "coordination", "--layers", "18")
    assert "--layers 18" in result.stdout and "coordination-layers18" in result.stdout
    result = dry_run(str(tmp_path), "transformer")
    assert "--arch transformer --share-all-embeddings --encoder-layers 6 --decoder-layers 6" in result.stdout

    result = dry_run(str(tmp_path), "no-such-variant")
    assert result.returncode == 2 and "unknown VARIANT 'no-such-variant'" in result.stderr
    (tmp_path / "dict.tgt.txt").write_text("c 1\n")
    result = dry_run(str(tmp_path), "coordination")
    assert result.returncode == 2 and "joined dictionary" in result.stderr

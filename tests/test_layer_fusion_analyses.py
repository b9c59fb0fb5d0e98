"""The analyses of Liu et al. (ICLR 2021) as scripts over a checkpoint:
scripts/plot_layer_attention.py (Figure 1), scripts/mask_encoder_layers.py (Sec. 3.3, Figure 2) and
scripts/embedding_analysis.py (Figures 3-4, Table 3).

One tiny fine-grained layer-attention checkpoint is trained with the real fairseq-train; the
coarse, no-layer-attention and shared-embedding checkpoints are rebuilt from its configuration in
process (freshly initialised weights: enough for shapes, normalisation and the error paths)."""

import ast
import copy
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, tasks
from fairseq.data import Dictionary
from omegaconf import OmegaConf

from conftest import load_checkpoint, load_script, REPO_ROOT, run_cli, run_script, TINY_MLRF_FLAGS, USER_DIR
from fusion_lab.common import python_module_command

pytestmark = pytest.mark.slow  # fairseq command-line runs and trained checkpoints: CI runs them

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_WIDTH_FLAGS = [flag for i, flag in enumerate(TINY_MLRF_FLAGS)
                    if not flag.startswith("--fusion-") and not TINY_MLRF_FLAGS[i - 1].startswith("--fusion-")]
NUM_ENCODER_LAYERS = 2  # TINY_MLRF_FLAGS: 2 encoder and 2 decoder layers, d = 16
MASK_ERROR = "--mask-encoder-layer {} does not exist: the encoder has layers 0 (embedding) to 2"


@pytest.fixture(scope="module")
def heatmap_script():
    return load_script("plot_layer_attention")


@pytest.fixture(scope="module")
def mask_script():
    return load_script("mask_encoder_layers")


@pytest.fixture(scope="module")
def embedding_script():
    return load_script("embedding_analysis")






def weights_of(model):
    attention = model.decoder.layer_attention
    attention.eval()
    with torch.no_grad():
        return attention.weights().float()


# ------------------------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="session")
def fine_checkpoint(tiny_data_bin, tmp_path_factory):
    """``--arch fusion_transformer --layer-attention fine`` at tiny width, trained for 30 updates."""
    save_dir = str(tmp_path_factory.mktemp("ckpt_fine"))
    with pytest.MonkeyPatch.context() as patch:
        if "OMP_NUM_THREADS" not in os.environ:  # a tiny model: threads only spin on a shared machine
            patch.setenv("OMP_NUM_THREADS", "1")
        train(save_dir, tiny_data_bin)
    return os.path.join(save_dir, "checkpoint_last.pt")


def train(save_dir, tiny_data_bin):
    run_cli(
        "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "fusion_transformer", *TINY_WIDTH_FLAGS,
        "--layer-attention", "fine", "--dropout", "0.0",
        "--optimizer", "adam", "--lr", "0.02", "--max-tokens", "2000", "--max-update", "30",
        "--disable-validation", "--save-interval", "1000", "--no-epoch-checkpoints",
        "--save-dir", save_dir, "--no-progress-bar", "--seed", "1",
    )


def derive_checkpoint(base, data_bin, path, seed=0, **changes):
    """``base``'s configuration with ``changes``, built afresh on ``data_bin`` and saved to ``path``."""
    state = checkpoint_utils.load_checkpoint_to_cpu(base)
    args = {**OmegaConf.to_container(state["cfg"]["model"]), **changes}  # the fields of the model's dataclass
    task_cfg = copy.deepcopy(state["cfg"]["task"])
    task_cfg.data = data_bin
    task_cfg.source_lang, task_cfg.target_lang = "src", "tgt"  # joined_dict_dir has no data to infer them from
    task = tasks.setup_task(task_cfg)
    torch.manual_seed(seed)
    model = task.build_model(OmegaConf.create(args))
    if getattr(model.decoder, "layer_attention", None) is not None:
        with torch.no_grad():
            model.decoder.layer_attention.logits.normal_()  # not the uniform initial weights
    state["cfg"]["model"] = args
    state["cfg"]["task"] = task_cfg
    state["model"] = model.state_dict()
    state["last_optimizer_state"] = None
    torch.save(state, path)
    return str(path)


@pytest.fixture(scope="session")
def coarse_checkpoint(fine_checkpoint, tiny_data_bin, tmp_path_factory):
    return derive_checkpoint(fine_checkpoint, tiny_data_bin, tmp_path_factory.mktemp("ckpt_coarse") / "coarse.pt",
                             layer_attention="coarse")


@pytest.fixture(scope="session")
def vanilla_checkpoint(fine_checkpoint, tiny_data_bin, tmp_path_factory):
    return derive_checkpoint(fine_checkpoint, tiny_data_bin, tmp_path_factory.mktemp("ckpt_none") / "vanilla.pt",
                             layer_attention="none")


@pytest.fixture(scope="session")
def joined_dict_dir(tiny_data_bin, tmp_path_factory):
    """A data directory with one joined dictionary (the union of the source and target ones) as
    dict.src.txt and dict.tgt.txt: all that building and loading a model needs (no binarised data)."""
    directory = tmp_path_factory.mktemp("joined_dicts")
    joined = Dictionary()
    for lang in ("src", "tgt"):
        side = Dictionary.load(os.path.join(tiny_data_bin, f"dict.{lang}.txt"))
        for index in range(side.nspecial, len(side)):
            if not side[index].startswith("madeupword"):  # fairseq's padding to a multiple of 8
                joined.add_symbol(side[index], side.count[index])
    joined.finalize(padding_factor=8)
    for lang in ("src", "tgt"):
        joined.save(str(directory / f"dict.{lang}.txt"))
    return str(directory)


@pytest.fixture(scope="session")
def shared_checkpoint(fine_checkpoint, joined_dict_dir, tmp_path_factory):
    """Joined dictionary and --share-all-embeddings (one matrix for source, target and output)."""
    return derive_checkpoint(fine_checkpoint, joined_dict_dir,
                             tmp_path_factory.mktemp("ckpt_shared") / "shared.pt", seed=1,
                             share_all_embeddings=True, share_decoder_input_output_embed=True)


# ------------------------------------------------------------------------ Figure 1: the heatmap


def test_heatmap_fine_png_text_and_json(heatmap_script, capsys, fine_checkpoint, tiny_data_bin, tmp_path):
    png, out_json = tmp_path / "fig1.png", tmp_path / "w.json"
    code, out, err = run_script(heatmap_script, capsys, "--path", fine_checkpoint, "--data", tiny_data_bin,
                                "--out", png, "--json", out_json, "--per-dim")
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3

    result = json.loads(out_json.read_text())
    matrix = torch.tensor(result["weights"])
    assert result["kind"] == "fine" and result["dims"] == 16
    assert result["decoder_labels"] == ["1", "2"] and result["encoder_labels"] == ["Emb", "1", "2"]
    assert matrix.shape == (2, NUM_ENCODER_LAYERS + 1)
    # the mean over d of per-d normalised weights still sums to 1 over encoder layers
    assert torch.allclose(matrix.sum(dim=1), torch.ones(2), atol=1e-5)

    model, _ = load_checkpoint(fine_checkpoint, tiny_data_bin)
    per_dim = weights_of(model)  # (M, N+1, D)
    assert torch.allclose(torch.tensor(result["weights_per_dim"]), per_dim, atol=1e-6)
    assert torch.allclose(matrix, per_dim.mean(dim=-1), atol=1e-6)
    assert torch.allclose(per_dim, torch.softmax(model.decoder.layer_attention.logits.float(), dim=1), atol=1e-6)
    assert not torch.allclose(matrix, torch.full_like(matrix, 1 / 3), atol=1e-4)  # trained away from uniform

    # the printed matrix: rows = decoder layers, columns = Emb, 1, 2, and the row sums
    assert "mean over the 16 dimensions" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("dec\\enc"))
    assert lines[header].split()[1:] == ["Emb", "1", "2", "sum"]
    for m in range(2):
        fields = lines[header + 1 + m].split()
        assert fields[0] == str(m + 1)
        assert [float(v) for v in fields[1:4]] == pytest.approx(matrix[m].tolist(), abs=6e-4)
        assert float(fields[4]) == pytest.approx(1.0, abs=1e-3)


def test_heatmap_coarse_and_paper_layout(heatmap_script, capsys, coarse_checkpoint, tiny_data_bin, tmp_path):
    png, out_json = tmp_path / "coarse.png", tmp_path / "coarse.json"
    code, out, err = run_script(heatmap_script, capsys, "--path", coarse_checkpoint, "--data", tiny_data_bin,
                                "--out", png, "--json", out_json, "--layout", "paper")
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    result = json.loads(out_json.read_text())
    assert result["kind"] == "coarse" and result["dims"] == 1 and "weights_per_dim" not in result
    model, _ = load_checkpoint(coarse_checkpoint, tiny_data_bin)
    expected = torch.softmax(model.decoder.layer_attention.logits.float(), dim=1).squeeze(-1)
    assert torch.allclose(torch.tensor(result["weights"]), expected, atol=1e-6)
    assert torch.allclose(expected.sum(dim=1), torch.ones(2), atol=1e-6)
    assert "coarse-grained" in out and "mean over" not in out


def test_masked_weights_are_the_renormalised_unmasked_ones(heatmap_script, capsys, fine_checkpoint, tiny_data_bin,
                                                           tmp_path):
    """w_masked[m, n', d] = w[m, n', d] / (1 - w[m, n, d]) for n' != n and 0 for n, by hand; through the
    model-overrides mechanism of fairseq-generate and through the plotting script."""
    model, _ = load_checkpoint(fine_checkpoint, tiny_data_bin)
    unmasked = weights_of(model).double()
    for n in range(NUM_ENCODER_LAYERS + 1):
        expected = unmasked.clone()
        expected[:, n] = 0.0
        expected = expected / (1.0 - unmasked[:, n:n + 1])
        masked_model, _ = load_checkpoint(fine_checkpoint, tiny_data_bin, mask_encoder_layer=n)
        assert masked_model.decoder.layer_attention.masked_layer == n
        assert torch.allclose(weights_of(masked_model).double(), expected, atol=1e-6)

        out_json = tmp_path / f"masked{n}.json"
        code, _, err = run_script(heatmap_script, capsys, "--path", fine_checkpoint, "--data", tiny_data_bin,
                                  "--mask-encoder-layer", n, "--out", tmp_path / f"m{n}.png", "--json", out_json,
                                  "--per-dim")
        assert code == 0, err
        result = json.loads(out_json.read_text())
        assert result["masked_layer"] == n
        assert torch.allclose(torch.tensor(result["weights_per_dim"]).double(), expected, atol=1e-6)
        matrix = torch.tensor(result["weights"])
        assert torch.all(matrix[:, n] == 0) and torch.allclose(matrix.sum(dim=1), torch.ones(2), atol=1e-5)


def test_heatmap_errors(heatmap_script, capsys, vanilla_checkpoint, fine_checkpoint, tiny_data_bin, tmp_path):
    png = tmp_path / "fig.png"
    code, _, err = run_script(heatmap_script, capsys, "--path", vanilla_checkpoint, "--data", tiny_data_bin,
                              "--out", png)
    assert code == 2
    assert "--layer-attention none" in err and "--layer-attention coarse or fine is needed" in err
    assert not png.exists()
    code, _, err = run_script(heatmap_script, capsys, "--path", fine_checkpoint, "--data", tiny_data_bin,
                              "--mask-encoder-layer", 3, "--out", png)
    assert code == 2 and MASK_ERROR.format(3) in err
    code, _, err = run_script(heatmap_script, capsys, "--path", str(tmp_path / "missing.pt"), "--out", png)
    assert code == 2 and "--path" in err and "no such checkpoint file" in err


# ---------------------------------------------------------------- Figure 2: the masking sweep


def test_mask_sweep_runs_fairseq_generate(mask_script, capsys, fine_checkpoint, tiny_data_bin, tmp_path):
    png, out_json, outputs = tmp_path / "fig2.png", tmp_path / "mask.json", tmp_path / "outputs"
    code, out, err = run_script(mask_script, capsys, "--data", tiny_data_bin, "--path", fine_checkpoint,
                                "--beam", 4, "--lenpen", 1.0, "--jobs", 2, "--out", png, "--json", out_json,
                                "--keep-outputs", outputs, "--batch-size", 16)
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    result = json.loads(out_json.read_text())
    rows = result["rows"]
    assert [row["masked"] for row in rows] == ["none", "Emb", "1", "2"]
    assert [row["layer"] for row in rows] == [None, 0, 1, 2]
    for row in rows:
        for key in ("bleu", "sacrebleu", "avg_len", "avg_score"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (row["masked"], key)
        assert row["sentences"] == 12  # the whole test subset, none dropped by batching
        command = row["command"]
        generate = python_module_command("fairseq_cli.generate")
        assert command[:len(generate)] == generate and "--batch-size" in command
        assert command[command.index("--beam") + 1] == "4" and command[command.index("--lenpen") + 1] == "1.0"
        overrides = ast.literal_eval(command[command.index("--model-overrides") + 1])
        assert overrides == {"mask_encoder_layer": row["layer"]}
    base = rows[0]
    for row in rows[1:]:
        assert row["len_change_pct"] == pytest.approx(100 * (row["avg_len"] - base["avg_len"]) / base["avg_len"])
        if base["bleu"]:
            assert row["bleu_change_pct"] == pytest.approx(100 * (row["bleu"] - base["bleu"]) / base["bleu"])
        else:
            assert row["bleu_change_pct"] is None
        # the override took effect: the masked model scores its hypotheses differently
        assert row["avg_score"] != pytest.approx(base["avg_score"], abs=1e-6), row["masked"]

    # the numbers come from fairseq-generate's own output
    with open(outputs / "generate-none.txt") as handle:
        text = handle.read()
    assert f"BLEU4 = {base['bleu']:.2f}" in text
    hypotheses = [line.split("\t") for line in text.splitlines() if line.startswith("H-")]
    assert base["avg_len"] == pytest.approx(sum(len(h[2].split()) for h in hypotheses) / len(hypotheses))
    assert "masked" in out and "BLEU4 line" in out and "none" in out

    # the same override through the Python API gives a model with that layer masked
    for row in rows:
        overrides = ast.literal_eval(row["command"][row["command"].index("--model-overrides") + 1])
        model, _ = load_checkpoint(fine_checkpoint, tiny_data_bin, **overrides)
        assert model.decoder.layer_attention.masked_layer == row["layer"]


def test_mask_bad_layer_index(mask_script, capsys, fine_checkpoint, vanilla_checkpoint, tiny_data_bin, tmp_path):
    for bad in (3, -1):
        code, _, err = run_script(mask_script, capsys, "--data", tiny_data_bin, "--path", fine_checkpoint,
                                  "--layers", bad, "--out", tmp_path / "fig.png")
        assert code == 2 and MASK_ERROR.format(bad) in err
    assert not (tmp_path / "fig.png").exists()
    # the same message the model gives at build time (what fairseq-generate would fail with)
    with pytest.raises(ValueError, match=MASK_ERROR.format(3).replace("(", r"\(").replace(")", r"\)")):
        load_checkpoint(fine_checkpoint, tiny_data_bin, mask_encoder_layer=3)

    code, _, err = run_script(mask_script, capsys, "--data", tiny_data_bin, "--path", fine_checkpoint, "--layers", "x")
    assert code == 2 and "--layers x" in err
    code, _, err = run_script(mask_script, capsys, "--data", tiny_data_bin, "--path", vanilla_checkpoint)
    assert code == 2 and "--layer-attention none" in err and "no layer-attention weight to mask" in err
    with pytest.raises(SystemExit):
        mask_script.parse_args(["--data", tiny_data_bin, "--path", fine_checkpoint, "--quiet"])


@pytest.mark.parametrize("flag", [["--score-reference"], ["--sampling"], ["--prefix-size", "1"], ["--match-source-len"]])
def test_masking_refuses_generation_flags_that_leave_beam_search(mask_script, capsys, flag):
    """Figure 2 measures what masking a layer does to the beam search's translations: with
    --score-reference it printed a table of 100 BLEU for every mask."""
    with pytest.raises(SystemExit) as exit:
        mask_script.parse_args(["--data", "data-bin", "--path", "model.pt", *flag])
    assert exit.value.code == 2
    assert f"error: {flag[0]} cannot be passed to fairseq-generate here: " in capsys.readouterr().err


# ------------------------------------------------------------ Figures 3-4 and Table 3: embeddings


def test_spectrum(embedding_script, capsys, fine_checkpoint, shared_checkpoint, tiny_data_bin, joined_dict_dir,
                  tmp_path):
    png, out_json = tmp_path / "spectrum.png", tmp_path / "spectrum.json"
    # two checkpoints overlaid; each is loaded with the data directory stored in it (no --data)
    code, out, err = run_script(embedding_script, capsys, "spectrum", "--path", fine_checkpoint, "--label", "fine",
                                "--path", shared_checkpoint, "--label", "shared", "--out", png, "--json", out_json)
    assert code == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)
    curves = json.loads(out_json.read_text())["curves"]
    assert [(c["label"], c["matrix"]) for c in curves] == [
        ("fine", "encoder"), ("fine", "decoder"), ("fine", "output"), ("shared", "encoder=decoder=output")]

    fine_model, _ = load_checkpoint(fine_checkpoint, tiny_data_bin)
    shared_model, _ = load_checkpoint(shared_checkpoint, joined_dict_dir)
    matrices = [fine_model.encoder.embed_tokens.weight, fine_model.decoder.embed_tokens.weight,
                fine_model.decoder.output_projection.weight, shared_model.encoder.embed_tokens.weight]
    for curve, matrix in zip(curves, matrices):
        values = torch.tensor(curve["normalized"], dtype=torch.float64)
        assert values[0] == 1.0
        assert torch.all(values > 0) and torch.all(values <= 1)
        assert torch.all(values[1:] <= values[:-1])  # sorted, largest first
        direct = torch.linalg.svdvals(matrix.detach().double())
        assert torch.allclose(values, direct / direct.max(), atol=1e-9)
        assert curve["k"] == min(matrix.shape) == 16 and curve["shape"] == list(matrix.shape)
        assert curve["auc"] == pytest.approx(float(values.mean()))
        below = [i + 1 for i, v in enumerate(values.tolist()) if v < 0.1]
        assert curve["index_below"] == (below[0] if below else None)
        assert curve["min"] == pytest.approx(float(values[-1]))
    assert "auc" in out and "encoder=decoder=output" in out


def test_spectrum_split_by_attention(embedding_script, capsys, fine_checkpoint, coarse_checkpoint, tiny_data_bin,
                                     tmp_path):
    out_json = tmp_path / "split.json"
    code, _, err = run_script(embedding_script, capsys, "spectrum", "--path", fine_checkpoint, "--data", tiny_data_bin,
                              "--split-by-attention", "--x-axis", "fraction", "--out", tmp_path / "fig3.png",
                              "--json", out_json)
    assert code == 0, err
    curves = json.loads(out_json.read_text())["curves"]
    assert [c["matrix"] for c in curves] == ["more attended (w[2,Emb,d])", "less attended (w[2,Emb,d])", "random dims"]
    model, _ = load_checkpoint(fine_checkpoint, tiny_data_bin)
    top_to_emb = weights_of(model)[-1, 0]  # w[M, 0, d]
    order = torch.argsort(top_to_emb, descending=True, stable=True)
    assert curves[0]["dims"] == order[:8].tolist() and curves[1]["dims"] == order[8:].tolist()
    assert min(top_to_emb[curves[0]["dims"]]) >= max(top_to_emb[curves[1]["dims"]])
    assert len(curves[2]["dims"]) == 8
    embedding = model.encoder.embed_tokens.weight.detach().double()
    for curve in curves:
        direct = torch.linalg.svdvals(embedding[:, curve["dims"]])
        assert torch.allclose(torch.tensor(curve["normalized"], dtype=torch.float64), direct / direct[0], atol=1e-9)

    code, _, err = run_script(embedding_script, capsys, "spectrum", "--path", coarse_checkpoint, "--data",
                              tiny_data_bin, "--split-by-attention", "--out", tmp_path / "x.png")
    assert code == 2 and "--split-by-attention" in err and "--layer-attention coarse" in err
    code, _, err = run_script(embedding_script, capsys, "spectrum", "--path", fine_checkpoint, "--data", tiny_data_bin,
                              "--which", "encoder,bogus", "--out", tmp_path / "x.png")
    assert code == 2 and "--which" in err and "'bogus'" in err


def direct_cosines(source, target, src_dict, tgt_dict, pairs):
    return [float(F.cosine_similarity(source[src_dict.index(s)], target[tgt_dict.index(t)], dim=0))
            for s, t in pairs]


def test_cosine_separate_embeddings(embedding_script, capsys, fine_checkpoint, tiny_data_bin, tmp_path):
    bilingual = tmp_path / "dict.txt"
    bilingual.write_text("# source target\nw3 W3\nw5 W5\n\nw3 W3\nw7 W9\nnosuch W3\nw9 NOSUCH\nw11 W11\n")
    out_json = tmp_path / "cosine.json"
    code, out, err = run_script(embedding_script, capsys, "cosine", "--path", fine_checkpoint, "--data", tiny_data_bin,
                                "--dict", bilingual, "--json", out_json)
    assert code == 0, err
    row = json.loads(out_json.read_text())["rows"][0]
    used = [("w3", "W3"), ("w5", "W5"), ("w7", "W9"), ("w11", "W11")]
    assert row["pairs"] == 6 and row["used"] == 4 and row["skipped"] == 2  # the repeated pair counts once
    assert row["source_oov"] == 1 and row["target_oov"] == 1 and row["shared_embeddings"] is False
    model, task = load_checkpoint(fine_checkpoint, tiny_data_bin)
    direct = direct_cosines(model.encoder.embed_tokens.weight.detach(), model.decoder.embed_tokens.weight.detach(),
                            task.source_dictionary, task.target_dictionary, used)
    assert row["all"] == pytest.approx(sum(direct) / len(direct), abs=1e-6)
    assert row["non_shared"] == pytest.approx(row["all"]) and row["non_shared_used"] == 4  # all pairs differ
    assert "skipped 2 of 6 pairs" in out

    # the output projection as the target side
    code, _, err = run_script(embedding_script, capsys, "cosine", "--path", fine_checkpoint, "--data", tiny_data_bin,
                              "--dict", bilingual, "--target-embedding", "output", "--json", out_json, "--force")
    assert code == 0, err
    row = json.loads(out_json.read_text())["rows"][0]
    direct = direct_cosines(model.encoder.embed_tokens.weight.detach(),
                            model.decoder.output_projection.weight.detach(),
                            task.source_dictionary, task.target_dictionary, used)
    assert row["all"] == pytest.approx(sum(direct) / len(direct), abs=1e-6)


def test_cosine_shared_embeddings(embedding_script, capsys, shared_checkpoint, joined_dict_dir, tmp_path):
    bilingual = tmp_path / "dict.txt"
    bilingual.write_text("w3 W3\nw5 w5\nw7 W7\nW2 W2\nw8 nosuch\n")
    out_json = tmp_path / "cosine.json"
    code, out, err = run_script(embedding_script, capsys, "cosine", "--path", shared_checkpoint, "--data",
                                joined_dict_dir, "--dict", bilingual, "--json", out_json)
    assert code == 0, err
    row = json.loads(out_json.read_text())["rows"][0]
    assert row["shared_embeddings"] is True and row["joined_dictionary"] is True
    assert row["used"] == 4 and row["skipped"] == 1 and row["non_shared_used"] == 2
    model, task = load_checkpoint(shared_checkpoint, joined_dict_dir)
    matrix = model.encoder.embed_tokens.weight.detach()
    assert model.decoder.embed_tokens.weight is model.encoder.embed_tokens.weight
    used = [("w3", "W3"), ("w5", "w5"), ("w7", "W7"), ("W2", "W2")]
    direct = direct_cosines(matrix, matrix, task.source_dictionary, task.target_dictionary, used)
    assert direct[1] == pytest.approx(1.0) and direct[3] == pytest.approx(1.0)  # the same row of one matrix
    assert row["all"] == pytest.approx(sum(direct) / 4, abs=1e-6)
    assert row["non_shared"] == pytest.approx((direct[0] + direct[2]) / 2, abs=1e-6)
    assert "shared" in out


def test_cosine_bad_dictionary(embedding_script, capsys, fine_checkpoint, tiny_data_bin, tmp_path):
    bilingual = tmp_path / "dict.txt"
    bilingual.write_text("w3 W3\nw5 W5 extra\n")
    code, _, err = run_script(embedding_script, capsys, "cosine", "--path", fine_checkpoint, "--data", tiny_data_bin,
                              "--dict", bilingual)
    assert code == 2 and f"--dict {bilingual}, line 2" in err
    bilingual.write_text("nosuch NOSUCH\n")
    code, _, err = run_script(embedding_script, capsys, "cosine", "--path", fine_checkpoint, "--data", tiny_data_bin,
                              "--dict", bilingual)
    assert code == 2 and "none of its 1 pairs" in err


# ------------------------------------------------------------------------------ the recipe


@pytest.mark.parametrize("variant, expected", [
    ("vanilla", {"arch": "transformer_wmt_en_de"}),
    ("coarse", {"arch": "fgla_wmt_en_ro", "layer_attention": "coarse", "layer_attention_dropconnect": 0.3}),
    ("fgla", {"arch": "fgla_wmt_en_ro", "layer_attention": "fine", "layer_attention_dropconnect": 0.3}),
    ("hard", {"arch": "surface_fusion_wmt_en_ro", "surface_fusion": "hard", "surface_fusion_lambda": 0.8,
              "surface_fusion_tau": 1.0}),
    ("soft", {"arch": "surface_fusion_wmt_en_ro", "surface_fusion": "soft", "surface_fusion_tau": 5.0}),
])
def test_recipe_commands_parse_with_the_paper_settings(variant, expected, tmp_path):
    """examples/surface_fusion/train.sh --dry-run prints a fairseq-train command that fairseq's own
    parser accepts, with Appendix Table 4's Ro-En settings (Base, dropout 0.3, 16K tokens, 60K steps)."""
    import shlex
    import subprocess

    from fairseq import options

    script = os.path.join(REPO_ROOT, "examples", "surface_fusion", "train.sh")
    result = subprocess.run(["bash", script, str(tmp_path), variant, "--dry-run", "--gpus", "2",
                             "--user-dir", USER_DIR],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[0] == "fairseq-train" and argv[argv.index("--user-dir") + 1] == USER_DIR
    args = options.parse_args_and_arch(options.get_training_parser(), argv[1:])
    for key, value in expected.items():
        assert getattr(args, key) == value, key
    assert (args.encoder_layers, args.decoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim) == \
        (6, 6, 512, 2048)
    assert args.dropout == 0.3 and args.share_all_embeddings and args.max_update == 60000
    assert args.max_tokens * 2 * args.update_freq[0] == 16384  # 2 GPUs
    assert args.label_smoothing == 0.1 and args.best_checkpoint_metric == "nll_loss"

    bad = subprocess.run(["bash", script, str(tmp_path), "bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown VARIANT 'bogus'" in bad.stderr

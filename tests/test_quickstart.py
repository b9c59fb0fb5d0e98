"""The main job (``fusion_lab.quickstart``): a tiny-budget run of the whole pipeline on the
synthetic corpus and on the output of ``corpus prepare`` (a Multi30k-shaped slice)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import MULTI30K_SLICE, REPO_ROOT, write_multi30k_slice
from fusion_lab import corpus, quickstart

# A tiny budget: small model, a few updates; the table must still be complete.
TINY = [
    "--max-update", "12", "--max-tokens", "1500", "--layers", "1", "--embed-dim", "32", "--ffn-dim", "64",
    "--heads", "2", "--bpe-merges", "300", "--log-interval", "5", "--threads", "1",
]


def run_quickstart(*args, timeout=900):
    result = subprocess.run(
        [sys.executable, "-m", "fusion_lab.quickstart", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, f"quickstart failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


def parse_table(stdout):
    """{model: (method, bleu, params, train tok/s, decode sent/s)} from the printed table."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert lines, stdout
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == list(quickstart.TABLE_COLUMNS)
    rows = {}
    for line in lines[1:]:
        model, method, bleu, params, wps, sps = [cell.strip() for cell in line.strip("|").split("|")]
        rows[model] = (method, float(bleu), int(params.replace(",", "")), float(wps.replace(",", "")), float(sps))
    return rows


def assert_complete_row(row):
    arch, bleu, params, wps, sps = row
    assert 0.0 <= bleu <= 100.0
    assert params > 0 and wps > 0 and sps > 0


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("qs") / "out"
    stdout = run_quickstart("--out", out, "--train-size", 300, "--valid-size", 20, "--test-size", 12, *TINY)
    (out / "my-notes.txt").write_text("user data\n")  # the user's, in quickstart's folder
    return out, stdout


@pytest.mark.slow
def test_synthetic_smoke_run_prints_both_models(synthetic_run):
    out, stdout = synthetic_run
    for header in ("[1/5] data: synthetic corpus", "[2/5] joint BPE", "[3/5] fairseq-preprocess",
                   "[4/5] fairseq-train transformer and mlrf", "[5/5] fairseq-generate"):
        assert header in stdout
    for name in ("transformer", "mlrf"):  # progress and results of each model
        assert f"[{name}] update 5/12" in stdout and f"[{name}] scores -> " in stdout
    # scored as corpus evaluate scores: sacreBLEU against the raw reference, and tokenised BLEU
    assert stdout.count(f"sacreBLEU (detokenized, case-sensitive) vs {out}/raw/test.tgt: BLEU = ") == 2
    rows = parse_table(stdout)
    assert set(rows) == {"transformer", "mlrf"}
    for row in rows.values():
        assert_complete_row(row)
    assert rows["transformer"][0] == "fairseq's Transformer" and rows["mlrf"][0] == "MLRF Both-FNN-SA"
    # the fusion layers add parameters on top of the same Transformer
    assert rows["mlrf"][2] > rows["transformer"][2]
    saved = json.loads((out / "results.json").read_text())
    assert [m["model"] for m in saved["models"]] == ["transformer", "mlrf"]
    assert saved["models"][1]["params"] == rows["mlrf"][2]
    assert saved["models"][1]["scores"]["sacrebleu"] == rows["mlrf"][1]
    assert (out / "results.md").read_text().strip() == "\n".join(l for l in stdout.splitlines() if l.startswith("|"))
    # one hypothesis per test sentence was scored
    with open(out / "logs" / "generate-mlrf" / "generate-test.txt") as f:
        assert sum(line.startswith("D-") for line in f) == 12
    # the MLRF model really was the Both-FNN-SA fusion transformer
    log = (out / "logs" / "train-mlrf.log").read_text()
    assert "--fuse-encoder fnn --fuse-decoder sa" in log and "FusionTransformer" in log


@pytest.mark.slow
def test_rerun_keeps_user_files_and_starts_training_afresh(synthetic_run):
    out, _ = synthetic_run
    stdout = run_quickstart("--out", out, "--train-size", 300, "--valid-size", 20, "--test-size", 12,
                            "--models", "transformer", *TINY)
    assert set(parse_table(stdout)) == {"transformer"}
    assert (out / "my-notes.txt").read_text() == "user data\n"
    log = (out / "logs" / "train-transformer.log").read_text()
    assert "No existing checkpoint found" in log and "Loaded checkpoint" not in log


@pytest.fixture(scope="module")
def prepared_multi30k(tmp_path_factory):
    """A Multi30k-shaped slice through ``corpus prepare multi30k``: the folder --data takes."""
    root = tmp_path_factory.mktemp("m30k")
    write_multi30k_slice(root / "raw")
    corpus.main(["prepare", "multi30k", "--from", str(root / "raw"), "--dest", str(root / "dest"), "--workers", "1",
                 "--bpe-merges", "300"])
    return root / "dest"


@pytest.mark.slow
def test_corpus_prepare_output_is_trained_on_and_scored_as_corpus_evaluate_scores(prepared_multi30k, tmp_path):
    dest, out = prepared_multi30k, tmp_path / "out"
    before = sorted(os.listdir(dest)), sorted(os.listdir(dest / "data-bin"))
    stdout = run_quickstart("--data", dest, "--out", out, "--models", "mlrf", *TINY)
    assert f"[1/5] data: {dest}/data-bin (de -> en), BPE'd and binarised by corpus prepare" in stdout
    assert "[2/5]" not in stdout and "[3/5]" not in stdout and not (out / "data-bin").exists()
    rows = parse_table(stdout)
    assert set(rows) == {"mlrf"}
    assert_complete_row(rows["mlrf"])
    # every test sentence scored against the references corpus prepare recorded, in its case (lowercased)
    results = out / "logs" / "generate-mlrf"
    with open(results / "generate-test.txt") as f:
        assert sum(line.startswith("D-") for line in f) == MULTI30K_SLICE["test_2016_flickr"]
    scores = json.loads((results / "scores.json").read_text())
    assert scores["reference"] == str(dest / "raw" / "test.en") and scores["case_insensitive"]
    assert scores["tokenized_reference"] == str(dest / "tok" / "test.en")
    assert scores["sacrebleu"] == rows["mlrf"][1]
    assert f"sacreBLEU (detokenized, case-insensitive) vs {dest}/raw/test.en: BLEU = " in stdout
    assert (sorted(os.listdir(dest)), sorted(os.listdir(dest / "data-bin"))) == before  # only read
    # one checkpoint, one score: corpus evaluate decodes it as the quickstart did (an untrained model's
    # hypotheses run into any length limit that one of them sets and the other does not)
    corpus.main(["evaluate", str(dest / "data-bin"), str(out / "checkpoints" / "mlrf" / "checkpoint_best.pt"),
                 "--out", str(tmp_path / "evaluated")])
    evaluated = json.loads((tmp_path / "evaluated" / "scores.json").read_text())
    assert (evaluated["sacrebleu"], evaluated["tokenized_bleu"]) == (scores["sacrebleu"], scores["tokenized_bleu"])
    assert (tmp_path / "evaluated" / "hyp.detok").read_text() == (results / "hyp.detok").read_text()


def test_the_synthetic_corpus_flags_beside_data_are_warned_about(tmp_path, capsys):
    with pytest.raises(SystemExit):  # the folder is no corpus prepare output: refused after the warning
        quickstart.main(["--data", str(tmp_path / "prepared"), "--out", str(tmp_path / "o"), "--bpe-merges", "500",
                         "--train-size", "12000"])
    assert ("warning: flag without effect: --bpe-merges 500: only the synthetic corpus reads it, and --data "
            f"{tmp_path / 'prepared'} gives the corpus") in capsys.readouterr().err


def test_data_that_is_the_out_folder_is_refused_before_any_work(tmp_path):
    """Its corpus folder's stamp would be replaced by the quickstart's, its checkpoints written beside the corpus."""
    data = tmp_path / "prepared"
    (data / "data-bin").mkdir(parents=True)
    (data / ".written_by").write_text("fusion-fairseq corpus prepare\n")
    (tmp_path / "link").symlink_to(data)
    with pytest.raises(SystemExit) as error:
        quickstart.main(["--data", str(data), "--out", str(tmp_path / "link"), "--force"])
    assert str(error.value.code) == (f"fusion-fairseq-quickstart: error: --data {data} is --out {tmp_path / 'link'} "
                                     "(through links): the quickstart writes its checkpoints, logs and stamp there; "
                                     "give another --out")
    assert (data / ".written_by").read_text() == "fusion-fairseq corpus prepare\n"


@pytest.mark.parametrize("what", ["raw text", "missing", "recipe without references"])
def test_data_that_corpus_prepare_did_not_make_is_refused_before_any_work(tmp_path, what):
    data = tmp_path / "data"
    if what == "raw text":  # parallel text that corpus prepare has not made into data-bin
        write_multi30k_slice(data)
    elif what == "recipe without references":
        (data / "data-bin").mkdir(parents=True)
        (data / "data-bin" / "recipe.env").write_text(f"SRC=de\nTGT=en\nRAW_REF_test={tmp_path}/gone.en\n")
    with pytest.raises(SystemExit) as error:
        quickstart.main(["--data", str(data), "--out", str(tmp_path / "o")])
    message = str(error.value.code)
    assert message.startswith(f"error: --data {data}: expected the --dest folder of `python -m "
                              "fusion_lab.corpus prepare`") and "\n" not in message
    assert "corpus prepare text --from DIR --src L --tgt L --dest OUT" in message
    assert not (tmp_path / "o").exists()


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="--models"):
        quickstart.main(["--models", "lstm", "--out", str(tmp_path / "o")])
    # twice: two trainings at once in one checkpoint folder, each removing the other's checkpoints
    with pytest.raises(SystemExit, match="^error: --models transformer,mlrf,transformer: transformer given twice; "):
        quickstart.main(["--models", "transformer,mlrf,transformer", "--out", str(tmp_path / "o")])
    assert os.listdir(tmp_path) == []


def test_train_progress_reads_fairseq_json_logs():
    progress = quickstart.TrainProgress("m", 100, verbose=False)
    progress("2024-01-01 00:00:00 | INFO | fairseq_cli.train | num. shared model params: 1,234 (num. trained: 1,234)")
    progress('2024-01-01 | INFO | train | {"epoch": 1, "train_wps": "1000", "train_wpb": "500", "train_num_updates": "10"}')
    progress('2024-01-01 | INFO | train | {"epoch": 2, "train_wps": "3000", "train_wpb": "600", "train_num_updates": "20"}')
    assert progress.params == 1234
    # 5000 tokens in 5 s, then 6000 tokens in 2 s
    assert progress.train_tokens_per_second() == pytest.approx(11000 / 7)


def test_table_format():
    table = quickstart.format_table([
        {"model": "transformer", "description": "fairseq's Transformer", "bleu": 12.345, "params": 1234567, "train_wps": 4321.9, "decode_sps": 12.34},
        {"model": "mlrf", "description": "MLRF Both-FNN-SA", "bleu": None, "params": None, "train_wps": None, "decode_sps": None},
    ])
    lines = table.splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1
    assert [c.strip() for c in lines[2].strip("|").split("|")] == ["transformer", "fairseq's Transformer", "12.35", "1,234,567", "4,322", "12.3"]
    assert "n/a" in lines[3]


# ---- the encoder-layer-fusion analyses on a quickstart checkpoint ------------------------------
ANALYSES = os.path.join(REPO_ROOT, "examples", "surface_fusion", "analyses.sh")


@pytest.fixture(scope="module")
def layer_fusion_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("qs_layer_fusion") / "out"
    run_quickstart("--out", out, "--models", "fgla,surface_fusion", "--train-size", 300, "--valid-size", 20,
                   "--test-size", 12, *TINY)
    return out


@pytest.mark.slow
def test_layer_fusion_analyses_run_on_a_quickstart_checkpoint(layer_fusion_run):
    out = layer_fusion_run
    result = subprocess.run(["bash", ANALYSES, str(out)], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = out / "analyses"
    for name in ("fig1_layer_attention", "fig2_masking", "fig3_attended_dims", "fig4_spectrum"):
        assert (figures / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name
    # Figure 1: one row per decoder layer (TINY: 1), columns Emb and the encoder layer, rows sum to 1
    fig1 = json.loads((figures / "fig1_layer_attention.json").read_text())
    assert fig1["encoder_labels"] == ["Emb", "1"] and len(fig1["weights"]) == 1
    assert sum(fig1["weights"][0]) == pytest.approx(1.0, abs=1e-5)
    # Figure 2: unmasked, then each encoder layer masked, every test sentence translated
    fig2 = json.loads((figures / "fig2_masking.json").read_text())
    assert [row["masked"] for row in fig2["rows"]] == ["none", "Emb", "1"]
    assert all(row["sentences"] == 12 for row in fig2["rows"])
    # Figure 4 and Table 3 cover both trained models; the synthetic dictionary has usable pairs
    fig4 = json.loads((figures / "fig4_spectrum.json").read_text())
    assert {curve["label"] for curve in fig4["curves"]} == {"fgla", "surface_fusion"}
    table3 = json.loads((figures / "table3_cosine.json").read_text())
    assert table3["dict"] == str(out / "raw" / "dict.src-tgt.txt")
    assert [row["label"] for row in table3["rows"]] == ["fgla", "surface_fusion"]
    assert all(row["used"] > 0 and -1 <= row["all"] <= 1 for row in table3["rows"])


def test_layer_fusion_analyses_need_a_layer_attention_checkpoint(tmp_path):
    result = subprocess.run(["bash", ANALYSES, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert f"{tmp_path}/checkpoints/fgla/checkpoint_best.pt not found" in result.stderr
    assert "--models transformer,fgla,surface_fusion" in result.stderr


def test_layer_fusion_analyses_read_the_data_a_run_on_prepared_data_names(tmp_path):
    """A quickstart run with --data DIR has no data-bin of its own: DATA names it."""
    (tmp_path / "checkpoints" / "fgla").mkdir(parents=True)
    (tmp_path / "checkpoints" / "fgla" / "checkpoint_best.pt").write_bytes(b"")
    result = subprocess.run(["bash", ANALYSES, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "(one trained with --data DIR: pass DATA=DIR/data-bin)" in result.stderr
    (tmp_path / "prepared" / "data-bin").mkdir(parents=True)
    result = subprocess.run(["bash", ANALYSES, str(tmp_path), str(tmp_path / "figures")], capture_output=True,
                            text=True, env={**os.environ, "DATA": str(tmp_path / "prepared" / "data-bin")})
    assert "not found" not in result.stderr and (tmp_path / "figures").is_dir()  # it went on to the checkpoints


def test_outputs_linked_elsewhere_are_replaced_not_written_through(tmp_path):
    """The synthetic corpus, its BPE'd text and codes: an output that is a link to a user's file is replaced."""
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    (out / "bpe").mkdir()
    (out / "logs").mkdir()
    (tmp_path / "mine").write_text("my file\n")
    for output in ("raw/train.src", "bpe/test.tgt", "bpe/codes"):
        (out / output).symlink_to(tmp_path / "mine")
    args = quickstart.build_parser().parse_args(["--train-size", "20", "--valid-size", "5", "--test-size", "5"])
    dirs = SimpleNamespace(**{name: str(out / name) for name in ("raw", "bpe", "logs")}, bin=str(out / "data-bin"))
    recipe = quickstart.prepare_synthetic(args, dirs)
    assert (tmp_path / "mine").read_text() == "my file\n"
    assert not any(os.path.islink(out / output) for output in ("raw/train.src", "bpe/test.tgt", "bpe/codes"))
    assert len((out / "raw" / "train.src").read_text().splitlines()) == 20
    assert recipe == {"SRC": "src", "TGT": "tgt", "RAW_REF_test": str(out / "raw" / "test.tgt"),
                      "TOK_REF_test": str(out / "raw" / "test.tgt")}


@pytest.mark.parametrize("texts", [("a\n", "b\n"), ("jedes\n", "once\n")])
def test_training_text_without_merges_keeps_its_words(tmp_path, texts):
    """No pair to merge, or none twice: subword-nmt failed (max() of nothing; exit 1 on codes without merges)."""
    text = {split: {lang: [line.strip()] for lang, line in zip(("de", "en"), texts)} for split in ("train", "valid", "test")}
    bpe = corpus.learn_and_apply_bpe(text, "de", "en", 100, str(tmp_path / "codes"))
    assert bpe["test"]["en"] == [texts[1].strip()]


@pytest.mark.parametrize("flag", ["--fusion-attn-dim", "--fusion-ffn-dim", "--fusion-hops"])
def test_mlrf_flags_without_mlrf_are_warned_about_and_bad_values_refused(tmp_path, capsys, flag):
    args = quickstart.build_parser().parse_args(["--models", "transformer,fgla", flag, "64"])
    assert quickstart.check_args(args) == ["transformer", "fgla"]
    assert capsys.readouterr().err.strip() == f"warning: flag without effect: {flag} 64: only the mlrf model reads " \
        "it, and --models is transformer,fgla"
    quickstart.check_args(quickstart.build_parser().parse_args([flag, "64"]))
    assert capsys.readouterr().err == ""
    for value in ("0", "-3"):  # 0 was taken for the default
        with pytest.raises(SystemExit):
            quickstart.build_parser().parse_args([flag, value])
        assert f"argument {flag}: must be a positive integer, got '{value}'" in capsys.readouterr().err


def test_mlrf_flags_reach_fairseq_with_their_defaults():
    """A flag given reaches fairseq; those left out take fusion_transformer's defaults (4 hops, da = 4d)."""
    from model_building import build_model

    args = quickstart.build_parser().parse_args(["--embed-dim", "32", "--fusion-ffn-dim", "40"])
    quickstart.check_args(args)
    flags = quickstart.model_flags(args, "mlrf")
    assert flags[flags.index("--fusion-ffn-dim") + 1] == "40" and "--fusion-hops" not in flags
    user_dir = flags.index("--user-dir")
    model = build_model("fusion_transformer", *flags[2:user_dir], *flags[user_dir + 2:], src_vocab=50, joined=True)
    assert (model.args.fusion_hops, model.args.fusion_attn_dim, model.args.fusion_ffn_dim) == (4, 128, 40)


@pytest.mark.parametrize("flag,value,allowed", [
    ("--dropout", "nan", "must be in [0, 1)"),
    ("--dropout", "1", "must be in [0, 1)"),
    ("--lr", "-1", "must be > 0"),
    ("--lr", "nan", "must be > 0"),
    ("--lr", "0", "must be > 0"),
    ("--log-interval", "-1", "must be an integer >= 0"),
    ("--train-size", "0", "must be a positive integer"),
    ("--valid-size", "0", "must be a positive integer"),
    ("--test-size", "-3", "must be a positive integer"),
    ("--warmup-updates", "-1", "must be a positive integer"),
    ("--warmup-updates", "0", "must be a positive integer"),  # fairseq's inverse_sqrt divides by it
    ("--seed", "-1", "must be an integer in [0, 2**32 - 1]"),
    ("--seed", str(2**32), "must be an integer in [0, 2**32 - 1]"),
    ("--lexicon-seed", "x", "must be an integer"),
])
def test_every_value_is_range_checked_in_one_line(tmp_path, capsys, flag, value, allowed):
    """Out-of-range values were taken (a NaN dropout, a negative learning rate trained) or crashed late (fairseq's
    numpy seed, its warm-up division, an empty training split): each is refused by the parser, before any work."""
    with pytest.raises(SystemExit) as error:
        quickstart.build_parser().parse_args([flag, value, "--out", str(tmp_path / "o")])
    assert error.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fusion-fairseq-quickstart: error: argument {flag}: {allowed}, got '{value}'"]


def test_values_at_the_ends_of_their_ranges_are_taken():
    args = quickstart.build_parser().parse_args(["--dropout", "0", "--lr", "1e-9", "--log-interval", "0", "--seed", "0",
                                                 "--train-size", "1", "--warmup-updates", "1", "--lexicon-seed", "-5"])
    assert (args.dropout, args.lr, args.log_interval, args.seed, args.train_size, args.lexicon_seed) == (
        0.0, 1e-9, 0, 0, 1, -5)
    assert quickstart.build_parser().parse_args(["--seed", str(2**32 - 1)]).seed == 2**32 - 1

"""scripts/compare_methods.py (fusion_lab.comparison and comparison_report): a smoke run of the whole
pipeline on a tiny slice of Multi30k (2 methods, the grid of learning rates on seed 1, seed 2 at the chosen
rates, then the longer budget; 4 and 8 updates at a tiny width), the report's numbers, resuming without
retraining, the launchers, and the errors."""

import fcntl
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from conftest import MULTI30K_SLICE, REPO_ROOT, write_multi30k_slice
from fusion_lab import comparison
from fusion_lab import comparison_report as report
from fusion_lab.comparison import METHODS, Width, main, match_parameter, parse_width
from fusion_lab.comparison_report import summarise

METHODS_UNDER_TEST = ["transformer", "surface_fusion"]
SEEDS = [1, 2]


def _argv(raw, out, methods=None):
    return ["--raw", raw, "--out", out, "--methods", ",".join(methods or METHODS_UNDER_TEST),
            "--seeds", *map(str, SEEDS), "--width", "1+1:16:32:2", "--max-update", "4", "--eval-every", "2",
            "--warmup", "2", "--max-tokens", "512", "--bpe-merges", "200", "--device", "cpu", "--jobs", "2",
            "--threads", "1", "--cpu-kind", "", "--gen-args", "--max-len-a 0 --max-len-b 12"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The whole design; the verdicts at the chosen rates made "better" so that stage 3 trains SurfaceFusion too
    (4 updates cannot tell two configurations apart)."""
    from fusion_lab import seed_analysis

    root = tmp_path_factory.mktemp("comparison")
    raw, out = str(root / "raw"), str(root / "out")
    write_multi30k_slice(raw)
    real = seed_analysis.compare_with_baselines

    def all_decided(runs, baselines, **kwargs):
        found = real(runs, baselines, **kwargs)
        if any("@8" in name for name in runs):
            return found
        return {name: dict(row, verdict="better") for name, row in found.items()}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(seed_analysis, "compare_with_baselines", all_decided)
        results = main(_argv(raw, out))
    return raw, out, results


def _rows(results):
    return {row["method"]: row for row in results["methods"]}


def _budget(name):
    return 8 if name.endswith("@8") else 4


def _done(out, method, seed):
    with open(os.path.join(out, "runs", method, f"seed{seed}", "done.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_every_run_has_numeric_bleu_and_params(smoke):
    _, out, results = smoke
    with open(os.path.join(out, "results.json")) as f:
        stored = json.load(f)
    rows = _rows(stored)
    assert {"transformer", "surface_fusion", "transformer@lr0.0005", "surface_fusion@lr0.002"} <= set(rows)
    for row in rows.values():
        assert isinstance(row["params"], int) and row["params"] > 0
        for run in row["runs"]:
            assert run["status"] == "done"
            for key in ("sacrebleu", "tokenized_bleu"):
                assert isinstance(run[key], (int, float)) and 0 <= run[key] <= 100
            assert run["params"] == row["params"]  # fairseq's logged count == the plan's count
            assert run["updates"] == _budget(row["method"])
            assert run["curve"], "no validation points parsed from the log"
    # SurfaceFusion adds parameters to the same-width Transformer (its surface attention)
    assert rows["surface_fusion"]["params"] > rows["transformer"]["params"]
    assert stored["settings"]["max_update"] == 4 and stored["settings"]["seeds"] == SEEDS


@pytest.mark.slow
def test_mean_and_spread_by_hand(smoke):
    _, out, results = smoke
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        md = f.read()
    runs = [run for row in results["methods"] for run in row["runs"]]
    assert f"{len(runs)} of {len(runs)} runs done" in md
    paired_rows = [row for row in results["methods"] if len(row["runs"]) == 2]
    assert len(paired_rows) == 4  # each configuration at its chosen rate and at the longer budget
    for row in paired_rows:
        for key in ("sacrebleu", "tokenized_bleu"):
            values = [_done(out, row["method"], seed)[key] for seed in SEEDS]
            stats = row[key]
            assert stats["n"] == 2
            assert stats["mean"] == pytest.approx((values[0] + values[1]) / 2, abs=0.006)
            assert stats["std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5, abs=0.006)
            assert (stats["min"], stats["max"]) == (min(values), max(values))
        title = row["title"]
        summary = md.split("## Summary")[1].split("## ")[0]
        line = next(line for line in summary.splitlines() if line.startswith(f"| {title} |"))
        assert f"{row['params']:,}" in line and f"{row['test']['all']['mean']:.2f} ± " in line
        for seed in SEEDS:
            assert f"{_done(out, row['method'], seed)['scores']['average']['all']['sacrebleu']:.2f} (" in line
        every_set = md.split("## Every test set")[1].split("## ")[0]
        line = next(line for line in every_set.splitlines() if line.startswith(f"| {title} |"))
        assert line.endswith(f" {row['tokenized_bleu']['mean']:.2f} ± {row['tokenized_bleu']['std']:.2f} |")


@pytest.mark.slow
def test_four_test_sets_the_averaged_checkpoint_and_the_paired_difference(smoke):
    """Every run is scored on the four Multi30k test sets with the average of its last checkpoints; the
    report gives, per seed, sacreBLEU's paired bootstrap against the Transformer on the four sets together."""
    _, out, results = smoke
    done = _done(out, "surface_fusion", 1)
    assert set(done["scores"]) == {"average"}
    assert set(done["scores"]["average"]) == {*comparison.TEST_SETS, "all"}
    assert done["scores"]["average"]["all"]["sentences"] == sum(MULTI30K_SLICE[name] for name in comparison.TEST_SETS)
    assert done["averaged_updates"] == [2, 4]
    assert done["trained_by"] and "unknown" not in done["trained_by"] and done["evaluated_by"]
    rows = _rows(results)
    paired = rows["surface_fusion"]["runs"][0]["paired"]
    assert paired["difference"] == pytest.approx(paired["system"] - paired["baseline"], abs=0.011)
    assert paired["ci95"][0] <= paired["difference"] <= paired["ci95"][1]
    baseline_all = _done(out, "transformer", 1)["scores"]["average"]["all"]["sacrebleu"]
    assert paired["baseline"] == pytest.approx(baseline_all, abs=0.011)
    (name, found), = results["reviewed"]["verdicts"].items()  # SurfaceFusion at its chosen rate
    verdict = rows[name]["verdict"]
    assert name.startswith("surface_fusion") and verdict["verdict"] == found["verdict"]  # "better": the fixture's
    assert verdict["ci95"][0] <= verdict["difference"] <= verdict["ci95"][1]
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        md = f.read()
    line = next(line for line in md.split("## Runs")[1].splitlines() if line.startswith("| surface_fusion | 1 |"))
    assert f"{paired['difference']:+.2f} [{paired['ci95'][0]:+.2f}, {paired['ci95'][1]:+.2f}]" in line
    # no checkpoint but the scored average is kept
    assert [n for n in os.listdir(os.path.join(out, "runs", "surface_fusion", "seed1", "checkpoints"))
            if n.endswith(".pt")] == ["average-last5-to-4.pt"]


def test_paired_bootstrap_of_identical_and_better_systems():
    refs = [f"a man rides a horse number {i} ." for i in range(60)]
    worse = [f"a man rides number {i} ." for i in range(60)]
    same = report.paired_bootstrap(refs, worse, list(worse), lowercase=True)
    assert same["difference"] == 0 and same["ci95"] == [0, 0]
    better = report.paired_bootstrap(refs, worse, refs, lowercase=True)
    assert better["system"] == 100 and better["difference"] > 0 and better["ci95"][0] > 0
    assert better["p_value"] < 0.05 and "case:lc" in better["signature"]


def _evaluated_run(out, method, seed, hypotheses, references):
    """A run as the evaluation leaves it: done.json and, per test set, its hypotheses in the run's folder
    and the references (the same for every run of ``out``; written by the first) in ``out/test-sets``."""
    scores = {}
    rdir = out / "runs" / method / f"seed{seed}"
    for name in comparison.TEST_SETS:
        hyp, ref = rdir / "eval-beam5" / "average" / name / "hyp.detok", out / "test-sets" / name / "raw.en"
        for path, lines in ((hyp, hypotheses), (ref, references)):
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text("\n".join(lines) + "\n")
        scores[name] = {"sacrebleu": 30.0, "hyp_detok": str(hyp), "raw_ref": str(ref), "sentences": len(references)}
    scores["all"] = report.concatenated_bleu(scores, lowercase=True)
    done = {"sacrebleu": 30.0, "tokenized_bleu": 30.0, "params": 1, "updates": 4, "train_seconds": 1.0,
            "generate_seconds": 1.0, "updates_per_second": 4.0, "devices": [], "finished": "now",
            "sacrebleu_signature": "case:lc", "scores": {"average": scores}}
    (rdir / "done.json").write_text(json.dumps(done))


def test_each_run_reports_its_own_output_length_also_a_transformer_seed_no_method_has_yet(tmp_path):
    references = [f"a man rides a horse number {i} ." for i in range(20)]  # 8 tokens each
    _evaluated_run(tmp_path, "transformer", 1, [f"a man rides number {i} ." for i in range(20)], references)
    _evaluated_run(tmp_path, "transformer", 2, [f"a man rides a big brown horse number {i} ." for i in range(20)],
                   references)
    _evaluated_run(tmp_path, "mlrf", 1, references, references)
    runs = {(method, seed): comparison.collect_run(str(tmp_path), method, seed, budget=4)
            for method, seed in (("transformer", 1), ("transformer", 2), ("mlrf", 1))}
    assert runs["transformer", 1]["length_ratio"] == 0.75  # 6 tokens against 8
    assert runs["transformer", 2]["length_ratio"] == 1.25  # 10 against 8
    assert runs["mlrf", 1]["length_ratio"] == 1.0 and runs["mlrf", 1]["paired"]["system"] == 100
    row = comparison.method_row(METHODS["transformer"], [runs["transformer", 1], runs["transformer", 2]], {})
    assert row["length_ratio"] == {"n": 2, "mean": 1.0, "std": 0.35, "min": 0.75, "max": 1.25}
    results = {"settings": {"seeds": SEEDS}, "methods": [row]}
    assert report.summary_table(results)[7].startswith(f"| {row['title']} | – | – | "
                                                       f"{runs['transformer', 1]['test']['all']:.2f} (0.75 ⚠) | ")


@pytest.mark.slow
def test_learning_curve_png(smoke):
    _, out, results = smoke
    path = os.path.join(out, "learning_curves.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for row in results["methods"]:
        assert row["curve_seeds"] == len(row["runs"])
        assert set(row["mean_curve"]) == {str(u) for u in range(2, _budget(row["method"]) + 1, 2)}  # --eval-every 2
        runs = [{u: v for u, v in r["curve"].items()} for r in row["runs"]]
        assert row["mean_curve"]["4"] == pytest.approx(statistics.fmean(r["4"] for r in runs), abs=1e-3)


@pytest.mark.slow
def test_second_invocation_does_not_retrain(smoke, capsys):
    raw, out, first = smoke
    runs = [(row["method"], run["seed"]) for row in first["methods"] for run in row["runs"]]
    markers = {(m, s): os.path.join(out, "runs", m, f"seed{s}", "done.json") for m, s in runs}
    logs = {k: os.path.join(os.path.dirname(p), "run.log") for k, p in markers.items()}
    before = {k: os.stat(p).st_mtime_ns for k, p in markers.items()}
    logs_before = {k: os.stat(p).st_size for k, p in logs.items()}
    capsys.readouterr()
    results = main(_argv(raw, out))
    printed = capsys.readouterr().out
    assert {k: os.stat(p).st_mtime_ns for k, p in markers.items()} == before
    assert {k: os.stat(p).st_size for k, p in logs.items()} == logs_before  # no worker started
    for method, seed in runs:
        assert f"{method} seed {seed}: already done, not retrained" in printed
    assert f"{len(runs)} of {len(runs)} runs done" in printed
    assert all(r["status"] == "done" for row in results["methods"] for r in row["runs"])


@pytest.mark.slow
def test_report_only_shows_pending_runs(smoke, capsys):
    """A configuration whose grid has not trained yet: its grid runs pending, no verdict for anyone (the
    family is incomplete), the Transformer's runs reported as they are."""
    raw, out, _ = smoke
    results = main(_argv(raw, out, ["transformer", "mlrf"]) + ["--report-only"])
    rows = _rows(results)
    assert {name for name in rows if name.startswith("mlrf")} == {"mlrf", "mlrf@lr0.0005", "mlrf@lr0.002"}
    assert all([r["status"] for r in rows[name]["runs"]] == ["pending"] for name in rows if name.startswith("mlrf"))
    assert all(r["status"] == "done" for name in rows if name.startswith("transformer") for r in rows[name]["runs"])
    assert results["reviewed"]["verdicts"] is None and not any(row.get("verdict") for row in rows.values())
    assert not os.path.exists(os.path.join(out, "runs", "mlrf", "seed1", "done.json"))
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        md = f.read()
    total = sum(len(row["runs"]) for row in rows.values())
    assert f"{total - 3} of {total} runs done" in md and "| pending | – |" in md


@pytest.mark.slow
def test_changed_settings_are_refused(smoke):
    raw, out, _ = smoke
    argv = _argv(raw, out, ["transformer"])
    argv[argv.index("--max-update") + 1] = "6"
    with pytest.raises(SystemExit, match=r"other settings.*--max-update 4 -> 6"):
        main(argv + ["--report-only"])


def test_bad_method_name_lists_known_ones(tmp_path):
    with pytest.raises(SystemExit) as error:
        main(["--methods", "transformer,not_a_method", "--out", str(tmp_path / "out")])
    message = str(error.value.code)
    assert "unknown method(s) 'not_a_method'" in message
    for name in comparison.METHODS:
        assert name in message
    assert not os.path.exists(tmp_path / "out" / "data")  # fails before any work


def test_match_parameter_picks_the_closest():
    counts = {v: 1000 + 37 * v + v * v for v in range(8, 257, 8)}
    value, params, tried = match_parameter(counts.__getitem__, sorted(counts), 20000)
    best = min(sorted(counts), key=lambda v: (abs(counts[v] - 20000), v))
    assert (value, params) == (best, counts[best])
    assert len(tried) <= 8  # binary search, not every candidate
    assert match_parameter(counts.__getitem__, sorted(counts), 10 ** 9)[0] == 256
    assert match_parameter(counts.__getitem__, sorted(counts), 0)[0] == 8


def test_width_and_summary_helpers():
    assert parse_width("3+3:256:1024:4") == Width(3, 3, 256, 1024, 4)
    for bad in ("3:256:1024:4", "3+3:255:1024:4", "0+3:256:1024:4"):
        with pytest.raises(Exception):
            parse_width(bad)
    assert summarise([]) is None
    assert summarise([20.0]) == {"n": 1, "mean": 20.0, "std": None, "min": 20.0, "max": 20.0}
    stats = summarise([20.0, 21.0, 23.0])
    assert stats["mean"] == pytest.approx(21.33, abs=0.01) and stats["std"] == pytest.approx(1.53, abs=0.01)


def test_the_figure_averages_the_finished_seeds_only_and_over_the_same_seeds_at_every_point():
    assert report.mean_curve([{250: 5.0, 500: 4.0}, {250: 6.0}]) == {250: 5.5}
    assert report.mean_curve([]) == {}
    done = {"status": "done", "curve": {"250": 5.0, "500": 4.0}, "sacrebleu": 30.0, "tokenized_bleu": 30.5,
            "test": {name: 30.0 for name in (*comparison.TEST_SETS, "all")}, "length_ratio": 1.0}
    running = {"status": "partial", "curve": {"250": 6.0}}
    row = comparison.method_row(METHODS["mlrf"], [done, running], {})
    assert row["mean_curve"] == {"250": 5.0, "500": 4.0} and row["curve_seeds"] == 1
    row = comparison.method_row(METHODS["mlrf"], [running, dict(running, curve={"250": 5.0, "500": 4.5})], {})
    assert row["mean_curve"] == {"250": 5.5} and row["curve_seeds"] == 2


def test_every_method_uses_known_flags():
    """Every method's flags parse with fairseq's training parser at the default width (no data needed)."""
    from types import SimpleNamespace

    from fairseq import options

    width = parse_width(comparison.DEEP_WIDTH)
    settings = SimpleNamespace(dropout=0.1, lr=1e-3, warmup=10, max_tokens=100, max_update=1, eval_every=1,
                               log_interval=1, train_args="")
    known = options.get_training_parser()
    options.parse_args_and_arch(known, ["unused", "--user-dir", comparison.PLUGIN_DIR, "--arch", "fusion_transformer"])
    for method in METHODS.values():
        if method.name in ("denseformer", "hyper_connections") and not any(
                flag.startswith("--denseformer" if method.name == "denseformer" else "--hyper-connections")
                for action in known._actions for flag in action.option_strings):
            continue  # their flags come with the models of the main branch
        flags = comparison.model_flags(method, width, (width.ffn if method.match == "--ffn-embed-dim" else 4)
                                       if method.match else None)
        argv = ["unused", "--user-dir", comparison.PLUGIN_DIR, *flags, *(method.criterion or comparison.DEFAULT_CRITERION),
                *comparison.common_train_flags(settings, "de", "en")]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        assert args.arch == method.arch
        # batches made in the training thread: a prefetching thread still collating at exit aborts fairseq-train
        assert (args.num_workers, args.data_buffer_size) == (0, 0)
        if method.style == "encdec":
            assert args.share_all_embeddings and args.encoder_embed_dim == 128 and args.decoder_layers == 6


def _trainings(rdir):
    """The runner's record of every fairseq-train it started for a run (run.log's marked lines)."""
    with open(os.path.join(rdir, "run.log"), encoding="utf-8") as f:
        return [json.loads(line[len(comparison.TRAINING_MARK):]) for line in f
                if line.startswith(comparison.TRAINING_MARK)]


@pytest.mark.slow
def test_staged_runs(tmp_path):
    """--stage train trains every run it can reach to its budget and evaluates none: the grid, then, the rate
    chosen from the grid's validation NLL, the other seed and the Transformer's longer budget at it; --stage
    evaluate trains nothing. A Transformer alone has no comparison: no verdict, and no other configuration
    trains longer."""
    raw, out = str(tmp_path / "raw"), str(tmp_path / "out")
    write_multi30k_slice(raw)
    argv = _argv(raw, out, ["transformer"])
    main(argv + ["--stage", "train"])
    with open(os.path.join(out, "learning_rates.json")) as f:
        chosen = comparison.at_learning_rate(METHODS["transformer"], json.load(f)["chosen"]["transformer"], 1e-3)
    longer = comparison.at_budget(chosen, 8).name
    trained = [("transformer@lr0.0005", 1), ("transformer", 1), ("transformer@lr0.002", 1), (chosen.name, 2),
               (longer, 1), (longer, 2)]
    for name, seed in trained:
        rdir = os.path.join(out, "runs", name, f"seed{seed}")
        assert comparison.saved_updates(os.path.join(rdir, "checkpoints")) == _budget(name)
        assert not os.path.exists(os.path.join(rdir, "done.json"))
        assert all(training["commit"] for training in _trainings(rdir))
    results = main(argv + ["--stage", "evaluate"])
    statuses = {(row["method"], run["seed"]): run["status"] for row in results["methods"] for run in row["runs"]}
    assert statuses == {run: "done" for run in trained}
    assert results["reviewed"]["verdicts"] is None and not os.path.exists(os.path.join(out, "longer_budget.json"))


def _fake_checkpoint(path, updates):
    import torch

    torch.save({"optimizer_history": [{"num_updates": updates}], "model": {}}, path)


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys):
    save = str(tmp_path)
    last = os.path.join(save, "checkpoint_last.pt")
    for update in (250, 500):
        _fake_checkpoint(os.path.join(save, f"checkpoint_1_{update}.pt"), update)
    _fake_checkpoint(last, 500)
    with open(last, "r+b") as f:  # killed while fairseq copied it
        f.truncate(os.path.getsize(last) // 2)
    comparison.resume_from_newest_intact(save)
    assert comparison.checkpoint_updates(last) == 500
    printed = capsys.readouterr().out
    assert "resuming from checkpoint_1_500.pt (update 500): checkpoint_last.pt was missing or unreadable" in printed
    assert [n for n in os.listdir(save) if n.startswith("checkpoint_last.pt.unreadable-")]  # kept, not deleted

    _fake_checkpoint(last, 250)  # killed between the interval checkpoint and the copy
    comparison.resume_from_newest_intact(save)
    assert comparison.checkpoint_updates(last) == 500 and "checkpoint_last.pt was older" in capsys.readouterr().out

    with open(os.path.join(save, "checkpoint_1_750.pt"), "wb") as f:
        f.write(b"not a checkpoint")
    os.remove(last)
    comparison.resume_from_newest_intact(save)
    assert comparison.checkpoint_updates(last) == 500
    assert "checkpoint_1_750.pt is unreadable" in capsys.readouterr().out

    os.remove(os.path.join(save, "checkpoint_1_750.pt"))
    comparison.resume_from_newest_intact(save)  # intact and the newest: left alone
    assert capsys.readouterr().out == "" and comparison.checkpoint_updates(last) == 500


@pytest.mark.slow
def test_out_holding_a_users_results_is_refused_without_force(smoke, tmp_path):
    raw, out, _ = smoke
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "results.md").write_text("my table\n")
    (theirs / "learning_curves.png").write_bytes(b"my figure")
    argv = _argv(raw, str(theirs), ["transformer"]) + ["--report-only", "--data-bin", os.path.join(out, "data", "data-bin")]
    with pytest.raises(SystemExit, match=r"--out '.*theirs' holds files that compare_methods.py did not write: "
                                         r"results.md learning_curves.png; pass --force"):
        main(argv)
    assert (theirs / "results.md").read_text() == "my table\n"
    assert (theirs / "learning_curves.png").read_bytes() == b"my figure"
    main(argv + ["--force"])
    assert (theirs / "results.md").read_text().startswith("# One benchmark")
    (theirs / "plan.json").write_text("not json")  # the tool's own cache, damaged: recomputed
    main(argv)
    with open(theirs / "plan.json") as f:
        assert "transformer" in json.load(f)["entries"]


def test_a_linked_stamp_is_not_the_tools_and_linked_outputs_are_removed(tmp_path):
    """--out's stamp must be a regular file; with --force, an output that is a link is removed (its target,
    the user's file, is left as it was), never written through."""
    from fusion_lab.common import claim_out_dir

    out, theirs, stamp = tmp_path / "out", tmp_path / "theirs.md", "fusion-fairseq compare_methods.py"
    out.mkdir()
    theirs.write_text("my table\n")
    (tmp_path / "stamp").write_text(stamp + "\n")
    (out / ".written_by").symlink_to(tmp_path / "stamp")
    (out / "results.md").symlink_to(theirs)
    claim = [str(out), comparison.OUT_NAMES, stamp]
    with pytest.raises(SystemExit, match=r"holds files that compare_methods.py did not write: results.md .written_by;"):
        claim_out_dir(*claim, False, "compare_methods.py", comparison.ComparisonError)
    claim_out_dir(*claim, True, "compare_methods.py", comparison.ComparisonError)
    assert theirs.read_text() == "my table\n" and not os.path.lexists(out / "results.md")
    assert not (out / ".written_by").is_symlink() and (out / ".written_by").read_text() == stamp + "\n"
    assert (tmp_path / "stamp").read_text() == stamp + "\n"
    claim_out_dir(*claim, False, "compare_methods.py", comparison.ComparisonError)  # its own now


def test_the_methods_table_sets_each_gap_beside_its_papers():
    rows = [comparison.method_row(METHODS[name], [], {}) for name in ("transformer", "mlrf")]
    table = report.methods_table(rows)
    assert table[-1].startswith("| MLRF Both-FNN-SA | Wang et al. 2018") and "| +0.92 (IWSLT14 De-En, Table 2" in table[-1]
    assert "| – |" in table[-2]
    # every paper's row has its gap, but the baselines and the papers measured on language models (no BLEU)
    no_gap = ("transformer", "transformer_continued", "transformer_wide", "denseformer", "hyper_connections", "mhc",
              "muddformer")
    assert all(m.paper_gap for m in METHODS.values() if m.name not in no_gap)


def test_the_summary_gives_each_seed_the_mean_and_the_verdict_against_its_baseline():
    def run(seed, score, status="done"):
        return {"seed": seed, "status": status, "updates": 300, "test": dict.fromkeys((*comparison.TEST_SETS, "all"), score),
                "length_ratio": 0.99, "sacrebleu": score, "tokenized_bleu": score, "curve": {}}

    def row(name, params, runs, verdict=None):
        found = comparison.method_row(METHODS[name], runs, {"params": params})
        return dict(found, verdict=verdict) if verdict else found

    rows = [row("transformer", 1000, [run(1, 30.0), run(2, 31.0)]),
            row("mlrf", 1166, [run(1, 31.25), run(2, 0, "partial")]),
            row("fgla", 1000, [run(1, 32.0), run(2, 33.0)],
                {"difference": 2.0, "ci95": [0.5, 3.5], "verdict": "better"}),
            dict(row("fgla", 1000, [run(1, 29.0)]), baseline=None)]  # the grid's run at a rate not chosen
    table = report.summary_table({"settings": {"seeds": SEEDS}, "methods": rows})
    assert table[5] == ("| method | params | vs Transformer | seed 1 | seed 2 | mean ± std | baseline | "
                        "Δ [95% interval] | verdict |")
    assert table[7] == "| Transformer (baseline) | 1,000 | +0.0% | 30.00 (0.99) | 31.00 (0.99) | 30.50 ± 0.71 | – | – | – |"
    assert table[8] == ("| MLRF Both-FNN-SA | 1,166 | +16.6% | 31.25 (0.99) | partial 300 | 31.25 | transformer | – "
                        "| pending |")
    assert table[9].endswith("| 32.50 ± 0.71 | transformer | +2.00 [+0.50, +3.50] | better |")
    assert table[10].endswith("| 29.00 (0.99) | – | 29.00 | – | – | rate not chosen |")


def test_the_grid_table_marks_a_rate_at_an_end_of_the_grid_and_the_schedules_not_tried():
    """plan.md: an end of the grid that wins is reported as such; DenseNMT's and layer-wise coordination's
    papers train with schedules of another kind, which the report says beside their rows."""
    nll = {"0.0005": 3.0, "0.001": 2.6, "0.002": 2.5}
    rates = {"seed": 1, "validation_nll": dict.fromkeys(("transformer", "mlrf", "layerwise_coordination"), nll),
             "chosen": {"transformer": 2e-3, "mlrf": 1e-3, "layerwise_coordination": 5e-4}}
    lines = report.reviewed_sections({"reviewed": {"learning_rates": rates}, "settings": {"learning_rates": [
        5e-4, 1e-3, 2e-3]}})
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and "lr 0.0005" not in line}
    assert rows["transformer"].endswith("| 2.500 | 0.002 (an end of the grid) | – |")
    assert rows["mlrf"].endswith("| 2.500 | 0.001 | – |")
    assert rows["layerwise_coordination"].endswith(
        "| 0.0005 (an end of the grid) | its paper's inverse square root after 4,000 warm-up updates: not tried |")


def test_the_verdict_table_reports_the_monte_carlo_record():
    """plan.md: resamples are doubled until every bound's Monte-Carlo SE is below 0.01 BLEU, "the SEs are
    reported"; they were in results.json only."""
    verdict = {"baseline": "transformer@lr0.002", "seeds": 6, "difference": 0.41, "ci": [-0.2, 1.02],
               "p_value": 0.16, "p_holm": 0.9, "verdict": "undecided",
               "minimum_detectable_effect": {"holm_last_step": 0.51},
               "monte_carlo": {"replicates": 4000, "bound_se": 0.0063, "settled": True}}
    lines = report.reviewed_sections({"reviewed": {"learning_rates": {"seed": 1, "validation_nll": {}, "chosen": {}},
                                                   "verdicts": {"mlrf@lr0.002": verdict}},
                                      "settings": {"learning_rates": [5e-4, 1e-3, 2e-3]}})
    header = next(line for line in lines if "| configuration | baseline | seeds |" in line)
    row = next(line for line in lines if line.startswith("| mlrf@lr0.002 "))
    assert header.endswith("| sentence resamples | Monte-Carlo SE of a bound |")
    assert row.endswith("| undecided | 0.51 | 4,000 | 0.0063 |")


def test_the_averaged_checkpoints_are_the_last_intervals_up_to_the_budget_and_none_may_be_missing():
    every_250 = {u: f"checkpoint_1_{u}.pt" for u in range(250, 4501, 250)}
    assert comparison.averaged_updates(every_250, 4000, 250) == [3000, 3250, 3500, 3750, 4000]
    assert comparison.averaged_updates({2: "a", 4: "b"}, 5, 2) == [2, 4]  # the budget holds two intervals
    del every_250[3500]
    with pytest.raises(SystemExit, match=r"no checkpoint of update\(s\) 3500$"):
        comparison.averaged_updates(every_250, 4000, 250)


def _marked(start, updates, commit):
    return comparison.TRAINING_MARK + json.dumps({"start": start, "from": updates, "to": 500, "commit": commit,
                                                  "device": "cpu"}) + "\n"


def test_a_training_killed_after_its_last_checkpoint_still_counts_its_time(tmp_path):
    """run.log is the training record: each fairseq-train the runner started lasts until its last
    timestamped line, whether it finished or was killed."""
    start = time.mktime(time.strptime("2026-11-24 10:00:00", "%Y-%m-%d %H:%M:%S"))
    log = tmp_path / "run.log"
    log.write_text(_marked(start - 600, 0, "a") + '2026-11-24 09:55:00 | INFO | train | {"num_updates": "100"}\n'
                   + '2026-11-24 10:00:00 | INFO | train | {"num_updates": "250"}\n' + _marked(start, 250, "b")
                   + '2026-11-24 10:10:00 | INFO | valid | {"valid_num_updates": "500"}\n')
    assert comparison.training_record(str(log)) == {"train_seconds": 1200.0, "updates_per_second": round(500 / 1200, 3),
                                                    "devices": ["cpu"], "trained_by": ["a", "b"]}


def test_the_reported_curve_stops_at_the_budget(tmp_path):
    rdir = tmp_path / "runs" / "transformer" / "seed1"
    rdir.mkdir(parents=True)
    (rdir / "run.log").write_text("".join(
        f'x | valid | {{"valid_nll_loss": "{3 - u / 1000}", "valid_num_updates": "{u}"}}\n' for u in (250, 500, 750)))
    assert comparison.collect_run(str(tmp_path), "transformer", 1, 500)["curve"] == {"250": 2.75, "500": 2.5}


def test_a_killed_unfinished_run_reports_its_time_until_its_last_log_line(tmp_path):
    rdir = tmp_path / "runs" / "mlrf" / "seed1"
    rdir.mkdir(parents=True)
    start = time.mktime(time.strptime("2026-11-24 10:00:00", "%Y-%m-%d %H:%M:%S"))
    (rdir / "run.log").write_text(_marked(start, 0, "a") + '2026-11-24 10:10:00 | INFO | train | {"num_updates": "300"}\n')
    run = comparison.collect_run(str(tmp_path), "mlrf", 1, 4000)
    assert (run["status"], run["updates"], run["train_seconds"], run["updates_per_second"]) == ("partial", 300, 600, 0.5)


@pytest.mark.parametrize("flags, message", [
    (["--max-update", "5", "--eval-every", "2"], r"--max-update 5: not a multiple of --eval-every 2, the only"),
    (["--max-update", "4", "--eval-every", "2", "--longer-budget", "7"], r"--longer-budget 7: not a multiple of"),
])
def test_a_run_must_stop_where_fairseq_writes_a_checkpoint(tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message):
        main(["--out", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()


def _read(*path):
    with open(os.path.join(REPO_ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _summary_rows(report):
    summary = report.split("\n## Summary\n")[1].split("\n## ")[0]
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in summary.splitlines() if line.startswith("|")][2:]


def test_the_comparison_page_shows_the_shallow_point_as_its_committed_report_has_it():
    """The comparison page's 3+3 table is the report's summary with the averaged checkpoints' cells only
    (the best-checkpoint cells and the verdict column are left out), and it is not called converged."""
    report = _read("examples", "comparison", "converged", "results.md")
    page = _read("examples", "comparison", "README.md")
    shallow = page.split("\n## The 3+3 (shallow) point\n")[1].split("\n## ")[0]
    assert "convergence" not in shallow
    rows = _summary_rows(report)
    assert len(rows) == 8
    for cells in rows:
        averaged = cells[:3] + [cell.split(" / ")[-1] for cell in cells[3:9]]
        assert "| " + " | ".join(averaged) + " |" in shallow


def test_the_readme_headline_is_the_deep_report_as_committed():
    """Every row of the 6+6 report's summary is in the README's headline table: its four test sets and
    all four together, and, once its every seed is scored, its Δ with the interval and the verdict."""
    report = _read("examples", "comparison", "deep", "results.md")
    readme = _read("README.md").replace("\u2212", "-")
    headline = readme.split("\n## Results\n")[1].split("\n## ")[0].split("\n### The 6+6 comparison\n")[1]
    rows = _summary_rows(report)
    assert len(rows) == 12
    for cells in rows:
        bleu = " | ".join(cells[3:8])
        matching = [line for line in headline.splitlines() if f"| {bleu} |" in line]
        assert len(matching) == 1, cells[0]
        if cells[9] not in ("pending", "–"):
            assert f"| {cells[8]} | {cells[9]} |" in matching[0], cells[0]


def test_summed_sentence_statistics_give_sacrebleus_corpus_score():
    from sacrebleu.metrics import BLEU

    hypotheses = ["a man rides a horse .", "two dogs play", "the woman is smiling at the camera .", "x"]
    references = ["a man is riding a horse .", "two dogs are playing .", "a woman smiles at the camera .", "y z"]
    found = report.sentence_statistics(hypotheses, references, lowercase=True)
    assert report.corpus_bleu(found.sum(0)) == BLEU(lowercase=True).corpus_score(hypotheses, [references]).score
    assert report.corpus_bleu(found[:2].sum(0)) == BLEU(lowercase=True).corpus_score(
        hypotheses[:2], [references[:2]]).score


def test_the_reviewed_design_is_the_default():
    """plan.md's design without flags: the 6+6 width, its configurations, the grid of learning rates, six paired
    seeds and the longer budget of twice the updates on the first three; every run decays to 0 at its budget."""
    settings = comparison.parse_settings([])
    assert str(settings.width) == comparison.DEEP_WIDTH == "6+6:128:512:4"
    assert [m.name for m in comparison.resolve_methods(settings.methods)] == list(comparison.REVIEWED_METHODS)
    assert settings.learning_rates == [5e-4, 1e-3, 2e-3] and settings.seeds == [1, 2, 3, 4, 5, 6]
    assert (settings.max_update, settings.eval_every, settings.longer_budget) == (3000, 250, 6000)
    assert settings.longer_seeds == [1, 2, 3] and settings.cpu_kind == "AMD EPYC"
    assert comparison.parse_settings(["--reviewed", "--seeds", "3", "4"]).longer_seeds == [3, 4]
    flags = comparison.common_train_flags(settings, "de", "en", 6000, 2e-3)
    assert flags[flags.index("--lr"):flags.index("--weight-decay")] == [
        "--lr", "0.002", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "250", "--end-learning-rate", "0",
        "--total-num-update", "6000"]
    assert flags[flags.index("--optimizer") + 1] == "adam_with_overrides"


def test_a_missing_raw_is_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match=r"--raw: not given, and .* holds no prepared data"):
        main(["--out", str(tmp_path / "out"), "--max-update", "4", "--eval-every", "2"])


def _train_losses(log_path):
    losses = {}
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            m = re.search(r"\| (?:train_inner|valid) \| (\{.*\})", line)
            if m:
                stats = json.loads(m.group(1))
                key = ("valid", stats["valid_num_updates"]) if "valid_loss" in stats else ("train", stats["num_updates"])
                losses[key] = stats.get("valid_loss", stats.get("loss"))
    return losses


@pytest.mark.slow
def test_resuming_is_bit_exact(tmp_path):
    """20 updates in one go and 10 + resume + 10 log the same losses at every update and validation;
    the resume is inside epoch 2, where fairseq alone would form other batches than the run in one go."""
    raw, out = str(tmp_path / "raw"), str(tmp_path / "out")
    write_multi30k_slice(raw)
    argv = _argv(raw, out, ["transformer"]) + ["--log-interval", "1"]
    argv[argv.index("--max-update") + 1], argv[argv.index("--eval-every") + 1] = "20", "10"
    main(argv + ["--stage", "train"])
    unbroken = os.path.join(out, "runs", "transformer", "seed1")
    resumed = str(tmp_path / "resumed")
    os.makedirs(resumed)
    shutil.copyfile(os.path.join(unbroken, "config.json"), os.path.join(resumed, "config.json"))
    for target in (10, 20):
        comparison.train_run(resumed, target)
    assert [t["from"] for t in _trainings(resumed)] == [0, 10]
    expected, found = _train_losses(os.path.join(unbroken, "run.log")), _train_losses(os.path.join(resumed, "run.log"))
    assert len(expected) == 22 and found == expected
    with open(os.path.join(resumed, "run.log")) as f:
        assert "checkpoint_last.pt (epoch 2 @ 10 updates)" in f.read()


@pytest.mark.slow
def test_an_update_that_ends_an_epoch_keeps_its_checkpoint(tmp_path):
    """fairseq-train names no interval checkpoint at an update that ends an epoch (here every second update,
    2,048 tokens a batch): the run stopped with "fairseq-train stopped before update 4" and could never be
    averaged. Its checkpoint_last.pt, that update's only copy, is kept under the interval name."""
    raw, out = str(tmp_path / "raw"), str(tmp_path / "out")
    write_multi30k_slice(raw)
    argv = _argv(raw, out, ["transformer"])
    argv[argv.index("--max-tokens") + 1] = "2048"
    main(argv + ["--stage", "train"])
    rdirs = sorted(glob.glob(os.path.join(out, "runs", "*", "seed*")))
    assert len(rdirs) >= 3  # the learning rates' runs at least
    for rdir in rdirs:
        with open(os.path.join(rdir, "run.log"), encoding="utf-8") as f:
            ends = re.findall(r'"epoch": (\d+), "train_loss[^}]*"train_num_updates": "(\d+)"', f.read())
        assert ends == [(str(epoch), str(2 * epoch)) for epoch in range(1, len(ends) + 1)]  # the premise
        assert list(comparison.interval_checkpoints(os.path.join(rdir, "checkpoints"))) == [2 * epoch for epoch in
                                                                                            range(1, len(ends) + 1)]
        assert "checkpoint_2_4.pt" in os.listdir(os.path.join(rdir, "checkpoints"))  # named by the epoch it ended


@pytest.mark.parametrize("launcher", ["deep", "converged"])
def test_the_launchers_refuse_what_they_did_not_create(tmp_path, launcher):
    """examples/comparison/deep.sh and converged.sh (both through launch.sh): no step without a
    pinned commit; an EXP, a venv or a train.pid the launcher did not make is refused (one-line
    errors) and left as it was."""
    with open(os.path.join(REPO_ROOT, "examples", "comparison", f"{launcher}.sh"), encoding="utf-8") as f:
        script = f.read()
    assert re.search(r"^PIN=[0-9a-f]{40}\b", script, flags=re.MULTILINE)
    head = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    unpinned = os.path.join(REPO_ROOT, "examples", "comparison", f".{launcher}-unpinned-under-test.sh")
    pinned = os.path.join(REPO_ROOT, "examples", "comparison", f".{launcher}-under-test.sh")
    try:
        with open(unpinned, "w", encoding="utf-8") as f:
            f.write(re.sub(r"^PIN=\S*", "PIN=", script, count=1, flags=re.MULTILINE))
        result = subprocess.run(["bash", unpinned, "train", str(tmp_path / "exp"), str(tmp_path)],
                                capture_output=True, text=True)
        assert result.returncode == 1 and "PIN is empty" in result.stderr and not (tmp_path / "exp").exists()
        with open(pinned, "w", encoding="utf-8") as f:
            f.write(re.sub(r"^PIN=\S*", f"PIN={head}", script, count=1, flags=re.MULTILINE))
        stranger = tmp_path / "stranger"
        stranger.mkdir()
        result = subprocess.run(["bash", pinned, "status", str(stranger)], capture_output=True, text=True)
        assert result.returncode == 1 and "was not created by this script" in result.stderr
        assert os.listdir(stranger) == []  # not stamped
        exp = tmp_path / "exp"
        (exp / "venv").mkdir(parents=True)
        (exp / f".created_by_{launcher}_sh").write_text(f"{exp}\n")
        (exp / "venv" / "theirs").write_text("kept")
        sleeper = subprocess.Popen(["sleep", "60"])
        (exp / "train.pid").write_text(f"{sleeper.pid}\n")
        try:
            result = subprocess.run(["bash", pinned, "status", str(exp)], capture_output=True, text=True)
        finally:
            sleeper.kill()
        assert result.stdout.startswith("not training")  # a live pid that is not the runner is not trusted
        assert result.returncode == 1 and f"{exp}/venv was not created by this script" in result.stderr
        assert os.listdir(exp / "venv") == ["theirs"]
    finally:
        for path in (unpinned, pinned):
            if os.path.exists(path):
                os.remove(path)


@pytest.mark.parametrize("how", ["group-writable EXP", "others-writable venv file", "a file of another user"])
def test_the_launchers_run_nothing_from_an_exp_anyone_else_could_have_written(tmp_path, how):
    """An EXP whose stamps name it passes only if nothing in it is owned by another user or writable by group
    or others, as ssh trusts a key file: else one line naming the first such path, and no git and no Python
    of EXP runs."""
    clone, script = _pinned_clone(tmp_path)
    exp, ran = tmp_path / "exp", tmp_path / "ran"
    _stand_in_venv(exp, f"touch {ran}")
    (exp / "venv" / "bin" / "python").write_text(f"#!/usr/bin/env bash\ntouch {ran}\n")
    stranger = {"group-writable EXP": exp, "others-writable venv file": exp / "venv" / "bin" / "python",
                "a file of another user": exp / "venv" / ".created_by_deep_sh"}[how]
    if how == "a file of another user":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(stranger, 65534, 65534)
    else:
        stranger.chmod(0o775 if stranger == exp else 0o757)
    result = subprocess.run(["bash", str(script), "status", str(exp)], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr == f"deep.sh: error: EXP {exp} holds {stranger}, owned by another " \
        "user or writable by group or others: nothing runs from it (fix its owner or mode, or give a new folder)\n"
    assert not ran.exists() and not (exp / "code").exists()


def test_the_launchers_import_nothing_from_exp_and_run_no_fsmonitor_of_its_checkout(tmp_path):
    """python -P: a fusion_fairseq folder in EXP (the working directory of the import check) is not imported;
    git -c core.fsmonitor=false: the checkout's fsmonitor hook does not run on git status."""
    clone, script = _pinned_clone(tmp_path)
    exp, imported, monitored = tmp_path / "exp", tmp_path / "imported", tmp_path / "monitored"
    _stand_in_venv(exp, "exit 0")
    (exp / "venv" / "bin" / "python").write_text(  # the real interpreter for -c, importing the pinned checkout
        f'#!/usr/bin/env bash\n[[ "$1" == -c || "$2" == -c ]] && PYTHONPATH={exp}/code exec {sys.executable} "$@"\nexit 0\n')
    (exp / "fusion_fairseq").mkdir()
    (exp / "fusion_fairseq" / "__init__.py").write_text(f"open({str(imported)!r}, 'w').close()\n")
    result = subprocess.run(["bash", str(script), "status", str(exp)], capture_output=True, text=True)
    assert result.returncode == 0 and "report: " in result.stdout, result.stderr
    assert not imported.exists()
    hook = tmp_path / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {monitored}\n")
    hook.chmod(0o755)
    subprocess.run(["git", "-C", str(exp / "code"), "config", "core.fsmonitor", str(hook)], check=True)
    result = subprocess.run(["bash", str(script), "status", str(exp)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not monitored.exists()
    subprocess.run(["git", "-C", str(exp / "code"), "status", "--porcelain"], capture_output=True, check=True)
    assert monitored.exists()  # what the launcher's git would have run


def _pinned_clone(tmp_path):
    """A clone of the repository whose deep.sh is pinned to its HEAD, without the committed export."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", REPO_ROOT, str(clone)], check=True)
    shutil.rmtree(clone / "examples" / "comparison" / "deep", ignore_errors=True)
    script = clone / "examples" / "comparison" / "deep.sh"
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    script.write_text(re.sub(r"^PIN=\S*", f"PIN={head}", script.read_text(), count=1, flags=re.MULTILINE))
    return clone, script


def _stand_in_venv(exp, otherwise):
    """An EXP whose venv the launcher's markers name as its own (creating a real one installs torch), with
    a stand-in python that answers the launcher's import check and else runs the bash ``otherwise``."""
    (exp / "venv" / "bin").mkdir(parents=True)
    (exp / ".created_by_deep_sh").write_text(f"{exp}\n")
    (exp / "venv" / ".created_by_deep_sh").write_text(f"{exp}/venv\n")
    stand_in = exp / "venv" / "bin" / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\n[[ "$1" == -P && "$2" == -c && "$3" == *fusion_fairseq* ]] && echo "{exp}/code" '
                        f"&& exit 0\n{otherwise}\n")
    stand_in.chmod(0o755)


def _within_30_seconds(condition) -> bool:
    """Whether ``condition()`` holds within 30 s (what a background step does, seen from the test)."""
    for _ in range(300):
        if condition():
            return True
        time.sleep(0.1)
    return False


def _took_lock(file) -> bool:
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def test_export_copies_regular_files_inside_exp_only(tmp_path):
    """launch.sh export: a file that is a symbolic link (to a file outside EXP, or inside it) is not
    copied; regular files are; an evaluated run of the export is not overwritten by the same run
    training again in EXP, nor the export's plan by the runner's plan.json. Run in a clone of the repository, whose examples/comparison/deep/ receives
    the export, with a stand-in EXP/venv."""
    clone, script = _pinned_clone(tmp_path)
    exp = tmp_path / "exp"
    _stand_in_venv(exp, "exit 0")  # the report step is a no-op
    run = exp / "runs" / "transformer" / "seed1"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the repository")
    (run / "run.log").symlink_to(secret)
    (exp / "results.md").symlink_to(run / "config.json")
    (exp / "plan.json").write_text('{"max_update": 4}')  # the runner's cache of model flags and sizes
    dest = clone / "examples" / "comparison" / "deep"
    dest.mkdir(parents=True)
    (dest / "plan.json").write_text("the plan, written before the runs\n")
    evaluated, again = dest / "runs" / "transformer" / "seed2", exp / "runs" / "transformer" / "seed2"
    evaluated.mkdir(parents=True)
    (evaluated / "done.json").write_text("{}")
    (evaluated / "run.log").write_text("trained to the budget\n")
    again.mkdir(parents=True)
    (again / "run.log").write_text("training again from update 0\n")
    result = subprocess.run(["bash", str(script), "export", str(exp)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (evaluated / "run.log").read_text() == "trained to the budget\n"
    assert "not exported (the export holds runs/transformer/seed2 evaluated; EXP trains it again)" in result.stdout
    assert (dest / "runs" / "transformer" / "seed1" / "config.json").read_text() == "{}"
    assert not (dest / "runs" / "transformer" / "seed1" / "run.log").exists()
    assert not (dest / "results.md").exists()
    assert "not exported (not a regular file in EXP): results.md" in result.stdout  # runs/ lists regular files only
    assert (dest / "plan.json").read_text() == "the plan, written before the runs\n"


def test_train_one_trains_a_single_run_with_every_core(tmp_path):
    """launch.sh train-one: the runner's worker trains one run up to its budget with as many threads as
    the machine has cores, in the run's directory and under its lock; a RUN that is not a run of EXP (a
    link to a folder elsewhere included), or one whose lock is held, is refused in one line."""
    clone, script = _pinned_clone(tmp_path)
    exp, record = tmp_path / "exp", tmp_path / "worker.txt"
    _stand_in_venv(exp, f'[[ "$1" == -P && "$2" == -c ]] && exec {sys.executable} "$@"\n'
                        f'echo "$PWD $OMP_NUM_THREADS $MKL_NUM_THREADS $*" > {record}.part && mv {record}.part {record}')
    run = exp / "runs" / "deeprep_finetuned" / "seed2"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train_argv": ["data-bin", "--total-num-update", "1000", "--seed", "2"]}))

    def train_one(name):
        return subprocess.run(["bash", str(script), "train-one", str(exp), name], capture_output=True, text=True)

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run, elsewhere)
    (run.parent / "seed4").symlink_to(elsewhere)
    for name in ("runs/deeprep_finetuned/seed3", "runs/../../seed2", "", "runs/deeprep_finetuned/seed4"):
        result = train_one(name)
        assert result.returncode == 1 and f"RUN '{name}': not a run that 'train' made in {exp}" in result.stderr
    with open(run / ".lock", "a") as lock:  # another train-one's lock on the run
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = train_one("runs/deeprep_finetuned/seed2")
    assert result.returncode == 1 and "runs/deeprep_finetuned/seed2 is training in another process" in result.stderr
    assert not record.exists()

    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    reviewed_pin = re.search(r"^PIN=(\S+)", (clone / "examples" / "comparison" / "reviewed.sh").read_text(), re.M)[1]
    for pin, runner in ((None, "fusion_lab.comparison"),
                        (reviewed_pin, "fusion_fairseq.tools.comparison")):  # pinned before the laboratory moved
        if pin:
            script.write_text(re.sub(r"^PIN=\S*", f"PIN={pin}", script.read_text(), count=1, flags=re.MULTILINE))
        record.unlink(missing_ok=True)
        result = train_one("runs/deeprep_finetuned/seed2")
        assert result.returncode == 0 and "up to update 1000" in result.stdout, result.stderr
        assert _within_30_seconds(record.exists)
        assert record.read_text().split() == [str(run), cores, cores, "-P", "-m", runner, "_train", str(run), "1000"]
        with open(run / ".lock", "a") as lock:  # the worker has let go of the run before the next train-one
            assert _within_30_seconds(lambda: _took_lock(lock))
    assert "==== train-one " in (run / "run.log").read_text()


def test_train_does_not_start_while_a_run_trains_alone(tmp_path):
    """launch.sh train: the runner would train a run that 'train-one' is training (its .lock held) a second
    time, into the same folder; refused in one line naming the run, and started once the lock is free."""
    clone, script = _pinned_clone(tmp_path)
    exp, raw, record = tmp_path / "exp", tmp_path / "raw", tmp_path / "runner.txt"
    raw.mkdir()
    (raw / "train.de").write_text("ein Satz\n")
    _stand_in_venv(exp, f"touch {record}")
    run = exp / "runs" / "mlrf@lr0.002" / "seed3"
    run.mkdir(parents=True)

    def train():
        return subprocess.run(["bash", str(script), "train", str(exp), str(raw)], capture_output=True, text=True)

    with open(run / ".lock", "a") as lock:  # what train-one's flock holds while its worker trains
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused = train()
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "runs/mlrf@lr0.002/seed3/.lock is held: runs/mlrf@lr0.002/seed3 is training alone ('train-one')" \
        in refused.stderr
    assert not record.exists() and not (exp / "train.pid").exists()
    started = train()
    assert started.returncode == 0 and "training in the background" in started.stdout, started.stderr
    assert _within_30_seconds(record.exists)


def test_the_steps_keep_the_memory_they_free(tmp_path):
    """launch.sh: the runner starts with glibc told to keep freed memory on its heap (no mmap, no trim), which
    spares the kernel's zeroing of fresh pages and changes no number; a value the user set is kept."""
    clone, script = _pinned_clone(tmp_path)
    exp, raw, record = tmp_path / "exp", tmp_path / "raw", tmp_path / "runner.txt"
    raw.mkdir()
    (raw / "train.de").write_text("ein Satz\n")
    _stand_in_venv(exp, f'echo "$MALLOC_MMAP_MAX_ $MALLOC_TRIM_THRESHOLD_ $3" > {record}.part && mv {record}.part {record}')
    for chosen, expected in (({}, ["0", "68719476736"]), ({"MALLOC_MMAP_MAX_": "65536"}, ["65536", "68719476736"])):
        record.unlink(missing_ok=True)
        environment = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
        result = subprocess.run(["bash", str(script), "train", str(exp), str(raw)], capture_output=True, text=True,
                                env={**environment, **chosen})
        assert result.returncode == 0 and "training in the background" in result.stdout, result.stderr
        assert _within_30_seconds(record.exists)
        assert record.read_text().split() == expected + ["--out"]
        runner = int((exp / "train.pid").read_text())  # gone before the next 'train', which would find it training
        assert _within_30_seconds(lambda: not os.path.exists(f"/proc/{runner}"))


def test_restore_copies_the_exported_evaluated_runs_into_a_lost_exp(tmp_path):
    """launch.sh restore: a new EXP receives the exported evaluated runs that were evaluated at its path,
    their hypotheses included, and the references from RAW that their scores name; nothing in EXP is
    overwritten; a Transformer run comes back only with the runs of its seed that start from its final
    model (that model is not exported)."""
    clone, script = _pinned_clone(tmp_path)
    exp, elsewhere, raw = tmp_path / "exp", tmp_path / "other-exp", tmp_path / "raw"
    source = clone / "examples" / "comparison" / "deep"
    write_multi30k_slice(str(raw))

    def exported(run, evaluated_in=exp):
        rdir = source / run
        (rdir / "eval-beam5" / "average" / "test_2016_flickr").mkdir(parents=True)
        hyp = f"{evaluated_in}/{run}/eval-beam5/average/test_2016_flickr/hyp.detok"
        ref = f"{evaluated_in}/test-sets/test_2016_flickr/raw.en"
        (rdir / "done.json").write_text(json.dumps(
            {"scores": {"average": {"test_2016_flickr": {"hyp_detok": hyp, "raw_ref": ref}}}}, indent=2))
        (rdir / "eval-beam5" / "average" / "test_2016_flickr" / "hyp.detok").write_text("a hypothesis\n")
        (rdir / "run.log").write_text("exported\n")

    for run in ("runs/mlrf/seed1", "runs/transformer/seed1", "runs/transformer/seed2",
                "runs/transformer_continued/seed2", "runs/deeprep_finetuned/seed2", "runs/fgla/seed1"):
        exported(run)
    exported("runs/denseformer/seed1", evaluated_in=elsewhere)
    (source / "composition.json").write_text('{"components": ["fgla"]}')
    (source / "third_seed.json").write_text('{"seed": 3}')

    first = subprocess.run(["bash", str(script), "restore", str(exp), str(raw)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert (exp / "test-sets" / "test_2016_flickr" / "raw.en").read_text() == (raw / "test_2016_flickr.en").read_text()
    assert sorted(os.listdir(exp / "test-sets")) == ["test_2016_flickr"]
    assert (exp / ".created_by_deep_sh").read_text() == f"{exp}\n"
    for run in ("runs/mlrf/seed1", "runs/transformer/seed2", "runs/transformer_continued/seed2", "runs/fgla/seed1"):
        assert f"restored: {run}" in first.stdout
        assert (exp / run / "eval-beam5" / "average" / "test_2016_flickr" / "hyp.detok").read_text() == "a hypothesis\n"
    assert "not restored (deeprep_finetuned seed1 starts from its model): runs/transformer/seed1" in first.stdout
    assert "not restored (evaluated in another EXP than" in first.stdout
    assert not (exp / "runs" / "transformer" / "seed1").exists() and not (exp / "runs" / "denseformer").exists()
    assert (exp / "composition.json").read_text() == '{"components": ["fgla"]}'

    (exp / "runs" / "mlrf" / "seed1" / "run.log").write_text("trained here\n")
    (source / "composition.json").write_text('{"components": ["mlrf"]}')
    again = subprocess.run(["bash", str(script), "restore", str(exp), str(raw)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "not restored (already in EXP): runs/mlrf/seed1" in again.stdout
    assert (exp / "runs" / "mlrf" / "seed1" / "run.log").read_text() == "trained here\n"
    assert (exp / "composition.json").read_text() == '{"components": ["fgla"]}'  # a decision is never retaken


def test_a_run_restored_into_a_lost_exp_is_a_baseline_again(tmp_path):
    """A run trained after the loss of EXP is paired with a restored run of its baseline, which reads the
    baseline's test-set references: data, not exported, so restore takes them from RAW."""
    clone, script = _pinned_clone(tmp_path)
    exp, raw = tmp_path / "exp", tmp_path / "raw"
    write_multi30k_slice(str(raw))
    references = [f"a man rides a horse number {i} ." for i in range(20)]
    for name in comparison.TEST_SETS:
        (raw / f"{name}.en").write_text("\n".join(references) + "\n")
    baseline, system = [f"a man rides number {i} ." for i in range(20)], references
    _evaluated_run(exp, "fgla", 1, baseline, references)
    shutil.copytree(exp / "runs", clone / "examples" / "comparison" / "deep" / "runs")  # what export keeps

    shutil.rmtree(exp)
    result = subprocess.run(["bash", str(script), "restore", str(exp), str(raw)], capture_output=True, text=True)
    assert result.returncode == 0 and "restored: runs/fgla/seed1" in result.stdout, result.stderr
    _evaluated_run(exp, "mlrf", 1, system, ["not the references"])  # its scores name those restore wrote
    paired = comparison.collect_run(str(exp), "mlrf", 1, budget=4, baseline="fgla")["paired"]
    assert paired == report.paired_bootstrap(references * 4, baseline * 4, system * 4, lowercase=True)

    crafted = clone / "examples" / "comparison" / "deep" / "runs" / "deeprep" / "seed1"
    crafted.mkdir(parents=True)
    (crafted / "done.json").write_text(json.dumps({"scores": {"average": {"test_2016_flickr": {
        "hyp_detok": f"{exp}/runs/deeprep/seed1/hyp", "raw_ref": f"{exp}/test-sets/../../escaped.en"}}}}))
    result = subprocess.run(["bash", str(script), "restore", str(exp), str(raw)], capture_output=True, text=True)
    assert result.returncode == 1 and "names a reference outside" in result.stderr
    assert not (tmp_path / "escaped.en").exists() and not (exp / "runs" / "deeprep").exists()
    result = subprocess.run(["bash", str(script), "restore", str(tmp_path / "new-exp")], capture_output=True, text=True)
    assert result.returncode == 1 and "RAW '': not a folder with the Multi30k raw files" in result.stderr
    assert not (tmp_path / "new-exp").exists()


@pytest.mark.parametrize("content", ['{"method": "transformer", "sc', "[1, 2, 3]", '{"method": "transformer"}', ""])
def test_an_unusable_done_json_stops_every_reader_in_one_line(tmp_path, content):
    """A truncated or foreign done.json is neither counted as done in one place and as not done in
    another, nor a traceback: every reader goes through finished_run, which names the file."""
    rdir = tmp_path / "runs" / "transformer" / "seed1"
    rdir.mkdir(parents=True)
    (rdir / "done.json").write_text(content)
    with pytest.raises(comparison.ComparisonError, match=r"done.json is unreadable or not a record of this runner"):
        comparison.finished_run(str(rdir))
    with pytest.raises(comparison.ComparisonError, match=r"done.json is unreadable"):
        comparison.collect_run(str(tmp_path), "transformer", 1, None)
    assert comparison.finished_run(str(tmp_path / "runs" / "mlrf" / "seed1")) is None  # not evaluated yet


@pytest.mark.slow
def test_the_three_stages(smoke):
    """The grid of learning rates on the first seed, each configuration's rate chosen from the validation NLL
    its grid runs logged at the budget (learning_rates.json), the other seeds at that rate only, the paired
    verdicts of the whole family, and the longer budget for the Transformer and every decided configuration,
    trained with the same schedule to the longer budget."""
    from fusion_lab import seed_analysis

    _, out, results = smoke
    with open(os.path.join(out, "learning_rates.json")) as f:
        rates = json.load(f)
    assert set(rates["chosen"]) == set(METHODS_UNDER_TEST)
    for name, chosen in rates["chosen"].items():
        nll = {float(lr): value for lr, value in rates["validation_nll"][name].items()}
        assert chosen == seed_analysis.choose_learning_rate(nll)
        grid_dirs = {lr: os.path.join(out, "runs", name if lr == 1e-3 else f"{name}@lr{lr:g}", "seed1")
                     for lr in (5e-4, 1e-3, 2e-3)}
        for lr, rdir in grid_dirs.items():
            with open(os.path.join(rdir, "config.json")) as f:
                train_argv = json.load(f)["train_argv"]
            assert train_argv[train_argv.index("--lr") + 1] == str(lr)
            assert train_argv[train_argv.index("--optimizer") + 1] == "adam_with_overrides"
            assert comparison.learning_curve(os.path.join(rdir, "run.log"))[4] == pytest.approx(nll[lr], abs=1e-3)
    rows = {row["method"]: [run["seed"] for run in row["runs"]] for row in results["methods"]}
    main_rows = {comparison.at_learning_rate(METHODS[name], lr, 1e-3).name for name, lr in rates["chosen"].items()}
    assert all(rows[name] == [1, 2] for name in main_rows)
    assert all(seeds == [1] for name, seeds in rows.items() if name not in main_rows and "@8" not in name)
    with open(os.path.join(out, "longer_budget.json")) as f:
        longer = json.load(f)
    assert longer["methods"] == METHODS_UNDER_TEST and longer["budget"] == 8
    longer_rows = {name for name in rows if name.endswith("@8")}
    assert len(longer_rows) == 2 and all(rows[name] == [1, 2] for name in longer_rows)
    for name in longer_rows:
        with open(os.path.join(out, "runs", name, "seed1", "config.json")) as f:
            train_argv = json.load(f)["train_argv"]
        assert train_argv[train_argv.index("--total-num-update") + 1] == "8"
    reviewed = results["reviewed"]
    assert set(reviewed["verdicts"]) == {name for name in main_rows if not name.startswith("transformer")}
    assert reviewed["longer_verdicts"] and all(row["seeds"] == 2 for row in reviewed["longer_verdicts"].values())
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        md = f.read()
    assert "## Learning rates" in md and "## Verdicts at the chosen learning rates" in md
    # every run scored: the baselines and the grid's runs at rates not chosen wait for no verdict
    by_name = {row["method"]: row for row in results["methods"]}
    baseline = comparison.at_learning_rate(METHODS["transformer"], rates["chosen"]["transformer"], 1e-3).name
    assert by_name[baseline]["baseline"] == baseline and by_name[f"{baseline}@8"]["baseline"] == f"{baseline}@8"
    assert all(by_name[name]["baseline"] is None for name in rows if name not in main_rows and "@8" not in name)
    assert "pending" not in "\n".join(report.summary_table(results))  # results.md: other tests report on `out` too
    assert "## Verdicts at the longer budget" in md
    with open(os.path.join(out, "runs", "surface_fusion", "seed1", "config.json")) as f:
        config = json.load(f)
    assert len(config["data_sha256"]) == 64
    with open(os.path.join(out, "runs", "surface_fusion", "seed1", "run.log"), encoding="utf-8") as f:
        assert '"cpu_flags": "' in f.read()


def test_the_reviewed_round_trains_on_its_cpu_kind_only(tmp_path, monkeypatch):
    """A step of the round on another CPU kind than the plan's is refused in one line naming both."""
    settings = comparison.parse_settings(["--reviewed", "--out", str(tmp_path), "--device", "cpu"])
    experiment = object.__new__(comparison.Experiment)
    experiment.settings = settings
    monkeypatch.setattr(comparison, "cpu_name", lambda: "Intel(R) Xeon(R) CPU @ 2.20GHz (family 6, model 79)")
    with pytest.raises(comparison.ComparisonError, match="--cpu-kind AMD EPYC: this machine is Intel"):
        experiment.start("transformer", 1, "train", 3000)


@pytest.mark.parametrize("flags,message", [
    (["--seeds", "1"], "--seeds 1: at least 2 distinct seeds (the paired analysis needs the spread between seeds)"),
    (["--seeds", "1", "1", "2"], "--seeds 1 1 2: at least 2 distinct seeds"),
    (["--longer-seeds", "1"], "--longer-seeds 1: at least 2 distinct seeds"),
    (["--seeds", "1", "2", "--longer-seeds", "2", "3"], "--longer-seeds: [3] not among --seeds"),
    (["--learning-rates", "0.0005", "0.002"], "unrecognized arguments: --learning-rates"),
    (["--methods", "transformer,deeprep_finetuned"], "unknown method(s) 'deeprep_finetuned'; known methods: "
                                                     "transformer, mlrf"),
    (["--methods", "composition"], "unknown method(s) 'composition'"),
    (["--deep"], "unrecognized arguments: --deep"),
    (["--finetune-update", "1000"], "unrecognized arguments: --finetune-update"),
])
def test_what_the_design_cannot_run_is_refused_before_any_work(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as error:
        main(["--out", str(tmp_path / "out"), *flags])
    assert message in f"{error.value.code} {capsys.readouterr().err}"
    assert not (tmp_path / "out").exists()


def test_the_capacity_matched_transformer_widens_both_ffns():
    wide = METHODS["transformer_wide"]
    flags = comparison.model_flags(wide, parse_width("6+6:128:512:4"), 984)
    assert flags[flags.index("--encoder-ffn-embed-dim", flags.index("--share-all-embeddings")) + 1] == "984"
    assert flags[-4:] == ["--encoder-ffn-embed-dim", "984", "--decoder-ffn-embed-dim", "984"]
    assert wide.match_target == "deeprep" and comparison.match_candidates(wide, parse_width("6+6:128:512:4"))[0] == 512


def test_the_train_one_worker_trains_the_named_run_with_the_launchers_threads(tmp_path, monkeypatch):
    """``python -m fusion_lab.comparison _train RUN UPDATE``, what ``launch.sh train-one`` starts:
    the run's own training up to UPDATE with OMP_NUM_THREADS threads; anything else is refused in one line."""
    run = tmp_path / "runs" / "transformer" / "seed1"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(comparison, "train_run", lambda *args: calls.append(args))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    comparison.train_one([str(run), "3000"])
    assert calls == [(str(run), 3000, 2)]
    for argv in ([str(run)], [str(run), "many"], [str(tmp_path), "3000"]):
        with pytest.raises(comparison.ComparisonError, match="_train RUN_DIR UPDATE"):
            comparison.train_one(argv)


def exported_round(folder, raw, translations):
    """An exported comparison: ``translations`` {(method, seed): one line per test set's sentence, or None for a
    run not scored yet}; every test set has the same two references, each method's baseline the Transformer."""
    references = ["A man rides a red horse .", "Two dogs play in the snow ."]
    for name in report.TEST_SETS:
        (raw / f"{name}.en").write_text("\n".join(references) + "\n")
    rows = {}
    for (method, seed), lines in translations.items():
        rows.setdefault(method, []).append({"seed": seed, "status": "done" if lines else "running"})
        rdir = folder / "runs" / method / f"seed{seed}"
        rdir.mkdir(parents=True)
        (rdir / "config.json").write_text(json.dumps({"recipe": {"TGT": "en", "LOWERCASE": "1"}, "beam": 5}))
        for name in report.TEST_SETS if lines else ():
            (rdir / "eval-beam5" / "average" / name).mkdir(parents=True)
            (rdir / "eval-beam5" / "average" / name / "hyp.detok").write_text("\n".join(lines) + "\n")
    (folder / "results.json").write_text(json.dumps({"methods": [
        {"method": method, "baseline": "transformer", "runs": runs} for method, runs in rows.items()]}))
    return references


def test_the_metrics_beside_bleu_are_read_from_an_exported_round(tmp_path, capsys):
    from sacrebleu.metrics import CHRF

    folder, raw = tmp_path / "export", tmp_path / "raw"
    raw.mkdir()
    plain = ["a man rides a horse .", "two dogs play ."]
    better = {1: ["a man rides a red horse .", "two dogs play in the snow ."], 2: ["a man rides a red horse .",
                                                                                 "two dogs play ."]}
    references = exported_round(folder, raw, {("transformer", 1): plain, ("transformer", 2): plain,
                                              ("mlrf", 1): better[1], ("mlrf", 2): better[2], ("fgla", 1): better[1],
                                              ("fgla", 2): None})
    summary = report.secondary_metrics_of(str(folder), str(raw))
    assert sorted(summary) == ["fgla", "mlrf", "transformer"]
    chrf = [CHRF(lowercase=True).corpus_score(better[seed], [references]).score
            - CHRF(lowercase=True).corpus_score(plain, [references]).score for seed in (1, 2)]
    found = summary["mlrf"]["test_2017_mscoco"]["chrf"]
    assert found["difference"] == pytest.approx(sum(chrf) / 2) and found["difference"] > 0
    assert summary["transformer"]["all"]["length_ratio"]["difference"] is None  # its own baseline
    fgla = summary["fgla"]["all"]["chrf"]  # seed 2 not scored yet: paired on seed 1
    assert fgla["difference"] == pytest.approx(chrf[0]) and fgla["mean"] == pytest.approx(
        CHRF(lowercase=True).corpus_score(better[1] * 4, [references * 4]).score)
    assert summary["mlrf"]["all"]["length_ratio"]["mean"] == pytest.approx((14 / 14 + 11 / 14) / 2)  # 7 + 7 reference tokens

    report.main(["secondary", str(folder), str(raw)])
    printed = capsys.readouterr().out
    assert printed.count("| configuration | BLEU | chrF | BLEU without BP | length ratio |") == 5
    assert f"| mlrf | {summary['mlrf']['all']['bleu']['mean']:.2f} (+" in printed


def test_the_metrics_beside_bleu_refuse_a_folder_that_is_no_export_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        report.main(["secondary", str(tmp_path), str(tmp_path)])
    message = capsys.readouterr().err
    assert error.value.code == 2 and len(message.strip().splitlines()) == 1
    assert "results.json" in message and "FOLDER: an exported comparison" in message


def test_a_rule_that_cannot_decide_stops_the_runner_in_one_line():
    """A grid whose every run diverged: the seed analysis's ValueError ended the runner in a traceback."""
    from types import SimpleNamespace

    def undecidable():
        raise ValueError("validation: every run of the grid diverged (no finite score); no learning rate can be chosen")

    stub = SimpleNamespace(settings=SimpleNamespace(stage="train", jobs=1), choose_learning_rates=undecidable,
                           choose_longer_budget=lambda: None, runs=lambda: [])
    with pytest.raises(comparison.ComparisonError) as error:
        comparison.Experiment.run(stub)
    assert str(error.value) == ("compare_methods: error: validation: every run of the grid diverged (no finite score); "
                                "no learning rate can be chosen")


@pytest.mark.parametrize("hours, text", [
    ({"planned": 290, "actual": 55.8}, "CPU-hours: planned 290; actual so far 55.8 (training and test decoding summed"),
    ({"planned": None, "actual": None}, "CPU-hours: planned –; actual so far not counted (--threads not given: the "
                                        "runs' torch threads are unknown)."),
])
def test_cpu_hours_are_counted_only_where_the_threads_are_known(hours, text):
    """Without --threads, torch trains on every core: the seconds times 1 were reported as CPU-hours."""
    assert report.cost({"cpu_hours": hours})[-1].startswith(text)

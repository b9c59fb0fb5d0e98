"""Updates and time to a reference model's validation loss (``fusion-fairseq-benchmark --time-to-loss``)
and the DenseNMT recipe that uses it (examples/dense_nmt/time_to_loss.sh)."""

import json
import os
import subprocess

import pytest

from fusion_lab import benchmark
from fusion_lab.benchmark import BenchmarkError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "examples", "dense_nmt", "time_to_loss.sh")


def write_log(path, walls, valid):
    """A fairseq json log: train_inner lines {update: train_wall of the interval}, valid lines {update: nll}."""
    lines = [f'2026-01-01 | INFO | train_inner | {{"num_updates": "{u}", "train_wall": "{w}"}}' for u, w in walls.items()]
    lines += [f'2026-01-01 | INFO | valid | {{"valid_nll_loss": "{nll}", "valid_num_updates": "{u}"}}'
              for u, nll in valid.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_updates_and_seconds_to_the_references_best_nll(tmp_path):
    reference = write_log(tmp_path / "residual.log", {10: 50, 20: 50, 30: 50, 40: 50}, {20: 6.0, 40: 4.0})
    faster = write_log(tmp_path / "dense.log", {10: 60, 20: 60, 30: 60}, {10: 5.0, 20: 3.9, 30: 3.5})
    never = write_log(tmp_path / "never.log", {10: 10}, {10: 7.0})
    result = benchmark.time_to_loss(reference, [faster, never])
    assert result["target_nll"] == 4.0
    ref, dense, slow = result["rows"]
    assert (ref["updates_to_target"], ref["train_seconds_to_target"], ref["updates_ratio"]) == (40, 200.0, 1.0)
    # train_wall is per log interval: 60 + 60 seconds up to update 20, each line rounded to whole seconds
    assert (dense["updates_to_target"], dense["train_seconds_to_target"], dense["train_seconds_bound"]) == (20, 120.0, 1.0)
    assert dense["updates_ratio"] == 0.5 and dense["time_ratio"] == pytest.approx(0.6)
    assert slow["updates_to_target"] is None and "updates_ratio" not in slow
    table = benchmark.time_to_loss_table(result)
    assert "> 10" in table and "0.50" in table and "0.60" in table and "120 ± 1.0" in table
    assert "no time ratio" not in table


def test_a_time_lost_in_rounding_gets_no_ratio(tmp_path):
    """Steps shorter than half a second logged one by one: fairseq writes train_wall 0 or 1 for each, so
    the sum says little; the recipe once logged every update of 6-second steps, ±0.5 s each."""
    reference = write_log(tmp_path / "residual.log", {u: 1 for u in range(1, 41)}, {20: 6.0, 40: 4.0})
    dense = write_log(tmp_path / "dense.log", {u: 0 for u in range(1, 21)}, {10: 5.0, 20: 3.9})
    result = benchmark.time_to_loss(reference, [dense])
    ref, dense_row = result["rows"]
    assert (ref["train_seconds_to_target"], ref["train_seconds_bound"]) == (40.0, 20.0)
    assert "time_ratio" not in ref and "time_ratio" not in dense_row and dense_row["updates_ratio"] == 0.5
    table = benchmark.time_to_loss_table(result)
    assert "40 ± 20.0" in table and f"no time ratio where a time is not known to within 5% " in table
    assert table.rstrip().endswith(f"{reference}, {dense}")


def test_a_long_log_interval_resolves_the_time(tmp_path):
    """The bound counts log lines, not updates: the same seconds logged every 20 updates are known to 2.5%."""
    reference = write_log(tmp_path / "residual.log", {20: 20, 40: 20}, {20: 6.0, 40: 4.0})
    dense = write_log(tmp_path / "dense.log", {20: 25}, {20: 3.9})
    ref, dense_row = benchmark.time_to_loss(reference, [dense])["rows"]
    assert ref["train_seconds_bound"] == 1.0 and dense_row["train_seconds_bound"] == 0.5
    assert dense_row["time_ratio"] == pytest.approx(25 / 40)


def test_a_cross_entropy_log_gives_its_loss_as_the_nll(tmp_path):
    """fairseq's cross_entropy criterion (the DenseNMT and MLRF recipes') logs valid_loss, no valid_nll_loss."""
    log = tmp_path / "ce.log"
    log.write_text('2026-01-01 | INFO | train_inner | {"num_updates": "10", "train_wall": "4"}\n'
                   '2026-01-01 | INFO | valid | {"valid_loss": "5.057", "valid_num_updates": "10"}\n')
    assert benchmark.time_to_loss(str(log), [])["target_nll"] == 5.057


def test_seconds_are_interpolated_between_log_lines():
    assert benchmark.seconds_at({10: 10.0, 20: 30.0}, 15) == 20.0
    assert benchmark.seconds_at({10: 10.0}, 5) == 5.0
    assert benchmark.seconds_at({10: 10.0}, 11) is None


def test_a_log_without_validation_is_refused(tmp_path):
    empty = write_log(tmp_path / "a.log", {10: 1.0}, {})
    with pytest.raises(BenchmarkError, match="no validation lines"):
        benchmark.time_to_loss(empty, [empty])
    with pytest.raises(BenchmarkError, match="--time-to-loss .*missing.log: no such file"):
        benchmark.time_to_loss(str(tmp_path / "missing.log"), [empty])


def test_time_to_loss_from_the_command_line(tmp_path, capsys):
    reference = write_log(tmp_path / "residual.log", {10: 5.0, 20: 5.0}, {10: 6.0, 20: 4.0})
    dense = write_log(tmp_path / "dense.log", {10: 6.0, 20: 6.0}, {10: 3.9, 20: 3.5})
    out = tmp_path / "t.json"
    result = benchmark.run(["--time-to-loss", reference, dense, "--json", str(out)])
    assert json.loads(out.read_text())["rows"][1]["updates_to_target"] == 10 == result["rows"][1]["updates_to_target"]
    assert "target: the reference's best validation NLL, 4.000" in capsys.readouterr().out


@pytest.mark.slow
def test_recipe_trains_both_models_and_reports(tiny_joined_data_bin, tmp_path):
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run(["bash", RECIPE, tiny_joined_data_bin, str(out)], capture_output=True, text=True,
                            cwd=cwd, timeout=900, env={**os.environ, "MAX_UPDATE": "4", "VALID_EVERY": "2", "MAX_TOKENS": "300",
                                              "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "target: the reference's best validation NLL" in result.stdout
    report = json.loads((out / "time_to_loss.json").read_text())
    residual, dense = report["rows"]
    assert residual["reference"] and residual["updates_to_target"] is not None
    assert sorted(map(int, residual["curve"])) == [2, 4] and sorted(map(int, dense["curve"])) == [2, 4]
    # training time logged once per validation interval, not per update (each line is rounded to seconds)
    assert [json.loads(line.split("| train_inner | ")[1])["num_updates"]
            for line in (out / "dense.log").read_text().splitlines() if "| train_inner | " in line] == ["2", "4"]
    assert "FConvModel" in (out / "residual.log").read_text() and "DenseFConvModel" in (out / "dense.log").read_text()
    # each model probes its own save directory inside OUT: the two concurrent runs sharing fairseq's
    # default ./checkpoints raced on its probe file (FileNotFoundError: 'checkpoints/dummy')
    assert list(cwd.iterdir()) == []
    assert {p.name for p in out.glob("checkpoints-*")} == {"checkpoints-residual", "checkpoints-dense"}


def test_recipe_refuses_a_directory_without_data(tmp_path):
    result = subprocess.run(["bash", RECIPE, str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "no binarised training data" in result.stderr

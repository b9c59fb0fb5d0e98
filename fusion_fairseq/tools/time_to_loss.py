"""Updates (and training time) a model needs to reach a reference model's validation loss.

Shen et al. (NAACL 2018) report DenseNMT's benefit as "29% less time to the same loss" next to
8.1% slower steps. This reads fairseq-train logs written with ``--log-format json`` (validation
every ``--validate-interval-updates``), takes the reference's best validation NLL as the target
and reports, per log, the first validated update at or below it and the training time up to
there (the sum of fairseq's ``train_wall`` up to that update: time spent in training steps,
validation excluded; interpolated between log lines).

    python -m fusion_fairseq.tools.time_to_loss --reference residual.log dense.log [--json out.json] [--force]

``--json`` is checked before the logs are read: an existing file is overwritten only with ``--force``.
"""

import argparse
import json
import re
import sys
from typing import Dict, List, Optional

from fusion_fairseq.tools.analysis import UsageError, add_force_argument, check_outputs, write_json
from fusion_fairseq.tools.comparison import learning_curve, updates_to_reach

TRAIN_LINE = re.compile(r"\|\s*train_inner\s*\|\s*(\{.*\})\s*$")


def train_wall_at_updates(log_path: str) -> Dict[int, float]:
    """{update: training seconds so far} from the ``train_inner`` lines of a json log (fairseq's
    ``train_wall`` there covers one log interval, so it is summed)."""
    walls: Dict[int, float] = {}
    total = 0.0
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = TRAIN_LINE.search(line)
            if m:
                stats = json.loads(m.group(1))
                total += float(stats["train_wall"])
                walls[int(stats["num_updates"])] = total
    return walls


def seconds_at(walls: Dict[int, float], update: int) -> Optional[float]:
    """train_wall at ``update``, linearly interpolated between logged updates (None if beyond)."""
    points = sorted(walls.items())
    previous = (0, 0.0)
    for u, seconds in points:
        if u >= update:
            (u0, s0) = previous
            return s0 + (seconds - s0) * (update - u0) / (u - u0) if u > u0 else seconds
        previous = (u, seconds)
    return None


def compare(reference: str, logs: List[str]) -> dict:
    curves = {path: learning_curve(path) for path in [reference, *logs]}
    for path, curve in curves.items():
        if not curve:
            raise SystemExit(f"error: {path}: no validation lines (train with --log-format json and "
                             "--validate-interval-updates N)")
    target = min(curves[reference].values())
    rows = []
    for path, curve in curves.items():
        reached = updates_to_reach(curve, target)
        seconds = seconds_at(train_wall_at_updates(path), reached) if reached is not None else None
        rows.append({"log": path, "reference": path == reference, "best_nll": min(curve.values()),
                     "last_update": max(curve), "updates_to_target": reached, "train_seconds_to_target": seconds,
                     "curve": curve})
    base = rows[0]
    for row in rows:
        if row["updates_to_target"] is not None:
            row["updates_ratio"] = row["updates_to_target"] / base["updates_to_target"]
        if row["train_seconds_to_target"] and base["train_seconds_to_target"]:
            row["time_ratio"] = row["train_seconds_to_target"] / base["train_seconds_to_target"]
    return {"target_nll": target, "rows": rows}


def ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "-"


def format_table(result: dict) -> str:
    lines = [f"target: the reference's best validation NLL, {result['target_nll']:.3f} (base 2)",
             f"{'log':40s} {'best NLL':>9s} {'updates':>8s} {'ratio':>6s} {'train s':>8s} {'ratio':>6s}"]
    for row in result["rows"]:
        updates = row["updates_to_target"]
        seconds = row["train_seconds_to_target"]
        cells = [str(updates) if updates is not None else f"> {row['last_update']}", ratio(row, "updates_ratio"),
                 f"{seconds:.0f}" if seconds is not None else "-", ratio(row, "time_ratio")]
        lines.append(f"{row['log'][-40:]:40s} {row['best_nll']:9.3f} {cells[0]:>8s} {cells[1]:>6s} {cells[2]:>8s} "
                     f"{cells[3]:>6s}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m fusion_fairseq.tools.time_to_loss", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, help="fairseq-train log of the reference (e.g. residual) model")
    parser.add_argument("logs", nargs="+", help="fairseq-train logs of the models to compare")
    parser.add_argument("--json", help="also write the result as JSON")
    add_force_argument(parser)
    args = parser.parse_args(argv)
    try:
        check_outputs(args, [("--json", args.json)], inputs=[("--reference", args.reference)] +
                      [("log", log) for log in args.logs])
    except UsageError as error:
        parser.exit(error.exit_status, f"{parser.prog}: error: {error}\n")
    result = compare(args.reference, args.logs)
    print(format_table(result))
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

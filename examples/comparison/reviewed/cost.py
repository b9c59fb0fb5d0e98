"""CPU-hours per 3,000-update run of each configuration, measured from the committed 6+6 records
(examples/comparison/deep/runs/*/seed*/sessions.json and done.json): the wall seconds of every training
session that ran with one torch thread, over the updates it trained (validations included), times 3,000,
plus the run's test decoding; update-weighted over the configuration's runs. One thread on a 2-core CPU
machine: a wall hour is a CPU-hour.

    python examples/comparison/reviewed/cost.py
"""
import glob
import json
import os

DEEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deep", "runs")
BUDGET = 3000


def measured_cpu_hours():
    found = {}
    for method_dir in sorted(glob.glob(os.path.join(DEEP, "*"))):
        seconds = updates = decoding = runs = 0
        for run in sorted(glob.glob(os.path.join(method_dir, "seed*"))):
            with open(os.path.join(run, "sessions.json"), encoding="utf-8") as f:
                sessions = json.load(f)
            with open(os.path.join(run, "done.json"), encoding="utf-8") as f:
                done = json.load(f)
            for s in sessions:
                if s["device"].endswith(" 1 torch threads") and s.get("to_update") is not None:
                    seconds += s["end"] - s["start"]
                    updates += s["to_update"] - s["from_update"]
            decoding += done["generate_seconds"]
            runs += 1
        found[os.path.basename(method_dir)] = {
            "seconds_per_update": round(seconds / updates, 3), "one_thread_updates": updates, "runs": runs,
            "cpu_hours_per_run": round((seconds / updates * BUDGET + decoding / runs) / 3600, 2)}
    return found


if __name__ == "__main__":
    for name, row in measured_cpu_hours().items():
        print(f"{name:24s} {row['cpu_hours_per_run']:5.2f} CPU-h per {BUDGET}-update run "
              f"({row['seconds_per_update']:.2f} s/update over {row['one_thread_updates']:,} one-thread updates, "
              f"{row['runs']} runs)")

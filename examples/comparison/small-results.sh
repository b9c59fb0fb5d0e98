#!/usr/bin/env bash
# The small results of a comparison's folder (scripts/compare_methods.py --out DIR), one path a line,
# relative to DIR: the report and its decisions, and per run its records, log, scores and test
# hypotheses; no checkpoint, no data. What examples/comparison/launch.sh exports into the repository.
# Not the runner's plan.json: a cache of model flags and sizes (results.json holds them) that every start
# recomputes, and an export folder's plan.json is the plan written before the runs (reviewed/plan.json).
#
#   bash examples/comparison/small-results.sh DIR
set -euo pipefail
cd -- "${1:?usage: small-results.sh DIR}"
ls -d results.md results.json learning_curves.png budget.json composition.json third_seed.json \
    learning_rates.json longer_budget.json \
    2>/dev/null || true
find runs -type f \( -name config.json -o -name sessions.json -o -name done.json -o -name paired.json \
        -o -name run.log -o \( -path '*/eval-*' \( -name scores.json -o -name hyp.detok \) \) \) 2>/dev/null || true

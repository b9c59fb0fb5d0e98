#!/usr/bin/env bash
# The reviewed comparison (examples/comparison/reviewed/plan.md): every configuration of the 6+6 table that
# trains from scratch, mHC, MUDDFormer and a Transformer widened to deep representations' size, each at its
# own learning rate (a grid of 5e-4, 1e-3 and 2e-3 on seed 1, chosen on the validation set), on six paired
# seeds, then twice the budget for the Transformer and every configuration decided better or worse; the
# 6+6 comparison's runs that count are reused. On a 2-core CPU machine: two runs of one thread each at the
# lowest priority, in the background, resumed by running the same step again.
#
#   bash examples/comparison/reviewed.sh train    EXP RAW   start or resume the training (returns at once)
#   bash examples/comparison/reviewed.sh status   EXP       is it training; the report of what exists
#   bash examples/comparison/reviewed.sh evaluate EXP RAW   score the runs that reached their budget
#   bash examples/comparison/reviewed.sh export   EXP       the report and every run's small results into
#                                                            examples/comparison/reviewed/
#   bash examples/comparison/reviewed.sh restore  EXP RAW   the exported evaluated runs back into a lost EXP
#   bash examples/comparison/reviewed.sh train-one EXP RUN  one run alone with every core, 'train' stopped
#
# Every step runs the code of PIN from a checkout of it in EXP/code, in EXP/venv with the package versions
# of reviewed/requirements-lock.txt. EXP: a new folder outside the repository; RAW: the Multi30k task-1 raw
# files. The learning rates, the longer budget's configurations and the verdicts are decided by the rules
# of fusion_fairseq/tools/seed_analysis.py at PIN, in the order plan.md gives.
set -euo pipefail
NAME=reviewed
PIN=d01d8aee055696f3fa48457850339f8b41cc3c9a  # the commit every step runs
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# --reuse: the runner at PIN copies the 6+6 runs that count (plan.md, "Runs that count") before any run trains
COMPARISON_ARGS=(--reviewed --max-update 3000 --eval-every 250 --jobs 2 --threads 1 --planned-cpu-hours 290
                 --reuse "$HERE/deep")
STARTED_FROM_TRANSFORMER=()
source "$HERE/launch.sh"

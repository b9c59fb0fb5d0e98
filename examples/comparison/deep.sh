#!/usr/bin/env bash
# The 6+6 comparison (examples/comparison/README.md, "The 6+6 comparison (planned)"): every method of the
# 3+3 table, DenseFormer, hyper-connections, the composition, and deep representations fine-tuned from the
# Transformer beside the Transformer continued, at --deep (6+6, d=128, FFN 512, 4 heads; linear decay to 0
# at a fixed budget), seeds 1 and 2 and a third where two do not decide, on a 2-core CPU machine: two runs
# of one thread each at the lowest priority, in the background.
#
# Every step runs the code of one commit, PIN, from a checkout of it in EXP/code, with EXP/venv, an
# environment this script made where that checkout is the installed plugin: work on main cannot change a
# run halfway, and the verdict rule is the one fixed in that commit before any test score.
#
#   bash examples/comparison/deep.sh train    EXP RAW   start or resume the training (returns at once)
#   bash examples/comparison/deep.sh train-one EXP RUN  train one run (runs/METHOD/seedN) alone with every
#                                                        core, 'train' stopped: where one thread is too slow
#                                                        for a run to reach its budget while EXP is kept
#   bash examples/comparison/deep.sh status   EXP       is it training; the report of what exists
#   bash examples/comparison/deep.sh evaluate EXP RAW   score the runs that reached their budget
#   bash examples/comparison/deep.sh export   EXP       copy the report and every run's small results
#                                                        into examples/comparison/deep/
#   bash examples/comparison/deep.sh restore  EXP RAW   copy the exported evaluated runs back into an EXP
#                                                        that was lost (same path), before 'train'
#
# EXP: a folder this script creates (a new path), kept until the comparison is done, never in the repository.
# RAW: the Multi30k task-1 raw files (train/val/test_*.de/.en). The order: train until every run of seeds
# 1 and 2 reached its budget, evaluate, train again (the third seed is decided from the scores), evaluate.
# Any step can be killed at any time and is resumed by running it again.
set -euo pipefail
NAME=deep
PIN=5a7244477998b0354e1aa66b8248b32c67e6ac30  # the commit every step runs
COMPARISON_ARGS=(--deep --max-update 3000 --finetune-update 1000 --eval-every 250 --seeds 1 2 --jobs 2 --threads 1
                 --planned-cpu-hours 72)
STARTED_FROM_TRANSFORMER=(transformer_continued deeprep_finetuned)
source "$(dirname "${BASH_SOURCE[0]}")/launch.sh"

#!/usr/bin/env bash
# The 3+3 (shallow) comparison: the seven methods of its time and one composition, seeds 1 and 2, at
# --small width, every run to one budget calibrated on the Transformer (--max-update auto, inverse-sqrt
# schedule), on a 2-core CPU machine: two runs of one thread each at the lowest priority, in the
# background. Finished; its results are in examples/comparison/converged/ and the README.
#
#   bash examples/comparison/converged.sh train    EXP RAW   start or resume the training (returns at once)
#   bash examples/comparison/converged.sh status   EXP       is it training; the report of what exists
#   bash examples/comparison/converged.sh evaluate EXP RAW   evaluate the runs that reached the budget
#   bash examples/comparison/converged.sh export   EXP       copy the report and every run's small results
#                                                             into examples/comparison/converged/
#
# EXP: a folder this script creates (a new path), kept until the comparison is done, never in the
# repository; RAW: the Multi30k task-1 raw files. Every step runs the code of PIN (see launch.sh).
# Any step can be killed at any time and is resumed by running it again.
set -euo pipefail
NAME=converged
PIN=ac30f16cdfe7b83a8c5f4da3396ed6e6f6c7e22d
COMPARISON_ARGS=(--small --max-update auto --eval-every 250 --seeds 1 2 --jobs 2 --threads 1
                 --methods transformer,mlrf,deeprep,surface_fusion,fgla,layerwise_coordination,dense_transformer,composition)
STARTED_FROM_TRANSFORMER=()
source "$(dirname "${BASH_SOURCE[0]}")/launch.sh"

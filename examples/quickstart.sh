#!/usr/bin/env bash
# The main job of fusion-fairseq: train fairseq's Transformer and MLRF (Both-FNN-SA) at the same
# size and budget, then compare BLEU, parameters and speed. All the logic is in
# fusion_lab/quickstart.py; every option is passed through (see --help).
#
#   examples/quickstart.sh                                   # synthetic corpus, < 10 min on 2 CPU cores
#   examples/quickstart.sh --train-size 300 --max-update 20  # smoke run
#   examples/quickstart.sh --data data/multi30k.de-en --out m30k_out   # after python -m fusion_lab.corpus prepare multi30k --dest data/multi30k.de-en
#
# PYTHON selects the interpreter (default: python3, else python) that has fusion-fairseq installed.
set -euo pipefail
PYTHON="${PYTHON:-$(command -v python3 || echo python)}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
exec "$PYTHON" -m fusion_lab.quickstart "$@"

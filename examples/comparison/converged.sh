#!/usr/bin/env bash
# The converged comparison: the seven methods of scripts/compare_methods.py and one composition, seeds
# 1 and 2, at --small width, every run to one budget calibrated on the Transformer (--max-update auto),
# on a 2-core CPU machine: two runs of one thread each at the lowest priority, in the background.
#
# Training runs from a checkout of the repository pinned at PIN (outside this working tree, in
# EXP/code), so work on main cannot change a run halfway; tests/test_golden_outputs.py proves main
# still computes the same functions. Evaluation and the report run from this working tree.
#
#   bash examples/comparison/converged.sh train    [EXP]   start or resume the training (returns at once)
#   bash examples/comparison/converged.sh status   [EXP]   is it training; the report of what exists
#   bash examples/comparison/converged.sh evaluate [EXP]   evaluate the runs that reached the budget
#   bash examples/comparison/converged.sh export   [EXP]   copy the report and every run's small results
#                                                           into examples/comparison/converged/
#
# EXP (default $HOME/experiments/converged) keeps the data, checkpoints and logs; it must survive
# between working sessions and never goes into the repository. Any step can be killed at any time and
# is resumed by running it again.
set -euo pipefail
PIN=ac30f16cdfe7b83a8c5f4da3396ed6e6f6c7e22d
REPO=$(cd "$(dirname "$0")/../.." && pwd)
STEP=${1:-}
EXP=$(mkdir -p "${2:-$HOME/experiments/converged}" && cd "${2:-$HOME/experiments/converged}" && pwd)
ARGS=(--out "$EXP" --small --max-update auto --eval-every 250 --seeds 1 2 --jobs 2 --threads 1
      --methods transformer,mlrf,deeprep,surface_fusion,fgla,layerwise_coordination,dense_transformer,composition)
PIDFILE=$EXP/train.pid
mkdir -p "$EXP/logs"
# EXP is this script's own: stamped as compare_methods.py's output directory (see its --force)
[[ -f "$EXP/.written_by" ]] || printf 'fusion-fairseq compare_methods.py\n' > "$EXP/.written_by"

training() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

case "$STEP" in
    train)
        if training; then echo "already training (pid $(cat "$PIDFILE")); log: $EXP/logs/train.log"; exit 0; fi
        if [[ ! -d "$EXP/code/.git" ]]; then git clone --quiet --no-checkout "$REPO" "$EXP/code"; fi
        git -C "$EXP/code" cat-file -e "$PIN^{commit}" 2>/dev/null || git -C "$EXP/code" fetch --quiet "$REPO"
        git -C "$EXP/code" checkout --quiet --detach "$PIN"
        # its own environment, where the pinned checkout is the installed plugin (an editable install of
        # this working tree elsewhere would otherwise be imported by the training processes)
        if [[ ! -x "$EXP/venv/bin/python" ]] || ! "$EXP/venv/bin/python" -c 'import fusion_fairseq' 2>/dev/null; then
            "${PYTHON:-python3}" -m venv --clear "$EXP/venv"
            "$EXP/venv/bin/python" -m pip install --quiet torch==2.13.0
            "$EXP/venv/bin/python" -m pip install --quiet -e "$EXP/code"
        fi
        cd "$EXP"  # python -c and -m import from the working directory first: not from a checkout of main
        [[ "$("$EXP/venv/bin/python" -c 'import fusion_fairseq, os; print(os.path.dirname(fusion_fairseq.__path__[0]))')" \
            == "$EXP/code" ]] || { echo "$EXP/venv does not import the pinned checkout" >&2; exit 1; }
        nohup nice -n 19 "$EXP/venv/bin/python" "$EXP/code/scripts/compare_methods.py" "${ARGS[@]}" --stage train \
            >> "$EXP/logs/train.log" 2>&1 < /dev/null &
        echo $! > "$PIDFILE"
        echo "training in the background at nice 19 (pid $!), code at $PIN; log: $EXP/logs/train.log" ;;
    status)
        if training; then echo "training (pid $(cat "$PIDFILE"))"; else echo "not training"; fi
        "${PYTHON:-python3}" "$REPO/scripts/compare_methods.py" "${ARGS[@]}" --report-only | grep -v '^INFO' || true
        echo "report: $EXP/results.md" ;;
    evaluate)
        nice -n 19 "${PYTHON:-python3}" "$REPO/scripts/compare_methods.py" "${ARGS[@]}" --stage evaluate ;;
    export)
        # the small results (report, scores, configuration, curves, logs; no checkpoints, no data) into
        # the repository, from a report written anew
        "${PYTHON:-python3}" "$REPO/scripts/compare_methods.py" "${ARGS[@]}" --report-only | grep -v '^INFO' || true
        DEST=$REPO/examples/comparison/converged
        mkdir -p "$DEST"
        for f in results.md results.json learning_curves.png budget.json composition.json plan.json; do
            [[ -f "$EXP/$f" ]] && cp "$EXP/$f" "$DEST/$f"
        done
        for run in "$EXP"/runs/*/seed*; do
            [[ -d "$run" ]] || continue
            to=$DEST/runs/${run#"$EXP/runs/"}
            mkdir -p "$to"
            for f in config.json sessions.json done.json paired.json run.log; do
                [[ -f "$run/$f" ]] && cp "$run/$f" "$to/$f"
            done
            (cd "$run" && find . -path './eval-*' -name scores.json -exec cp --parents {} "$to" \;)
        done
        echo "exported to $DEST" ;;
    *)
        echo "usage: $0 train|status|evaluate|export [EXP]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The steps of a comparison, shared by examples/comparison/deep.sh and converged.sh, which set NAME
# (the script's name and the folder under examples/comparison/ that export fills), PIN (the commit
# every step runs), COMPARISON_ARGS (scripts/compare_methods.py's arguments but --out and --raw) and
# STARTED_FROM_TRANSFORMER (the methods whose runs start from the Transformer's final model of their
# seed), then source this file with their own command line: STEP EXP [RAW].
#
# Every step runs the code of PIN from a checkout of it in EXP/code, with EXP/venv, an environment
# made here where that checkout is the installed plugin: work on main cannot change a run halfway.
# Nothing in EXP that this script did not make is trusted: an EXP, a venv or a train.pid of someone
# else is refused, and so is an EXP holding anything owned by another user or writable by group or others
# (checked before any step runs git or Python there); no hook or fsmonitor of a checkout runs, the Pythons
# started here import nothing from the working directory (-P, -I; so does the fairseq-train that main's
# runner starts in a run's folder, where a PIN's older runner starts it without -P in a folder it made
# inside the checked EXP), every file is written by replace_file
# (scripts/files.sh), and export copies regular files inside EXP only.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$REPO/scripts/files.sh"
umask 022  # what the steps make stays closed to others' writes: trusted by the next step
# glibc keeps the memory the steps free for their next tensors (heap only, never trimmed) instead of handing it
# back to the kernel and faulting it in again zeroed: the same numbers to the bit, 14-38% less time an update
# of the comparison's models on a 2-core CPU (docs/measurements.md); a process then keeps its peak memory. A
# value already in the environment wins.
export MALLOC_MMAP_MAX_=${MALLOC_MMAP_MAX_:-0} MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-68719476736}
STEP=${1:-}
die() { echo "$NAME.sh: error: $*" >&2; exit 1; }
usage() { echo "usage: $0 train|train-one|status|evaluate|export|restore EXP [RAW|RUN]" >&2; exit 2; }
[[ -n "$STEP" && -n "${2:-}" ]] || usage
[[ -n "$PIN" ]] || die "PIN is empty: set it to the commit the comparison runs before any step"
OWNED=.created_by_${NAME}_sh
RAW_ARGS=()
if [[ "$STEP" == train || "$STEP" == evaluate || "$STEP" == restore ]]; then
    [[ -n "${3:-}" && -f "$3/train.de" ]] || die "RAW '${3:-}': not a folder with the Multi30k raw files (train.de, ...)"
    RAW=$(cd "$3" && pwd)
    RAW_ARGS=(--raw "$RAW")
fi
if [[ ! -e "$2" && ! -L "$2" ]]; then
    [[ "$STEP" == train || "$STEP" == restore ]] || die "EXP $2 does not exist; 'train' or 'restore' creates it"
    mkdir -p "$(dirname -- "$2")"
    mkdir -- "$2" || die "EXP $2 appeared meanwhile; give a new folder"
    EXP=$(cd "$2" && pwd)
    replace_file "$EXP/$OWNED" printf '%s\n' "$EXP"
    replace_file "$EXP/.written_by" printf 'fusion-fairseq compare_methods.py\n'  # compare_methods.py's own output folder
fi
EXP=$(cd "$2" && pwd)
[[ -f "$EXP/$OWNED" && ! -L "$EXP/$OWNED" && "$(cat "$EXP/$OWNED")" == "$EXP" ]] \
    || die "EXP $EXP was not created by this script (no $OWNED naming it); give a new folder"
STRANGER=$(untrusted "$EXP")
[[ -z "$STRANGER" ]] || die "EXP $EXP holds $STRANGER, owned by another user or writable by group or others: nothing runs from it (fix its owner or mode, or give a new folder)"
CODE=$EXP/code VENV=$EXP/venv PY=$EXP/venv/bin/python PIDFILE=$EXP/train.pid
ARGS=(--out "$EXP" "${COMPARISON_ARGS[@]}" "${RAW_ARGS[@]}")
mkdir -p "$EXP/logs"
# no hook or fsmonitor of a checkout ever runs (its configuration is EXP's, checked above)
git_code() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -C "$CODE" "$@"; }

# the training process, only when train.pid names a live process whose command line is this comparison's runner
training() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid; pid=$(cat "$PIDFILE")
    [[ "$pid" =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF "$CODE/scripts/compare_methods.py --out $EXP "
}

# the test-set references that an exported run's done.json ($1) scores against, copied from RAW: the
# evaluation's EXP/test-sets/NAME/raw.LANG is a plain copy of RAW/NAME.LANG, and the report reads it.
# A path of any other shape is not written.
restore_references() {
    local ref source
    while IFS= read -r ref; do
        [[ "$ref" =~ ^"$EXP"/test-sets/([A-Za-z0-9_]+)/raw\.([a-z]+)$ ]] || die "$1 names a reference outside $EXP/test-sets: $ref"
        [[ -e "$ref" ]] && continue
        source="$RAW/${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
        [[ -f "$source" ]] || die "RAW $RAW: no ${BASH_REMATCH[1]}.${BASH_REMATCH[2]}, which $1 was scored against"
        mkdir -p "$(dirname "$ref")"
        replace_file "$ref" cat -- "$source"
    done < <(grep -oE '"raw_ref": "[^"]*"' "$1" | sed -E 's/^"raw_ref": "(.*)"$/\1/' | sort -u)
}

# EXP/code at PIN and EXP/venv importing it, both made by this script; anything else is refused
prepare_code() {
    if [[ ! -e "$CODE" ]]; then
        git -c core.hooksPath=/dev/null -c core.fsmonitor=false clone --quiet --no-checkout "$REPO" "$CODE"
    fi
    git_code cat-file -e "$PIN^{commit}" 2>/dev/null || git_code fetch --quiet "$REPO"
    git_code checkout --quiet --detach "$PIN"
    [[ -z "$(git_code status --porcelain --untracked-files=no)" ]] || die "$CODE differs from $PIN (git status); remove EXP/code to clone it anew"
    if [[ ! -e "$VENV" ]]; then
        "${PYTHON:-python3}" -I -m venv "$VENV"
        replace_file "$VENV/$OWNED" printf '%s\n' "$VENV"
        "$PY" -P -m pip install --quiet torch==2.13.0
        LOCK=$CODE/examples/comparison/$NAME/requirements-lock.txt  # every version, where the comparison locks them
        if [[ -f "$LOCK" ]]; then
            "$PY" -P -m pip install --quiet -r "$LOCK"
            "$PY" -P -m pip install --quiet --no-deps -e "$CODE"
        else
            "$PY" -P -m pip install --quiet -e "$CODE"
        fi
    fi
    [[ -f "$VENV/$OWNED" && ! -L "$VENV/$OWNED" && "$(cat "$VENV/$OWNED")" == "$VENV" ]] \
        || die "$VENV was not created by this script (no $OWNED naming it); remove it to have it made anew"
    cd "$EXP"
    # -P: python -c, -m and a script import nothing from the working directory or the script's folder
    [[ "$("$PY" -P -c 'import fusion_fairseq, os; print(os.path.dirname(fusion_fairseq.__path__[0]))')" == "$CODE" ]] \
        || die "$VENV does not import the pinned checkout $CODE"
}

case "$STEP" in
    train)
        if training; then echo "already training (pid $(cat "$PIDFILE")); log: $EXP/logs/train.log"; exit 0; fi
        for lock in "$EXP"/runs/*/seed*/.lock; do  # a run that 'train-one' trains: the runner would train it too
            [[ ! -f "$lock" ]] || flock -n "$lock" true || die "${lock#"$EXP"/} is held: $(dirname "${lock#"$EXP"/}") \
is training alone ('train-one'); let it finish, or stop it, before 'train'"
        done
        prepare_code
        appendable "$EXP/logs/train.log" || die "$EXP/logs/train.log is a link or has other hard links: not appended to"
        nohup nice -n 19 "$PY" -P "$CODE/scripts/compare_methods.py" "${ARGS[@]}" --stage train \
            >> "$EXP/logs/train.log" 2>&1 < /dev/null &
        replace_file "$PIDFILE" echo "$!"
        echo "training in the background at nice 19 (pid $!), code at $PIN; log: $EXP/logs/train.log" ;;
    train-one)
        # one run, RUN (runs/METHOD/seedN, as 'train' made it), with every core, for a machine held for
        # less time than a run takes at one thread, where 'train's runs of one thread each would all be
        # cut off before their budget: the runner's own worker (_train) up to the run's budget (its
        # --total-num-update), in the background at nice 19, under the run's lock, 'train' stopped.
        # Each training session of the run records its torch threads (sessions.json; the report's
        # devices); the report's CPU-hours count its seconds once, as for every run (--threads 1).
        RUN=${3:-}
        [[ "$RUN" =~ ^runs/[a-z_]+(@lr[0-9.e-]+)?(@[0-9]+)?/seed[0-9]+$ && -f "$EXP/$RUN/config.json" \
           && "$(realpath -e -- "$EXP/$RUN")" == "$EXP/$RUN" ]] \
            || die "RUN '$RUN': not a run that 'train' made in $EXP (runs/METHOD/seedN with its config.json, no link)"
        if training; then die "training (pid $(cat "$PIDFILE")) in $EXP: stop it (kill that pid) before training one run alone"; fi
        flock -n "$EXP/$RUN/.lock" true || die "$RUN is training in another process (its .lock is held)"
        prepare_code
        BUDGET=$("$PY" -P -c 'import json, sys; argv = json.load(open(sys.argv[1]))["train_argv"]
print(argv[argv.index("--total-num-update") + 1])' "$EXP/$RUN/config.json") || die "$RUN/config.json names no --total-num-update"
        THREADS=$(nproc)
        RUNNER=fusion_lab.comparison  # code pinned before the laboratory left the plugin: fusion_fairseq.tools.comparison
        [ -d "$CODE/fusion_lab" ] || RUNNER=fusion_fairseq.tools.comparison
        cd "$EXP/$RUN"  # the run directory, as the runner trains in it (-P: this Python imports nothing from it)
        appendable run.log || die "$RUN/run.log is a link or has other hard links: not appended to"
        printf '\n==== train-one %s threads %s\n' "$(date -u +%FT%T+00:00)" "$THREADS" >> run.log
        OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS PYTHONWARNINGS=ignore nohup nice -n 19 \
            flock -n .lock "$PY" -P -m "$RUNNER" _train "$EXP/$RUN" "$BUDGET" >> run.log 2>&1 < /dev/null &
        echo "training $RUN alone up to update $BUDGET with $THREADS threads in the background at nice 19 (pid $!); log: $EXP/$RUN/run.log" ;;
    status)
        if training; then echo "training (pid $(cat "$PIDFILE"))"; else echo "not training"; fi
        prepare_code
        "$PY" -P "$CODE/scripts/compare_methods.py" "${ARGS[@]}" --report-only | grep -v '^INFO' || true
        echo "report: $EXP/results.md" ;;
    evaluate)
        prepare_code
        nice -n 19 "$PY" -P "$CODE/scripts/compare_methods.py" "${ARGS[@]}" --stage evaluate ;;
    export)
        # the small results (report, scores, configuration, curves, logs; no checkpoints, no data), regular
        # files inside EXP only (no symbolic link is followed or copied), from a report written anew; an
        # evaluated run of the export is kept as it is while EXP trains that run again (after 'restore'
        # left it out: its final model was lost)
        prepare_code
        "$PY" -P "$CODE/scripts/compare_methods.py" "${ARGS[@]}" --report-only | grep -v '^INFO' || true
        DEST=$REPO/examples/comparison/$NAME
        mkdir -p "$DEST"
        cd "$EXP"
        replace_file "$EXP/logs/export.list" bash "$REPO/examples/comparison/small-results.sh" "$EXP"
        while IFS= read -r f; do
            real=$(realpath -e -- "$f" 2>/dev/null) || continue
            [[ -f "$f" && ! -L "$f" && "$real" == "$EXP"/* ]] || { echo "not exported (not a regular file in EXP): $f"; continue; }
            if [[ "$f" =~ ^(runs/[^/]+/seed[0-9]+)/ && -f "$DEST/${BASH_REMATCH[1]}/done.json" && ! -f "$EXP/${BASH_REMATCH[1]}/done.json" ]]; then
                echo "not exported (the export holds ${BASH_REMATCH[1]} evaluated; EXP trains it again): $f"; continue
            fi
            mkdir -p "$DEST/$(dirname "$f")"
            replace_file "$DEST/$f" cat -- "$real"
        done < "$EXP/logs/export.list"
        echo "exported to $DEST" ;;
    restore)
        # the evaluated runs of an export (examples/comparison/NAME/) copied back into EXP, for an EXP that
        # was lost with its machine, with the references from RAW that their scores name: the runner counts
        # them as done, reports them and trains only what is missing. A run is restored only into the EXP
        # path it was evaluated in (done.json names its outputs by that path), never over anything in EXP,
        # and a Transformer run only with every run of its seed that starts from its final model (that
        # model is not exported: without them, it trains again)
        if training; then die "training (pid $(cat "$PIDFILE")) in $EXP: restore before 'train', not beside it"; fi
        SOURCE=$REPO/examples/comparison/$NAME
        for done in "$SOURCE"/runs/*/seed*/done.json; do
            [[ -f "$done" ]] || continue
            run=${done#"$SOURCE/"}; run=${run%/done.json}; seed=${run##*/}
            if [[ -e "$EXP/$run" ]]; then echo "not restored (already in EXP): $run"; continue; fi
            if ! grep -qF "\"hyp_detok\": \"$EXP/$run/" "$done"; then
                echo "not restored (evaluated in another EXP than $EXP): $run"; continue
            fi
            missing=""
            if [[ "$run" == runs/transformer/* ]]; then
                for child in "${STARTED_FROM_TRANSFORMER[@]}"; do
                    [[ -f "$SOURCE/runs/$child/$seed/done.json" ]] || missing=$child
                done
            fi
            if [[ -n "$missing" ]]; then echo "not restored ($missing $seed starts from its model): $run"; continue; fi
            restore_references "$done"
            (cd "$SOURCE" && find "$run" -type f) | while IFS= read -r f; do
                mkdir -p "$EXP/$(dirname "$f")"
                replace_file "$EXP/$f" cat -- "$SOURCE/$f"
            done
            echo "restored: $run"
        done
        for decision in composition.json third_seed.json learning_rates.json longer_budget.json; do  # taken once, never retaken
            if [[ -f "$SOURCE/$decision" && ! -e "$EXP/$decision" ]]; then replace_file "$EXP/$decision" cat -- "$SOURCE/$decision"; fi
        done ;;
    *)
        usage ;;
esac

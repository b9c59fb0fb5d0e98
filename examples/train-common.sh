# Shared helpers of the paper recipes examples/*/train.sh, which source it first; do not run it.
# Sets PROG (the recipe's name, for messages) and REPO_ROOT.

PROG="$(basename "$0")"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../scripts/files.sh
source "$REPO_ROOT/scripts/files.sh"  # replace_file, remove_links

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
common_options_usage() {  # the end of a recipe's usage text, the options all recipes share; $1: example extra arguments
    cat <<EOF
  --user-dir DIR     fairseq --user-dir (default: \$(fusion-fairseq-user-dir), else this checkout's plugin)
  --dry-run          print the fairseq-train command and exit
  -h, --help         this help
Arguments after -- are appended to fairseq-train's (the last occurrence of a flag wins), e.g.
  -- $1
EOF
}
usage_error() { printf '%s: error: %s\n(see %s --help)\n' "$PROG" "$*" "$PROG" >&2; exit 2; }
need_value() { if [[ "$2" -lt 2 ]]; then usage_error "$1 needs a value"; fi; }
check_int() {  # check_int FLAG VALUE MIN
    [[ "$2" =~ ^[0-9]+$ ]] && (( 10#$2 >= $3 )) || usage_error "$1: invalid value '$2' (expected an integer >= $3)"
}

# what take_common_option sets, before the recipe's option loop
USER_DIR=""
DRY_RUN=0
POSITIONAL=()
EXTRA=()

# The options every recipe has, for the last branch of its option loop
# (`*) take_common_option "$@"; shift "$TAKEN" ;;`): -h/--help, --user-dir, --dry-run, "--" (the
# rest goes to fairseq-train, in EXTRA) and the positional arguments (POSITIONAL). Sets TAKEN to
# the number of arguments used.
take_common_option() {
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --user-dir) need_value "$1" "$#"; USER_DIR=$2; TAKEN=2 ;;
        --dry-run) DRY_RUN=1; TAKEN=1 ;;
        --) EXTRA=("${@:2}"); TAKEN=$# ;;
        -*) usage_error "unknown option $1" ;;
        *) POSITIONAL+=("$1"); TAKEN=1 ;;
    esac
}

# DATA_BIN and VARIANT, the two positional arguments every recipe takes
take_data_bin_and_variant() {
    [[ ${#POSITIONAL[@]} -eq 2 ]] || usage_error "expected DATA_BIN and VARIANT, got ${#POSITIONAL[@]} positional argument(s)"
    DATA_BIN=${POSITIONAL[0]}
    VARIANT=${POSITIONAL[1]}
}

# GPUS, when not given: nvidia-smi's count, else 1
default_gpus() {
    [[ -z "$GPUS" ]] || return 0
    GPUS=1
    if command -v nvidia-smi >/dev/null 2>&1; then
        local count
        count=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
        if (( count > 0 )); then GPUS=$count; fi
    fi
}

# USER_DIR, when not given: the installed plugin, else this checkout's
default_user_dir() {
    [[ -z "$USER_DIR" ]] || return 0
    USER_DIR=$(fusion-fairseq-user-dir 2>/dev/null || true)
    [[ -n "$USER_DIR" ]] || USER_DIR="$REPO_ROOT/fusion_fairseq_plugin"
}

# The names fairseq-train writes in its --save-dir (checkpoint_utils.py): checkpointN, checkpoint_N_M,
# checkpoint_best, checkpoint.best_METRIC_VALUE and checkpoint_last, each with any --checkpoint-suffix, as .pt
# and .pt.tmp; and dummy, the probe it writes and deletes to test that the folder is writable
FAIRSEQ_TRAIN_NAMES='^(checkpoint([0-9]|_[0-9]+_[0-9]|_best|\.best_|_last).*\.pt(\.tmp)?|dummy)$'

# argument_at INDEX ARG...: the argument at INDEX with the rest of its --flag's group (the flag and its
# values), else "nothing"
argument_at() {
    local index=$1 start end
    shift
    local args=("$@")
    if (( index >= ${#args[@]} )); then echo nothing; return; fi
    start=$index end=$((index + 1))
    while (( start > 0 )) && [[ "${args[start]}" != --* ]]; do start=$((start - 1)); done
    while (( end < ${#args[@]} )) && [[ "${args[end]}" != --* ]]; do end=$((end + 1)); done
    echo "${args[*]:start:end-start}"
}

# SAVE_DIR made as fairseq-train's (a link named SAVE_DIR is followed, as --save-dir is), closed to group and
# others' writes, without links among the names fairseq-train writes (docs/safety.md); COMMAND recorded in
# SAVE_DIR/train_command.txt (one shell-quoted argument a line). A checkpoint_last.pt of another recorded
# command is refused: fairseq would resume it, and train nothing if it had reached its end. One without a
# recorded command (a recipe before this record) is resumed, as before, with a warning.
prepare_save_dir() {
    local names=() name path record="$SAVE_DIR/train_command.txt" recorded=() current=() i
    mkdir -p -- "$SAVE_DIR" && chmod go-w -- "$SAVE_DIR" || die "save folder $SAVE_DIR: cannot make it this user's own"
    for path in "$SAVE_DIR"/*; do
        name=${path##*/}
        if [[ "$name" =~ $FAIRSEQ_TRAIN_NAMES ]]; then names+=("$name"); fi
    done
    remove_links "$SAVE_DIR" "${names[@]}" || die "save folder $SAVE_DIR: cannot remove the links among fairseq-train's names"
    mapfile -t current < <(printf '%q\n' "${COMMAND[@]}")
    if [[ -f "$SAVE_DIR/checkpoint_last.pt" ]]; then
        if [[ ! -f "$record" ]]; then
            printf '%s: warning: %s has a checkpoint_last.pt but no train_command.txt (an older recipe made it): fairseq-train resumes it, whatever command trained it\n' "$PROG" "$SAVE_DIR" >&2
        else
            mapfile -t recorded < "$record"
            for ((i = 0; i < ${#current[@]} || i < ${#recorded[@]}; i++)); do
                [[ "${current[i]-}" == "${recorded[i]-}" ]] && continue
                die "save folder $SAVE_DIR holds the checkpoint_last.pt of another fairseq-train command, which this one would resume ($(argument_at "$i" "${current[@]}") here, $(argument_at "$i" "${recorded[@]}") in $record): pass another --save-root, or remove $SAVE_DIR (to resume that run with this command: remove $record)"
            done
        fi
    fi
    replace_file "$record" printf '%s\n' "${current[@]}" || die "cannot write $record"
}

# Print COMMAND (shell-quoted); unless DRY_RUN is 1, prepare SAVE_DIR (prepare_save_dir) and run it in this process.
print_and_run() {
    printf '%q ' "${COMMAND[@]}"
    echo
    if [[ $DRY_RUN -eq 1 ]]; then
        exit 0
    fi
    prepare_save_dir
    exec "${COMMAND[@]}"
}

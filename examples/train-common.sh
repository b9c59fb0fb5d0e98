# Shared helpers of the paper recipes examples/*/train.sh, which source it first; do not run it.
# Sets PROG (the recipe's name, for messages) and REPO_ROOT.

PROG="$(basename "$0")"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

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

# Print COMMAND (shell-quoted); unless DRY_RUN is 1, create SAVE_DIR and run it in this process.
print_and_run() {
    printf '%q ' "${COMMAND[@]}"
    echo
    if [[ $DRY_RUN -eq 1 ]]; then
        exit 0
    fi
    mkdir -p "$SAVE_DIR"
    exec "${COMMAND[@]}"
}

# Shared helpers for scripts/prepare-*.sh and scripts/evaluate.sh.  Source it; do not run it.
#
# Environment knobs (all optional):
#   PYTHON                   interpreter with sacremoses / subword-nmt / fairseq (default: python3, else python)
#   RECIPE_CONNECT_TIMEOUT   seconds to wait for a download server to answer (default 20)
#   RECIPE_STALL_TIMEOUT     abort a download that stays below 1 KB/s this many seconds (default 60)

RECIPE_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RECIPE_TOOL="$RECIPE_SCRIPTS_DIR/recipe_tool.py"
if [[ -z "${PYTHON:-}" ]]; then
    if command -v python3 >/dev/null 2>&1; then PYTHON=python3; else PYTHON=python; fi
fi
PROG="$(basename "$0")"

log() { printf '[%s] %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage_error() { printf '%s: error: %s\n(see %s --help)\n' "$PROG" "$*" "$PROG" >&2; exit 2; }

tool() { "$PYTHON" "$RECIPE_TOOL" "$@"; }

# Turn "--flag=value" into "--flag value" (up to a "--"); the result is left in the array ARGS.
split_equals() {
    ARGS=()
    local a rest=0
    for a in "$@"; do
        if (( !rest )) && [[ "$a" == --*=* ]]; then ARGS+=("${a%%=*}" "${a#*=}"); else ARGS+=("$a"); fi
        if [[ "$a" == -- ]]; then rest=1; fi
    done
    return 0
}

# need_value FLAG "$#" [VALUE]: the flag must be followed by a value.
need_value() {
    if [[ "$2" -lt 2 || "${3:-}" == --* ]]; then usage_error "$1 needs a value"; fi
}

check_int() {  # check_int FLAG VALUE MIN
    [[ "$2" =~ ^[0-9]+$ ]] && (( 10#$2 >= $3 )) || usage_error "$1: invalid value '$2' (expected an integer >= $3)"
}

check_choice() {  # check_choice FLAG VALUE CHOICE...
    local flag=$1 value=$2 c
    shift 2
    for c in "$@"; do [[ "$value" == "$c" ]] && return 0; done
    local list
    list=$(printf '%s, ' "$@")
    usage_error "$flag: invalid value '$value' (choose from: ${list%, })"
}

default_workers() {
    local n
    n=$(nproc 2>/dev/null || echo 1)
    (( n > 8 )) && n=8
    echo "$n"
}

# Normalise BPE choice spellings; fails on anything else.
normalise_bpe() {  # normalise_bpe VALUE -> prints subword_nmt|fastbpe
    case "$1" in
        subword_nmt|subword-nmt) echo subword_nmt ;;
        fastbpe|fastBPE|fast_bpe) echo fastbpe ;;
        *) usage_error "--bpe: invalid value '$1' (choose from: subword_nmt, fastbpe)" ;;
    esac
}

check_fastbpe() {
    "$PYTHON" -c "import fastBPE" 2>/dev/null || die "--bpe fastbpe needs the fastBPE python module; install it with:
    $PYTHON -m pip install Cython && $PYTHON -m pip install --no-build-isolation fastBPE==0.1.0
(or use the default --bpe subword_nmt, which gives the same segmentation)"
}

check_python_deps() {
    "$PYTHON" -c "import sacremoses, subword_nmt" 2>/dev/null \
        || die "needs the python packages sacremoses and subword-nmt ($PYTHON -m pip install sacremoses subword-nmt)"
    command -v fairseq-preprocess >/dev/null 2>&1 || "$PYTHON" -c "import fairseq_cli.preprocess" 2>/dev/null \
        || die "needs fairseq (fairseq-preprocess)"
}

# download URL OUTFILE: fetch once (kept as OUTFILE for later runs); fail fast and clearly when offline.
download() {
    local url=$1 out=$2 ct=${RECIPE_CONNECT_TIMEOUT:-20} st=${RECIPE_STALL_TIMEOUT:-60} rc=0
    if [[ -s "$out" ]]; then log "using already downloaded $out"; return 0; fi
    mkdir -p "$(dirname "$out")"
    log "downloading $url"
    if command -v curl >/dev/null 2>&1; then
        curl -fL --silent --show-error --connect-timeout "$ct" --speed-limit 1024 --speed-time "$st" \
            -o "$out.part" "$url" || rc=$?
    elif command -v wget >/dev/null 2>&1; then
        wget -q --tries=1 --timeout="$ct" -O "$out.part" "$url" || rc=$?
    else
        rc=127
    fi
    if (( rc != 0 )); then
        rm -f "$out.part"
        die "download of $url failed (exit $rc; offline, or the server moved?).
Download it on a machine with internet access and run again with --from PATH
(PATH: a directory holding the raw files or archives, or the archive itself)."
    fi
    mv "$out.part" "$out"
}

# find_named ROOT NAME...: first file under ROOT (searched recursively) with one of the names; prints it.
find_named() {
    local root=$1 name hit
    shift
    for name in "$@"; do
        hit=$(find -L "$root" -type f -name "$name" -print 2>/dev/null | LC_ALL=C sort | head -n 1)
        if [[ -n "$hit" ]]; then echo "$hit"; return 0; fi
    done
    return 1
}

# stage_from PATH WORKDIR: make the user's --from usable; prints the directory to search for raw files.
# A directory is used in place (read only); archives in it (top level) are unpacked into WORKDIR/unpacked
# when needed (see require_file); an archive PATH is unpacked into WORKDIR/unpacked.
stage_from() {
    local from=$1 work=$2
    if [[ -d "$from" ]]; then
        echo "$from"
    elif [[ -f "$from" ]]; then
        mkdir -p "$work/unpacked"
        tool extract "$from" "$work/unpacked" || die "--from: cannot unpack '$from' (expected a .tgz/.tar.gz/.tar/.zip)"
        echo "$work/unpacked"
    else
        usage_error "--from: '$from' is neither a directory nor an archive file"
    fi
}

# unpack_archives_in DIR WORKDIR: unpack every archive directly inside DIR into WORKDIR/unpacked (once).
unpack_archives_in() {
    local dir=$1 work=$2 a
    [[ -e "$work/.unpacked-archives" ]] && return 0
    touch "$work/.unpacked-archives"
    mkdir -p "$work/unpacked"
    shopt -s nullglob
    for a in "$dir"/*; do
        [[ -f "$a" ]] || continue
        case "$a" in
            *.tar.gz|*.tgz|*.tar|*.zip) tool extract "$a" "$work/unpacked/$(basename "$a").d" ;;
            *.gz) tool extract "$a" "$work/unpacked" ;;
        esac
    done
    shopt -u nullglob
}

# require_file ROOT WORKDIR WHAT NAME...: locate a raw file by name under ROOT, unpacking archives found
# in ROOT if it is not there yet; dies with a clear message listing the expected names otherwise.
require_file() {
    local root=$1 work=$2 what=$3 hit
    shift 3
    if hit=$(find_named "$root" "$@"); then echo "$hit"; return 0; fi
    if [[ "$root" != "$work/unpacked" ]]; then
        unpack_archives_in "$root" "$work"
        if hit=$(find_named "$work/unpacked" "$@"); then echo "$hit"; return 0; fi
    fi
    local IFS=' '
    die "cannot find the $what under $root (looked for: $*)"
}

check_from() {  # check_from PATH: --from must name an existing directory or file (checked before any work)
    [[ -z "$1" || -e "$1" ]] || usage_error "--from: '$1' does not exist"
}

make_workdir() {  # make_workdir DEST -> prints a fresh scratch directory inside DEST (removed on exit)
    mkdir -p "$1"
    mktemp -d "$1/.work.XXXXXX"
}

# binarise SRC TGT TEXTDIR DATABIN WORKERS JOINED(0|1): fairseq-preprocess of TEXTDIR/{train,valid,test}.
binarise() {
    local src=$1 tgt=$2 text=$3 databin=$4 workers=$5 joined=$6 f
    mkdir -p "$databin"
    # Re-running a recipe: remove only what fairseq-preprocess itself writes (it refuses existing dicts).
    for f in "dict.$src.txt" "dict.$tgt.txt" preprocess.log; do rm -f "$databin/$f"; done
    for f in train valid test; do
        rm -f "$databin/$f.$src-$tgt.$src.bin" "$databin/$f.$src-$tgt.$src.idx" \
              "$databin/$f.$src-$tgt.$tgt.bin" "$databin/$f.$src-$tgt.$tgt.idx"
    done
    local extra=()
    (( joined )) && extra+=(--joined-dictionary)
    log "binarising with fairseq-preprocess into $databin"
    "$PYTHON" -m fairseq_cli.preprocess --source-lang "$src" --target-lang "$tgt" \
        --trainpref "$text/train" --validpref "$text/valid" --testpref "$text/test" \
        --destdir "$databin" --workers "$workers" "${extra[@]}" >&2 \
        || die "fairseq-preprocess failed"
}

abspath() { (cd "$(dirname "$1")" && echo "$(pwd -P)/$(basename "$1")"); }

# write_recipe_env DATABIN KEY=VALUE...: metadata for evaluate.sh (references, casing, ...).
write_recipe_env() {
    local databin=$1
    shift
    printf '%s\n' "# written by $PROG; read by scripts/evaluate.sh" "$@" > "$databin/recipe.env"
}

# learn_and_apply_bpe BPE MERGES WORKERS TOKDIR OUTDIR SRC TGT SPLIT...: joint codes learned with subword-nmt
# on TOKDIR/train.{SRC,TGT}, saved as OUTDIR/code, then applied to TOKDIR/SPLIT.{SRC,TGT} -> OUTDIR/SPLIT.*.
learn_and_apply_bpe() {
    local bpe=$1 merges=$2 workers=$3 tok=$4 out=$5 src=$6 tgt=$7 split l io=()
    shift 7
    log "learning $merges joint BPE merges (subword-nmt) on $tok/train.{$src,$tgt}"
    tool learn-bpe --merges "$merges" --out "$out/code" --workers "$workers" "$tok/train.$src" "$tok/train.$tgt" \
        || die "learning BPE failed"
    for split in "$@"; do
        for l in "$src" "$tgt"; do io+=(--io "$tok/$split.$l" "$out/$split.$l"); done
    done
    log "applying BPE ($bpe)"
    tool apply-bpe --impl "$bpe" --codes "$out/code" --workers "$workers" "${io[@]}" || die "applying BPE failed"
}

# tokenize_files LANG WORKERS [tokenize options...] -- IN OUT [IN OUT...]: one process for all the files
tokenize_files() {
    local lang=$1 workers=$2 opts=() io=()
    shift 2
    while [[ $# -gt 0 && "$1" != -- ]]; do opts+=("$1"); shift; done
    shift
    while [[ $# -gt 1 ]]; do io+=(--io "$1" "$2"); shift 2; done
    tool tokenize --lang "$lang" --workers "$workers" "${opts[@]+"${opts[@]}"}" "${io[@]}" \
        || die "tokenising ($lang) failed"
}

count_lines() { wc -l < "$1" | tr -d ' '; }

# check_out_dir FORCE FLAG DIR NAME...: called before any work by a script that writes the files
# NAME... into the directory DIR (its FLAG, e.g. --out; made if missing). A DIR holding any of them
# is refused unless it carries this script's stamp (stamp_out_dir: DIR is the script's own earlier
# output, a rerun replaces it) or FORCE is 1 (--force), naming what it would replace. Other files
# in DIR are never touched; a NAME that is a link is removed first (see unlink_linked).
OUT_DIR_STAMP=.written_by
check_out_dir() {
    local force=$1 flag=$2 dir=$3 name found=()
    shift 3
    [[ ! -e "$dir" || -d "$dir" ]] || usage_error "$flag '$dir' is not a directory"
    if [[ "$(cat "$dir/$OUT_DIR_STAMP" 2>/dev/null)" != "fusion-fairseq $PROG" ]]; then
        for name in "$@" "$OUT_DIR_STAMP"; do
            [[ -e "$dir/$name" || -L "$dir/$name" ]] && found+=("$name")
        done
    fi
    if (( ${#found[@]} > 0 && ! force )); then
        usage_error "$flag '$dir' holds files that $PROG did not write: ${found[*]}; pass --force to replace" \
            "them, or give another $flag"
    fi
    for name in "$@" "$OUT_DIR_STAMP"; do unlink_linked "$dir/$name"; done
}

# unlink_linked PATH...: remove each PATH that is a symbolic link, or a file with other hard links, so
# that writing PATH next makes a new file instead of writing through the link into a file elsewhere (a
# user's raw input, their BPE codes); the data the link led to stays where it is.
unlink_linked() {
    local path
    for path in "$@"; do
        if [[ -L "$path" ]] || [[ -f "$path" && -n "$(find "$path" -maxdepth 0 -links +1)" ]]; then
            rm -f "$path"
        fi
    done
}

stamp_out_dir() {  # stamp_out_dir DIR: make DIR and mark it as this script's output (see check_out_dir)
    mkdir -p "$1" && printf 'fusion-fairseq %s\n' "$PROG" > "$1/$OUT_DIR_STAMP"
}

report_done() {  # report_done DATABIN TEXTDIR SRC TGT
    local databin=$1 text=$2 src=$3 tgt=$4 s
    log "done."
    for s in train valid test; do
        [[ -f "$text/$s.$src" ]] && log "  $s: $(count_lines "$text/$s.$src") sentence pairs"
    done
    echo "Binarised data ($src -> $tgt) is in: $(abspath "$databin")"
    echo "BPE'd text and codes are in: $(abspath "$text")"
    echo "Train with e.g.: fairseq-train $(abspath "$databin") --arch transformer ..."
}

# real_path PATH: PATH with symbolic links resolved, also before it exists (through its nearest existing parent).
real_path() {
    local path=$1 rest=""
    while [[ ! -d "$path" ]]; do rest="/$(basename "$path")$rest"; path=$(dirname "$path"); done
    echo "$(cd "$path" && pwd -P)$rest"
}

# check_outputs_free FORCE FROM DEST DATABIN SRC TGT: called before any work. A recipe writes
# DEST/{raw,tok,code,code.fastbpe}, DEST/{train,valid,test}.{SRC,TGT} and the files of DATABIN; if
# any of them exists already (a user's own train.de, an earlier run), it refuses unless FORCE is 1
# (--force), naming what it would replace. --from naming DEST, DEST/raw or DEST/tok is refused even
# with --force: the recipe would overwrite the raw text it reads; so is a DEST inside --from, where the
# recipe's search for raw files would find the ones it writes. Other files in DEST are never touched;
# an output that is a link (symbolic, or a hard link) is removed first, so the recipe never writes
# through it into the file it leads to (see unlink_linked).
check_outputs_free() {
    local force=$1 from=$2 dest=$3 databin=$4 src=$5 tgt=$6 name written=()
    if [[ -n "$from" && -d "$from" ]]; then
        local real_from
        real_from=$(cd "$from" && pwd -P)
        for name in "" /raw /tok; do
            if [[ -d "$dest$name" && "$(cd "$dest$name" && pwd -P)" == "$real_from" ]]; then
                usage_error "--from '$from' is --dest${name:+ $name} ('$dest$name'): the recipe writes its" \
                    "outputs there and would replace the raw text it reads; give another --dest"
            fi
        done
        if [[ "$(real_path "$dest")/" == "$real_from/"* ]]; then
            usage_error "--dest '$dest' is inside --from '$from': the recipe searches --from for its raw files" \
                "and would find the ones it writes; give a --dest outside it"
        fi
    fi
    for name in raw tok code code.fastbpe {train,valid,test}."$src" {train,valid,test}."$tgt"; do
        [[ -e "$dest/$name" || -L "$dest/$name" ]] && written+=("$dest/$name")
    done
    if [[ -d "$databin" && -n "$(ls -A "$databin")" ]]; then written+=("$databin (not empty)"); fi
    if (( ${#written[@]} > 0 && ! force )); then
        usage_error "--dest '$dest' already holds what this recipe writes: ${written[*]}; pass --force to" \
            "replace them, or give another --dest/--databin"
    fi
    # the directories first: a file in a linked raw/ is another directory's
    unlink_linked "$dest/raw" "$dest/tok"
    unlink_linked "$dest"/{code,code.fastbpe} "$dest"/{,raw/,tok/}{train,valid,test}.{"$src","$tgt"} \
        "$databin/recipe.env"
}

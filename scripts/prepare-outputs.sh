# Output checks shared by the data recipes scripts/prepare-*.sh (after recipe-common.sh).
# Source it; do not run it.

# check_outputs_free FORCE FROM DEST DATABIN SRC TGT: called before any work. A recipe writes
# DEST/{raw,tok,code,code.fastbpe}, DEST/{train,valid,test}.{SRC,TGT} and the files of DATABIN; if
# any of them exists already (a user's own train.de, an earlier run), it refuses unless FORCE is 1
# (--force), naming what it would replace. --from naming DEST, DEST/raw or DEST/tok is refused even
# with --force: the recipe would overwrite the raw text it reads. Other files in DEST are never
# touched.
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
    fi
    for name in raw tok code code.fastbpe {train,valid,test}."$src" {train,valid,test}."$tgt"; do
        [[ -e "$dest/$name" ]] && written+=("$dest/$name")
    done
    if [[ -d "$databin" && -n "$(ls -A "$databin")" ]]; then written+=("$databin (not empty)"); fi
    if (( ${#written[@]} > 0 && ! force )); then
        usage_error "--dest '$dest' already holds what this recipe writes: ${written[*]}; pass --force to" \
            "replace them, or give another --dest/--databin"
    fi
}

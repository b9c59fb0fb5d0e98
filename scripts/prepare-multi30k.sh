#!/usr/bin/env bash
# Multi30k (WMT16 multimodal task 1) for fairseq: punctuation normalisation + Moses tokenisation
# (sacremoses) + lowercasing (as the official data/task1/tok files), joint BPE, fairseq-preprocess.
# Splits: train (29k) / val (1014) -> valid / test_2016_flickr (1000) -> test.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/recipe-common.sh"

MULTI30K_URL="${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw}"
LANGS=(en de fr cs)
TESTS=(test_2016_flickr test_2017_flickr test_2017_mscoco test_2018_flickr)

usage() {
    cat <<EOF
Usage: $PROG [options]

Prepare Multi30k task 1 (default De->En) and binarise it for fairseq.

  --from PATH          use local raw files instead of downloading: a directory with
                       train.L, val.L, TEST.L (or the same names .gz, e.g. the repository's
                       data/task1/raw), or a .tgz/.zip of them
  --dest DIR           output directory (default: multi30k.tokenized.SRC-TGT); binarised data in DIR/data-bin
  --databin DIR        binarised output directory instead of DEST/data-bin
  --src L, --tgt L     language pair, from: ${LANGS[*]} (default: de, en)
  --test-set NAME      one of: ${TESTS[*]} (default: test_2016_flickr)
  --bpe NAME           subword_nmt (default) or fastbpe (same segmentation, faster; needs the fastBPE module)
  --bpe-merges N       joint BPE merge operations (default: 10000)
  --no-lowercase       keep case (default: lowercase, like the official tokenised files)
  --no-joined-dictionary  separate source and target dictionaries (default: joined)
  --workers N          processes for tokenisation / BPE / fairseq-preprocess (default: min(nproc, 8))
  --force              replace outputs of an earlier run (DEST/raw, tok, code, train.L ...,
                       DATABIN); without it the recipe refuses to overwrite them
  -h, --help           this help

Environment: MULTI30K_URL (base URL of the raw .gz files), RECIPE_CONNECT_TIMEOUT (seconds, default 20).
EOF
}

FORCE=0 FROM="" DEST="" DATABIN="" SRC=de TGT=en TEST=test_2016_flickr BPE=subword_nmt MERGES=10000 LOWER=1 JOINED=1
WORKERS=$(default_workers)
split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --force) FORCE=1; shift ;;
        --from) need_value "$1" "$#" "${2:-}"; FROM=$2; shift 2 ;;
        --dest) need_value "$1" "$#" "${2:-}"; DEST=$2; shift 2 ;;
        --databin) need_value "$1" "$#" "${2:-}"; DATABIN=$2; shift 2 ;;
        --src) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" "${LANGS[@]}"; SRC=$2; shift 2 ;;
        --tgt) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" "${LANGS[@]}"; TGT=$2; shift 2 ;;
        --test-set) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" "${TESTS[@]}"; TEST=$2; shift 2 ;;
        --bpe) need_value "$1" "$#" "${2:-}"; BPE=$(normalise_bpe "$2"); shift 2 ;;
        --bpe-merges) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MERGES=$2; shift 2 ;;
        --workers) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; WORKERS=$2; shift 2 ;;
        --no-lowercase) LOWER=0; shift ;;
        --lowercase) LOWER=1; shift ;;
        --no-joined-dictionary) JOINED=0; shift ;;
        --joined-dictionary) JOINED=1; shift ;;
        *) usage_error "unknown option '$1'" ;;
    esac
done
[[ "$SRC" != "$TGT" ]] || usage_error "--src and --tgt are both '$SRC'"
if [[ "$TEST" == test_2017_* && ( "$SRC" == cs || "$TGT" == cs ) ]]; then
    usage_error "--test-set: '$TEST' has no Czech side (use test_2016_flickr or test_2018_flickr)"
fi
DEST=${DEST:-multi30k.tokenized.$SRC-$TGT}
DATABIN=${DATABIN:-$DEST/data-bin}
check_from "$FROM"
check_python_deps
[[ "$BPE" == fastbpe ]] && check_fastbpe

check_outputs_free "$FORCE" "$FROM" "$DEST" "$DATABIN" "$SRC" "$TGT"
WORK=$(make_workdir "$DEST")
trap 'rm -rf "$WORK"' EXIT

# 1. raw files
if [[ -n "$FROM" ]]; then
    ROOT=$(stage_from "$FROM" "$WORK")
else
    ROOT="$DEST/orig"
    for split in train val "$TEST"; do
        for l in "$SRC" "$TGT"; do download "$MULTI30K_URL/$split.$l.gz" "$ROOT/$split.$l.gz"; done
    done
fi
mkdir -p "$DEST/raw" "$DEST/tok"
for pair in "train:train" "val:valid" "$TEST:test"; do
    split=${pair%%:*} name=${pair#*:}
    for l in "$SRC" "$TGT"; do
        f=$(require_file "$ROOT" "$WORK" "Multi30k $split.$l" "$split.$l" "$split.$l.gz")
        if [[ "$f" == *.gz ]]; then gzip -dc "$f" > "$DEST/raw/$name.$l"; else cp "$f" "$DEST/raw/$name.$l"; fi
    done
    n_src=$(count_lines "$DEST/raw/$name.$SRC") n_tgt=$(count_lines "$DEST/raw/$name.$TGT")
    [[ "$n_src" == "$n_tgt" ]] || die "$split.$SRC has $n_src lines but $split.$TGT has $n_tgt"
done

# 2. normalise punctuation, tokenise, lowercase
TOKOPTS=(--normalize-punct)
(( LOWER )) && TOKOPTS+=(--lowercase)
log "normalising punctuation, tokenising (sacremoses), lowercase=$LOWER"
for l in "$SRC" "$TGT"; do
    tokenize_files "$l" "$WORKERS" "${TOKOPTS[@]}" -- "$DEST/raw/train.$l" "$DEST/tok/train.$l" \
        "$DEST/raw/valid.$l" "$DEST/tok/valid.$l" "$DEST/raw/test.$l" "$DEST/tok/test.$l"
done

# 3. joint BPE, 4. binarise
learn_and_apply_bpe "$BPE" "$MERGES" "$WORKERS" "$DEST/tok" "$DEST" "$SRC" "$TGT" train valid test
binarise "$SRC" "$TGT" "$DEST" "$DATABIN" "$WORKERS" "$JOINED"
write_recipe_env "$DATABIN" RECIPE=multi30k SRC="$SRC" TGT="$TGT" LOWERCASE="$LOWER" BPE="$BPE" \
    BPE_MERGES="$MERGES" COMPOUND_SPLIT=0 TEST_SET="$TEST" \
    RAW_REF_valid="$(abspath "$DEST/raw/valid.$TGT")" TOK_REF_valid="$(abspath "$DEST/tok/valid.$TGT")" \
    RAW_REF_test="$(abspath "$DEST/raw/test.$TGT")" TOK_REF_test="$(abspath "$DEST/tok/test.$TGT")"
report_done "$DATABIN" "$DEST" "$SRC" "$TGT"

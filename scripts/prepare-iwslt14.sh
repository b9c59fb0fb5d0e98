#!/usr/bin/env bash
# IWSLT14 German-English for fairseq, the standard benchmark setup (the pipeline of fairseq's
# examples/translation/prepare-iwslt14.sh, reimplemented with sacremoses instead of the Moses perl scripts):
#   train.tags.de-en.*: drop <url>/<talkid>/<keywords> lines, strip <title>/<description> tags,
#     Moses-tokenise, clean (length ratio 1.5, 1..175 tokens, as clean-corpus-n.perl), lowercase;
#     valid = every 23rd line of that, train = the rest;
#   test = IWSLT14.TED.dev2010 + IWSLT14.TEDX.dev2012 + IWSLT14.TED.tst2010 + tst2011 + tst2012
#     (<seg> text of the XML files, ’ -> ', tokenised, lowercased; --test-set he2018: without
#     TEDX.dev2012, as He et al. 2018 Sec. 4.1 list it);
#   joint BPE (10000 merges) learned on train.de + train.en; fairseq-preprocess (joined dictionary);
#   --max-subwords N: then drop train/valid pairs with a side over N subwords (Wang et al. 2018, 100).
# Expected sizes on the real data: 160239 train / 7283 valid / 6750 test sentence pairs.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/recipe-common.sh"

IWSLT14_URL="${IWSLT14_URL:-https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz}"
TEST_SETS=(IWSLT14.TED.dev2010 IWSLT14.TEDX.dev2012 IWSLT14.TED.tst2010 IWSLT14.TED.tst2011 IWSLT14.TED.tst2012)
HE2018_TEST_SETS=(IWSLT14.TED.dev2010 IWSLT14.TED.tst2010 IWSLT14.TED.tst2011 IWSLT14.TED.tst2012)

usage() {
    cat <<EOF
Usage: $PROG [options]

Prepare IWSLT14 De-En (the standard fairseq benchmark split) and binarise it for fairseq.

  --from PATH          use a local copy instead of downloading: the de-en.tgz archive, or a directory
                       with its files (train.tags.de-en.{de,en}, IWSLT14.TED*.de-en.{de,en}.xml) or with
                       de-en.tgz in it
  --dest DIR           output directory (default: iwslt14.tokenized.SRC-TGT); binarised data in DIR/data-bin
  --databin DIR        binarised output directory instead of DEST/data-bin
  --src L, --tgt L     direction, de/en (default: de -> en)
  --bpe NAME           subword_nmt (default) or fastbpe (same segmentation, faster; needs the fastBPE module)
  --bpe-merges N       joint BPE merge operations (default: 10000)
  --no-lowercase       keep case (default: lowercase, as the standard setup)
  --no-joined-dictionary  separate source and target dictionaries (default: joined)
  --valid-every N      valid = every N-th training line (default: 23)
  --max-len N          drop training pairs with a side longer than N tokens (default: 175)
  --ratio R            drop training pairs whose length ratio exceeds R (default: 1.5)
  --max-subwords N     after BPE, drop train and valid pairs with a side longer than N subwords
                       (default: 0, none; Wang et al. 2018 drop those over 100)
  --test-set NAME      fairseq (default): dev2010 + TEDX.dev2012 + tst2010-2012, 6750 pairs, fairseq's
                       standard and Wang et al. 2018's; he2018: dev2010 + tst2010-2012 (He et al. 2018)
  --workers N          processes for tokenisation / BPE / fairseq-preprocess (default: min(nproc, 8))
  --force              replace outputs of an earlier run (DEST/raw, tok, code, train.L ...,
                       DATABIN); without it the recipe refuses to overwrite them
  -h, --help           this help

Environment: IWSLT14_URL (archive URL), RECIPE_CONNECT_TIMEOUT (seconds, default 20).
EOF
}

FORCE=0 FROM="" DEST="" DATABIN="" SRC=de TGT=en BPE=subword_nmt MERGES=10000 LOWER=1 JOINED=1 EVERY=23 MAXLEN=175 RATIO=1.5 MAXSUB=0
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
        --src) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" de en; SRC=$2; shift 2 ;;
        --tgt) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" de en; TGT=$2; shift 2 ;;
        --bpe) need_value "$1" "$#" "${2:-}"; BPE=$(normalise_bpe "$2"); shift 2 ;;
        --bpe-merges) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MERGES=$2; shift 2 ;;
        --workers) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; WORKERS=$2; shift 2 ;;
        --valid-every) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 2; EVERY=$2; shift 2 ;;
        --max-len) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MAXLEN=$2; shift 2 ;;
        --max-subwords) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MAXSUB=$2; shift 2 ;;
        --test-set) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" fairseq he2018
                    [[ "$2" == he2018 ]] && TEST_SETS=("${HE2018_TEST_SETS[@]}"); shift 2 ;;
        --ratio) need_value "$1" "$#" "${2:-}"
                 [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] && [[ "$2" != 0 && ! "$2" =~ ^0+(\.0+)?$ ]] \
                     || usage_error "$1: invalid value '$2' (expected a positive number)"
                 RATIO=$2; shift 2 ;;
        --no-lowercase) LOWER=0; shift ;;
        --lowercase) LOWER=1; shift ;;
        --no-joined-dictionary) JOINED=0; shift ;;
        --joined-dictionary) JOINED=1; shift ;;
        *) usage_error "unknown option '$1'" ;;
    esac
done
[[ "$SRC" != "$TGT" ]] || usage_error "--src and --tgt are both '$SRC'"
DEST=${DEST:-iwslt14.tokenized.$SRC-$TGT}
DATABIN=${DATABIN:-$DEST/data-bin}
check_from "$FROM"
check_python_deps
[[ "$BPE" == fastbpe ]] && check_fastbpe

check_outputs_free "$FORCE" "$FROM" "$DEST" "$DATABIN" "$SRC" "$TGT"
WORK=$(make_workdir "$DEST")
trap 'rm -rf "$WORK"' EXIT

# 1. raw files (the archive unpacks to de-en/)
if [[ -n "$FROM" ]]; then
    ROOT=$(stage_from "$FROM" "$WORK")
else
    ROOT="$DEST/orig"
    download "$IWSLT14_URL" "$ROOT/de-en.tgz"
fi
LOWOPT=()
(( LOWER )) && LOWOPT=(--lowercase)
mkdir -p "$DEST/raw" "$DEST/tok"

# 2. text: training data without the talk tags; test = the <seg> lines of the dev/test XML files,
#    concatenated in the standard order
for l in de en; do
    f=$(require_file "$ROOT" "$WORK" "IWSLT14 training data" "train.tags.de-en.$l")
    tool train-tags -i "$f" -o "$WORK/train.raw.$l"
    files=()
    for t in "${TEST_SETS[@]}"; do
        files+=("$(require_file "$ROOT" "$WORK" "IWSLT14 test set $t" "$t.de-en.$l.xml")")
    done
    tool xml-segs "${files[@]}" -o "$DEST/raw/test.$l"
done
[[ "$(count_lines "$DEST/raw/test.de")" == "$(count_lines "$DEST/raw/test.en")" ]] \
    || die "the German and English test files have different numbers of segments"

# 3. tokenise (+ lowercase: done before cleaning here, which does not change any length), clean the
#    training data, split off valid
for l in de en; do
    log "tokenising $l (sacremoses -l $l), lowercase=$LOWER"
    tokenize_files "$l" "$WORKERS" "${LOWOPT[@]+"${LOWOPT[@]}"}" -- \
        "$WORK/train.raw.$l" "$WORK/train.tok.$l" "$DEST/raw/test.$l" "$DEST/tok/test.$l"
done
log "cleaning: ratio $RATIO, 1..$MAXLEN tokens"
tool clean --ratio "$RATIO" --min 1 --max "$MAXLEN" \
    --src-in "$WORK/train.tok.de" --tgt-in "$WORK/train.tok.en" \
    --src-out "$WORK/train.clean.de" --tgt-out "$WORK/train.clean.en" \
    --also-in "$WORK/train.raw.de" "$WORK/train.raw.en" --also-out "$WORK/train.rawclean.de" "$WORK/train.rawclean.en"
for l in de en; do
    awk -v n="$EVERY" 'NR % n == 0' "$WORK/train.clean.$l" > "$DEST/tok/valid.$l"
    awk -v n="$EVERY" 'NR % n != 0' "$WORK/train.clean.$l" > "$DEST/tok/train.$l"
    awk -v n="$EVERY" 'NR % n == 0' "$WORK/train.rawclean.$l" > "$DEST/raw/valid.$l"
done

# 4. joint BPE, 5. binarise
learn_and_apply_bpe "$BPE" "$MERGES" "$WORKERS" "$DEST/tok" "$DEST" "$SRC" "$TGT" train valid test
if (( MAXSUB > 0 )); then
    log "dropping train and valid pairs with a side over $MAXSUB subwords"
    for split in train valid; do
        also_in=("$DEST/tok/$split.de" "$DEST/tok/$split.en") also_out=("$WORK/tok.$split.de" "$WORK/tok.$split.en")
        if [[ $split == valid ]]; then
            also_in+=("$DEST/raw/valid.de" "$DEST/raw/valid.en"); also_out+=("$WORK/raw.valid.de" "$WORK/raw.valid.en")
        fi
        tool clean --ratio 1e9 --min 1 --max "$MAXSUB" --src-in "$DEST/$split.de" --tgt-in "$DEST/$split.en" \
            --src-out "$WORK/bpe.$split.de" --tgt-out "$WORK/bpe.$split.en" --also-in "${also_in[@]}" --also-out "${also_out[@]}"
        for l in de en; do
            mv "$WORK/bpe.$split.$l" "$DEST/$split.$l"; mv "$WORK/tok.$split.$l" "$DEST/tok/$split.$l"
            if [[ $split == valid ]]; then mv "$WORK/raw.valid.$l" "$DEST/raw/valid.$l"; fi
        done
    done
fi
binarise "$SRC" "$TGT" "$DEST" "$DATABIN" "$WORKERS" "$JOINED"
write_recipe_env "$DATABIN" RECIPE=iwslt14 SRC="$SRC" TGT="$TGT" LOWERCASE="$LOWER" BPE="$BPE" \
    BPE_MERGES="$MERGES" COMPOUND_SPLIT=0 \
    RAW_REF_valid="$(abspath "$DEST/raw/valid.$TGT")" TOK_REF_valid="$(abspath "$DEST/tok/valid.$TGT")" \
    RAW_REF_test="$(abspath "$DEST/raw/test.$TGT")" TOK_REF_test="$(abspath "$DEST/tok/test.$TGT")"
report_done "$DATABIN" "$DEST" "$SRC" "$TGT"

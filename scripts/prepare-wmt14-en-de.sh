#!/usr/bin/env bash
# WMT14 English-German for fairseq (the pipeline of fairseq's examples/translation/prepare-wmt14en2de.sh,
# reimplemented with sacremoses instead of the Moses perl scripts):
#   train = Europarl v7 + Common Crawl + News Commentary v12 (v9 with --icml17):
#     normalize-punctuation, remove-non-printing-char, Moses tokenisation with -a (aggressive hyphen
#     splitting, "@-@"); valid = every 100th line of that, train = the rest;
#   test = newstest2014 (full, 3003 sentences; <seg> text of the SGML, ’ -> ', tokenised with -a);
#   joint BPE (40000 merges) learned on train.en + train.de; train/valid cleaned after BPE
#   (ratio 1.5, 1..250 tokens, as clean-corpus-n.perl); fairseq-preprocess (joined dictionary).
# Cased (no lowercasing), as the WMT14 papers; newstest2014 has 3003 sentence pairs.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/recipe-common.sh"

WMT14_EUROPARL_URL="${WMT14_EUROPARL_URL:-http://statmt.org/wmt13/training-parallel-europarl-v7.tgz}"
WMT14_COMMONCRAWL_URL="${WMT14_COMMONCRAWL_URL:-http://statmt.org/wmt13/training-parallel-commoncrawl.tgz}"
WMT14_NC_URL="${WMT14_NC_URL:-http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz}"
WMT14_NC9_URL="${WMT14_NC9_URL:-http://statmt.org/wmt14/training-parallel-nc-v9.tgz}"
WMT14_TEST_URL="${WMT14_TEST_URL:-http://statmt.org/wmt14/test-full.tgz}"

usage() {
    cat <<EOF
Usage: $PROG [options]

Prepare WMT14 En-De (fairseq's standard recipe) and binarise it for fairseq.

  --from PATH          use local copies instead of downloading: a directory with the archives
                       (training-parallel-europarl-v7.tgz, training-parallel-commoncrawl.tgz,
                       training-parallel-nc-v12.tgz, test-full.tgz) or with their extracted files
                       (europarl-v7.de-en.{de,en}, commoncrawl.de-en.{de,en}, news-commentary-v12.de-en.{de,en},
                       newstest2014-deen-{src,ref}.{de,en}.sgm), or one archive holding them
  --dest DIR           output directory (default: wmt14_en_de or wmt14_de_en); binarised data in DIR/data-bin
  --databin DIR        binarised output directory instead of DEST/data-bin
  --src L, --tgt L     direction, en/de (default: en -> de)
  --icml17             News Commentary v9 instead of v12 (fairseq's --icml17 setup)
  --bpe NAME           subword_nmt (default) or fastbpe (same segmentation, faster; needs the fastBPE module)
  --bpe-merges N       joint BPE merge operations (default: 40000)
  --lowercase          lowercase everything (default: keep case, as the WMT14 papers)
  --no-joined-dictionary  separate source and target dictionaries (default: joined)
  --valid-every N      valid = every N-th training line (default: 100)
  --max-len N          drop training/valid pairs longer than N BPE tokens (default: 250)
  --workers N          processes for tokenisation / BPE / fairseq-preprocess (default: min(nproc, 8))
  --force              replace outputs of an earlier run (DEST/raw, tok, code, train.L ...,
                       DATABIN); without it the recipe refuses to overwrite them
  -h, --help           this help

Environment: WMT14_EUROPARL_URL, WMT14_COMMONCRAWL_URL, WMT14_NC_URL, WMT14_NC9_URL, WMT14_TEST_URL,
RECIPE_CONNECT_TIMEOUT (seconds, default 20).
EOF
}

FORCE=0 FROM="" DEST="" DATABIN="" SRC=en TGT=de BPE=subword_nmt MERGES=40000 LOWER=0 JOINED=1 EVERY=100 MAXLEN=250 ICML17=0
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
        --src) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" en de; SRC=$2; shift 2 ;;
        --tgt) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" en de; TGT=$2; shift 2 ;;
        --icml17) ICML17=1; shift ;;
        --bpe) need_value "$1" "$#" "${2:-}"; BPE=$(normalise_bpe "$2"); shift 2 ;;
        --bpe-merges) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MERGES=$2; shift 2 ;;
        --workers) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; WORKERS=$2; shift 2 ;;
        --valid-every) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 2; EVERY=$2; shift 2 ;;
        --max-len) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MAXLEN=$2; shift 2 ;;
        --lowercase) LOWER=1; shift ;;
        --no-lowercase) LOWER=0; shift ;;
        --no-joined-dictionary) JOINED=0; shift ;;
        --joined-dictionary) JOINED=1; shift ;;
        *) usage_error "unknown option '$1'" ;;
    esac
done
[[ "$SRC" != "$TGT" ]] || usage_error "--src and --tgt are both '$SRC'"
DEST=${DEST:-wmt14_${SRC}_${TGT}}
DATABIN=${DATABIN:-$DEST/data-bin}
check_from "$FROM"
check_python_deps
[[ "$BPE" == fastbpe ]] && check_fastbpe

if (( ICML17 )); then NC=news-commentary-v9; NC_URL=$WMT14_NC9_URL; else NC=news-commentary-v12; NC_URL=$WMT14_NC_URL; fi
CORPORA=(europarl-v7 commoncrawl "$NC")

check_outputs_free "$FORCE" "$FROM" "$DEST" "$DATABIN" "$SRC" "$TGT"
WORK=$(make_workdir "$DEST")
trap 'rm -rf "$WORK"' EXIT

# 1. raw files
if [[ -n "$FROM" ]]; then
    ROOT=$(stage_from "$FROM" "$WORK")
else
    ROOT="$DEST/orig"
    for url in "$WMT14_EUROPARL_URL" "$WMT14_COMMONCRAWL_URL" "$NC_URL" "$WMT14_TEST_URL"; do
        download "$url" "$ROOT/${url##*/}"
    done
fi
mkdir -p "$DEST/raw" "$DEST/tok"
TOKOPTS=(--aggressive-dash-splits)
(( LOWER )) && TOKOPTS+=(--lowercase)

# 2. training data: normalise, remove non-printing characters, tokenise (-a); raw text kept in parallel
for l in en de; do
    io=()
    : > "$WORK/train.raw.$l"
    for corpus in "${CORPORA[@]}"; do
        f=$(require_file "$ROOT" "$WORK" "$corpus ($l)" "$corpus.de-en.$l")
        io+=("$f" "$WORK/$corpus.tok.$l")
        tr -d '\r' < "$f" | sed -e '$a\' >> "$WORK/train.raw.$l"
    done
    log "tokenising the $l training data (sacremoses -l $l -a)"
    tokenize_files "$l" "$WORKERS" --normalize-punct --remove-non-printing "${TOKOPTS[@]}" -- "${io[@]}"
done
for corpus in "${CORPORA[@]}"; do
    [[ "$(count_lines "$WORK/$corpus.tok.en")" == "$(count_lines "$WORK/$corpus.tok.de")" ]] \
        || die "$corpus: the English and German files have different numbers of lines"
done
for l in en de; do
    for corpus in "${CORPORA[@]}"; do cat "$WORK/$corpus.tok.$l"; done > "$WORK/train.tok.$l"
    for corpus in "${CORPORA[@]}"; do rm -f "$WORK/$corpus.tok.$l"; done
done
for l in en de; do
    awk -v n="$EVERY" 'NR % n == 0' "$WORK/train.tok.$l" > "$DEST/tok/valid.$l"
    awk -v n="$EVERY" 'NR % n != 0' "$WORK/train.tok.$l" > "$DEST/tok/train.$l"
    awk -v n="$EVERY" 'NR % n == 0' "$WORK/train.raw.$l" > "$WORK/valid.raw.$l"
done
rm -f "$WORK"/train.tok.* "$WORK"/train.raw.*

# 3. test data: newstest2014 (en is the source side of deen-src, de the reference side; either name works)
for l in en de; do
    if [[ "$l" == en ]]; then names=("newstest2014-deen-src.en.sgm" "newstest2014-deen-ref.en.sgm")
    else names=("newstest2014-deen-ref.de.sgm" "newstest2014-deen-src.de.sgm"); fi
    f=$(require_file "$ROOT" "$WORK" "newstest2014 ($l)" "${names[@]}")
    tool xml-segs "$f" -o "$DEST/raw/test.$l"
    tokenize_files "$l" "$WORKERS" "${TOKOPTS[@]}" -- "$DEST/raw/test.$l" "$DEST/tok/test.$l"
done

# 4. joint BPE, cleaning of train/valid after BPE, 5. binarise
learn_and_apply_bpe "$BPE" "$MERGES" "$WORKERS" "$DEST/tok" "$WORK" "$SRC" "$TGT" train valid test
cp "$WORK/code" "$DEST/code"
[[ -f "$WORK/code.fastbpe" ]] && cp "$WORK/code.fastbpe" "$DEST/code.fastbpe"
log "cleaning train/valid: ratio 1.5, 1..$MAXLEN BPE tokens"
tool clean --ratio 1.5 --min 1 --max "$MAXLEN" --src-in "$WORK/train.$SRC" --tgt-in "$WORK/train.$TGT" \
    --src-out "$DEST/train.$SRC" --tgt-out "$DEST/train.$TGT"
tool clean --ratio 1.5 --min 1 --max "$MAXLEN" --src-in "$WORK/valid.$SRC" --tgt-in "$WORK/valid.$TGT" \
    --src-out "$DEST/valid.$SRC" --tgt-out "$DEST/valid.$TGT" \
    --also-in "$DEST/tok/valid.$SRC" "$DEST/tok/valid.$TGT" "$WORK/valid.raw.$SRC" "$WORK/valid.raw.$TGT" \
    --also-out "$WORK/valid.tokclean.$SRC" "$WORK/valid.tokclean.$TGT" "$DEST/raw/valid.$SRC" "$DEST/raw/valid.$TGT"
for l in "$SRC" "$TGT"; do
    mv "$WORK/valid.tokclean.$l" "$DEST/tok/valid.$l"
    cp "$WORK/test.$l" "$DEST/test.$l"
done
binarise "$SRC" "$TGT" "$DEST" "$DATABIN" "$WORKERS" "$JOINED"
COMPOUND=0
[[ "$TGT" == de ]] && COMPOUND=1
write_recipe_env "$DATABIN" RECIPE=wmt14-en-de SRC="$SRC" TGT="$TGT" LOWERCASE="$LOWER" BPE="$BPE" \
    BPE_MERGES="$MERGES" COMPOUND_SPLIT="$COMPOUND" \
    RAW_REF_valid="$(abspath "$DEST/raw/valid.$TGT")" TOK_REF_valid="$(abspath "$DEST/tok/valid.$TGT")" \
    RAW_REF_test="$(abspath "$DEST/raw/test.$TGT")" TOK_REF_test="$(abspath "$DEST/tok/test.$TGT")"
report_done "$DATABIN" "$DEST" "$SRC" "$TGT"

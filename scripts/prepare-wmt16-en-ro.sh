#!/usr/bin/env bash
# WMT16 English-Romanian for fairseq:
#   train = Europarl v8 + SETIMES2 (about 610k pairs), valid = newsdev2016, test = newstest2016 (1999 each);
#   every side: normalize-punctuation (-l LANG), Romanian ş/ţ (cedilla) -> ș/ț (comma below), optional
#   removal of Romanian diacritics (--remove-diacritics, as Sennrich et al.'s WMT16 ro->en system),
#   remove-non-printing-char, Moses tokenisation with -a (sacremoses);
#   joint BPE (32000 merges) learned on train.en + train.ro; training pairs cleaned after BPE
#   (ratio 1.5, 1..250 tokens, as clean-corpus-n.perl); fairseq-preprocess (joined dictionary). Cased.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/recipe-common.sh"

WMT16_EUROPARL_URL="${WMT16_EUROPARL_URL:-http://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz}"
WMT16_SETIMES_URL="${WMT16_SETIMES_URL:-https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip}"
WMT16_DEV_URL="${WMT16_DEV_URL:-http://data.statmt.org/wmt16/translation-task/dev.tgz}"
WMT16_TEST_URL="${WMT16_TEST_URL:-http://data.statmt.org/wmt16/translation-task/test.tgz}"

usage() {
    cat <<EOF
Usage: $PROG [options]

Prepare WMT16 En-Ro (Europarl v8 + SETIMES2; newsdev2016 / newstest2016) and binarise it for fairseq.

  --from PATH          use local copies instead of downloading: a directory with the archives
                       (training-parallel-ep-v8.tgz, en-ro.txt.zip, dev.tgz, test.tgz) or with their
                       extracted files (europarl-v8.ro-en.{en,ro}, SETIMES.en-ro.{en,ro},
                       newsdev2016-enro-{src,ref}.*.sgm, newstest2016-enro-{src,ref}.*.sgm; roen for ro->en),
                       or one archive holding them
  --dest DIR           output directory (default: wmt16_en_ro or wmt16_ro_en); binarised data in DIR/data-bin
  --databin DIR        binarised output directory instead of DEST/data-bin
  --src L, --tgt L     direction, en/ro (default: en -> ro)
  --remove-diacritics  strip Romanian diacritics (ă â î ș ț -> a a i s t) on the Romanian source (ro -> en only)
  --bpe NAME           subword_nmt (default) or fastbpe (same segmentation, faster; needs the fastBPE module)
  --bpe-merges N       joint BPE merge operations (default: 32000)
  --lowercase          lowercase everything (default: keep case)
  --no-joined-dictionary  separate source and target dictionaries (default: joined)
  --max-len N          drop training pairs longer than N BPE tokens (default: 250)
  --workers N          processes for tokenisation / BPE / fairseq-preprocess (default: min(nproc, 8))
  --force              replace outputs of an earlier run (DEST/raw, tok, code, train.L ...,
                       DATABIN); without it the recipe refuses to overwrite them
  -h, --help           this help

Environment: WMT16_EUROPARL_URL, WMT16_SETIMES_URL, WMT16_DEV_URL, WMT16_TEST_URL,
RECIPE_CONNECT_TIMEOUT (seconds, default 20).
EOF
}

FORCE=0 FROM="" DEST="" DATABIN="" SRC=en TGT=ro BPE=subword_nmt MERGES=32000 LOWER=0 JOINED=1 MAXLEN=250 NODIAC=0
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
        --src) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" en ro; SRC=$2; shift 2 ;;
        --tgt) need_value "$1" "$#" "${2:-}"; check_choice "$1" "$2" en ro; TGT=$2; shift 2 ;;
        --remove-diacritics) NODIAC=1; shift ;;
        --bpe) need_value "$1" "$#" "${2:-}"; BPE=$(normalise_bpe "$2"); shift 2 ;;
        --bpe-merges) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MERGES=$2; shift 2 ;;
        --workers) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; WORKERS=$2; shift 2 ;;
        --max-len) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MAXLEN=$2; shift 2 ;;
        --lowercase) LOWER=1; shift ;;
        --no-lowercase) LOWER=0; shift ;;
        --no-joined-dictionary) JOINED=0; shift ;;
        --joined-dictionary) JOINED=1; shift ;;
        *) usage_error "unknown option '$1'" ;;
    esac
done
[[ "$SRC" != "$TGT" ]] || usage_error "--src and --tgt are both '$SRC'"
if (( NODIAC )) && [[ "$TGT" == ro ]]; then
    usage_error "--remove-diacritics is for the Romanian source side (--src ro --tgt en); with Romanian as the target the hypotheses could not match the reference"
fi
DEST=${DEST:-wmt16_${SRC}_${TGT}}
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
    download "$WMT16_EUROPARL_URL" "$ROOT/training-parallel-ep-v8.tgz"
    download "$WMT16_SETIMES_URL" "$ROOT/en-ro.txt.zip"
    download "$WMT16_DEV_URL" "$ROOT/dev.tgz"
    download "$WMT16_TEST_URL" "$ROOT/test.tgz"
fi
mkdir -p "$DEST/raw" "$DEST/tok"

tok_opts() {  # options for language $1
    local o=(--normalize-punct --remove-non-printing --aggressive-dash-splits)
    if [[ "$1" == ro ]]; then o+=(--romanian-normalize); (( NODIAC )) && o+=(--remove-diacritics); fi
    (( LOWER )) && o+=(--lowercase)
    echo "${o[@]}"
}

# 2. training data
for l in en ro; do : > "$WORK/train.raw.$l"; done
for corpus in europarl SETIMES; do
    for l in en ro; do
        if [[ "$corpus" == europarl ]]; then
            f=$(require_file "$ROOT" "$WORK" "Europarl v8 ($l)" "europarl-v8.ro-en.$l" "europarl-v8.en-ro.$l")
        else
            f=$(require_file "$ROOT" "$WORK" "SETIMES2 ($l)" "SETIMES.en-ro.$l" "SETIMES2.en-ro.$l" "SETIMES2.ro-en.$l")
        fi
        tr -d '\r' < "$f" | sed -e '$a\' >> "$WORK/train.raw.$l"
    done
done
[[ "$(count_lines "$WORK/train.raw.en")" == "$(count_lines "$WORK/train.raw.ro")" ]] \
    || die "the English and Romanian training files have different numbers of lines"

# 3. dev / test: direction-specific SGML (enro for en->ro, roen for ro->en), the other one as a fallback
sgm_names() {  # sgm_names SET LANG -> the file names to look for, preferred first
    local set=$1 l=$2
    if [[ "$l" == "$SRC" ]]; then
        echo "$set-$SRC$TGT-src.$l.sgm $set-$TGT$SRC-ref.$l.sgm"
    else
        echo "$set-$SRC$TGT-ref.$l.sgm $set-$TGT$SRC-src.$l.sgm"
    fi
}
for pair in "newsdev2016:valid" "newstest2016:test"; do
    set_name=${pair%%:*} split=${pair#*:}
    for l in en ro; do
        # shellcheck disable=SC2046
        f=$(require_file "$ROOT" "$WORK" "$set_name ($l)" $(sgm_names "$set_name" "$l"))
        tool xml-segs "$f" -o "$DEST/raw/$split.$l"
    done
done

log "tokenising (sacremoses -a)"
for l in en ro; do
    read -r -a opts <<< "$(tok_opts "$l")"
    tokenize_files "$l" "$WORKERS" "${opts[@]}" -- "$WORK/train.raw.$l" "$DEST/tok/train.$l" \
        "$DEST/raw/valid.$l" "$DEST/tok/valid.$l" "$DEST/raw/test.$l" "$DEST/tok/test.$l"
done

# 4. joint BPE, cleaning of train after BPE, 5. binarise
learn_and_apply_bpe "$BPE" "$MERGES" "$WORKERS" "$DEST/tok" "$WORK" "$SRC" "$TGT" train valid test
cp "$WORK/code" "$DEST/code"
[[ -f "$WORK/code.fastbpe" ]] && cp "$WORK/code.fastbpe" "$DEST/code.fastbpe"
log "cleaning train: ratio 1.5, 1..$MAXLEN BPE tokens"
tool clean --ratio 1.5 --min 1 --max "$MAXLEN" --src-in "$WORK/train.$SRC" --tgt-in "$WORK/train.$TGT" \
    --src-out "$DEST/train.$SRC" --tgt-out "$DEST/train.$TGT"
for split in valid test; do
    for l in "$SRC" "$TGT"; do cp "$WORK/$split.$l" "$DEST/$split.$l"; done
done
binarise "$SRC" "$TGT" "$DEST" "$DATABIN" "$WORKERS" "$JOINED"
write_recipe_env "$DATABIN" RECIPE=wmt16-en-ro SRC="$SRC" TGT="$TGT" LOWERCASE="$LOWER" BPE="$BPE" \
    BPE_MERGES="$MERGES" COMPOUND_SPLIT=0 REMOVE_DIACRITICS="$NODIAC" \
    RAW_REF_valid="$(abspath "$DEST/raw/valid.$TGT")" TOK_REF_valid="$(abspath "$DEST/tok/valid.$TGT")" \
    RAW_REF_test="$(abspath "$DEST/raw/test.$TGT")" TOK_REF_test="$(abspath "$DEST/tok/test.$TGT")"
report_done "$DATABIN" "$DEST" "$SRC" "$TGT"

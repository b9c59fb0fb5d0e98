#!/usr/bin/env bash
# Translate a binarised subset with fairseq-generate and score it two ways:
#   1. sacreBLEU on detokenised hypotheses against the raw (untokenised) reference, with its signature;
#   2. tokenised BLEU, as most papers report it: BPE-free Moses-tokenised hypotheses against the
#      Moses-tokenised reference, scored by sacrebleu with --tokenize none (equivalent to multi-bleu.perl),
#      case-insensitive when the data were lowercased, with compound splitting for WMT14 En-De if asked.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/recipe-common.sh"

usage() {
    cat <<EOF
Usage: $PROG DATA_BIN CHECKPOINT [options] [-- extra fairseq-generate arguments]

  DATA_BIN             binarised data (e.g. from scripts/prepare-*.sh); also --data DIR
  CHECKPOINT           model checkpoint (.pt); also --path FILE
  --user-dir DIR       fairseq --user-dir (default: this project's plugin, \$(fusion-fairseq-user-dir), when
                       installed: it also lets torch >= 2.6's safe loader read fairseq checkpoints)
  --no-user-dir        do not pass a --user-dir
  --gen-subset NAME    subset to translate: test (default), valid, ...
  --beam N             beam size (default: 5)
  --lenpen X           length penalty (default: 1.0)
  --batch-size N       sentences per batch (default: 128); or --max-tokens N
  --src L, --tgt L     language pair (default: from DATA_BIN)
  --ref FILE           raw, untokenised reference of the subset (default: the one the prepare script recorded
                       in DATA_BIN/recipe.env)
  --tok-ref FILE       tokenised (not BPE'd) reference for tokenised BLEU (default: from recipe.env, else
                       fairseq's T- lines, which may contain <unk>)
  --lowercase|--cased  case-insensitive / case-sensitive scoring (default: case-insensitive when the
                       prepare script lowercased the data, as the IWSLT14 / Multi30k papers report)
  --compound-split     split hyphenated compounds (##AT##-##AT##) for tokenised BLEU, as the WMT14 En-De
                       papers and fairseq's get_compound_split_bleu.sh (default: on for WMT14 En-De)
  --no-compound-split
  --out DIR            where to keep the outputs (default: CHECKPOINT_DIR/eval-SUBSET-beamN)
  --force              replace outputs in an --out DIR that an earlier run of this script did not write
                       (default: refuse before any work; its own earlier outputs are replaced)
  -h, --help           this help

Outputs in DIR: generate-SUBSET.txt (fairseq-generate), hyp.tok (BPE removed, original order), hyp.detok,
bleu.txt and scores.json; .written_by marks DIR as written by $PROG.
EOF
}

DATA="" CKPT="" USER_DIR="" SUBSET=test BEAM=5 LENPEN=1.0 BATCH=128 MAXTOK="" SRC="" TGT="" REF="" TOKREF=""
LOWER="" COMPOUND="" OUT="" FORCE=0
EXTRA=()
split_equals "$@"
set -- "${ARGS[@]+"${ARGS[@]}"}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --data) need_value "$1" "$#" "${2:-}"; DATA=$2; shift 2 ;;
        --path|--checkpoint) need_value "$1" "$#" "${2:-}"; CKPT=$2; shift 2 ;;
        --user-dir) need_value "$1" "$#" "${2:-}"; USER_DIR=$2; shift 2 ;;
        --no-user-dir) USER_DIR=none; shift ;;
        --gen-subset) need_value "$1" "$#" "${2:-}"; SUBSET=$2; shift 2 ;;
        --beam) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; BEAM=$2; shift 2 ;;
        --lenpen) need_value "$1" "$#" "${2:-}"
                  [[ "$2" =~ ^-?[0-9]+(\.[0-9]+)?$ ]] || usage_error "$1: invalid value '$2' (expected a number)"
                  LENPEN=$2; shift 2 ;;
        --batch-size) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; BATCH=$2; shift 2 ;;
        --max-tokens) need_value "$1" "$#" "${2:-}"; check_int "$1" "$2" 1; MAXTOK=$2; shift 2 ;;
        --src) need_value "$1" "$#" "${2:-}"; SRC=$2; shift 2 ;;
        --tgt) need_value "$1" "$#" "${2:-}"; TGT=$2; shift 2 ;;
        --ref) need_value "$1" "$#" "${2:-}"; REF=$2; shift 2 ;;
        --tok-ref) need_value "$1" "$#" "${2:-}"; TOKREF=$2; shift 2 ;;
        --lowercase|-lc) LOWER=1; shift ;;
        --cased) LOWER=0; shift ;;
        --compound-split) COMPOUND=1; shift ;;
        --no-compound-split) COMPOUND=0; shift ;;
        --out) need_value "$1" "$#" "${2:-}"; OUT=$2; shift 2 ;;
        --force) FORCE=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -*) usage_error "unknown option '$1' (fairseq-generate options go after --)" ;;
        *) if [[ -z "$DATA" ]]; then DATA=$1; elif [[ -z "$CKPT" ]]; then CKPT=$1
           else usage_error "unexpected argument '$1'"; fi
           shift ;;
    esac
done
[[ -n "$DATA" ]] || usage_error "missing DATA_BIN"
[[ -n "$CKPT" ]] || usage_error "missing CHECKPOINT"
[[ -d "$DATA" ]] || usage_error "DATA_BIN: '$DATA' is not a directory"
[[ -f "$CKPT" ]] || usage_error "CHECKPOINT: '$CKPT' does not exist"
[[ -z "$USER_DIR" || "$USER_DIR" == none || -d "$USER_DIR" ]] || usage_error "--user-dir: '$USER_DIR' is not a directory"
[[ "$SUBSET" =~ ^[A-Za-z0-9_.-]+$ ]] || usage_error "--gen-subset: invalid value '$SUBSET'"

# recipe_get KEY [PATTERN ALLOWED]: the value of KEY in DATA/recipe.env, if any. A data-bin may come from
# anyone: the file is data, read line by line and never sourced or evaluated, and a value that does not
# match PATTERN (ALLOWED says what does) is refused naming the file. Call it as VAR=$(recipe_get ...) on
# its own line, so that set -e stops the script when it refuses.
recipe_get() {
    local value
    [[ -f "$DATA/recipe.env" ]] || return 0
    value=$(grep -E "^$1=" "$DATA/recipe.env" | head -n 1 | cut -d= -f2- || true)
    value=${value%$'\r'}  # a recipe.env saved with CRLF line endings
    if [[ -n "$value" && -n "${2:-}" && ! "$value" =~ $2 ]]; then
        die "$DATA/recipe.env: $1 '$value' is not allowed (allowed: $3)"
    fi
    printf '%s\n' "$value"
}

LANGUAGE='^[A-Za-z][A-Za-z0-9_-]*$'
if [[ -z "$SRC" ]]; then SRC=$(recipe_get SRC "$LANGUAGE" "a language code such as de"); fi
if [[ -z "$TGT" ]]; then TGT=$(recipe_get TGT "$LANGUAGE" "a language code such as en"); fi
if [[ -z "$SRC" || -z "$TGT" ]]; then
    pairs=$(for f in "$DATA/$SUBSET".*-*.*.idx; do [[ -e "$f" ]] || continue; b=${f##*/}; b=${b#"$SUBSET".}; echo "${b%%.*}"; done | sort -u)
    [[ -n "$pairs" ]] || usage_error "--gen-subset: no binarised '$SUBSET' data in $DATA"
    [[ $(wc -l <<< "$pairs") -eq 1 ]] || usage_error "several language pairs in $DATA (${pairs//$'\n'/ }); pass --src and --tgt"
    SRC=${SRC:-${pairs%-*}}
    TGT=${TGT:-${pairs#*-}}
fi
ls "$DATA/$SUBSET.$SRC-$TGT.$SRC".idx >/dev/null 2>&1 \
    || usage_error "--gen-subset: no binarised '$SUBSET' data for $SRC-$TGT in $DATA"

REF=${REF:-$(recipe_get "RAW_REF_$SUBSET")}
[[ -n "$REF" ]] || usage_error "--ref is required: the raw (untokenised) $TGT reference of '$SUBSET'"
[[ -f "$REF" ]] || usage_error "--ref: '$REF' does not exist"
TOKREF=${TOKREF:-$(recipe_get "TOK_REF_$SUBSET")}
[[ -z "$TOKREF" || -f "$TOKREF" ]] || usage_error "--tok-ref: '$TOKREF' does not exist"
if [[ -z "$LOWER" ]]; then LOWER=$(recipe_get LOWERCASE '^[01]$' '0 or 1'); LOWER=${LOWER:-0}; fi
if [[ -z "$COMPOUND" ]]; then COMPOUND=$(recipe_get COMPOUND_SPLIT '^[01]$' '0 or 1'); COMPOUND=${COMPOUND:-0}; fi

OUT=${OUT:-$(dirname "$CKPT")/eval-$SUBSET-beam$BEAM}
check_out_dir "$FORCE" --out "$OUT" "generate-$SUBSET.txt" "generate-$SUBSET.log" hyp.tok hyp.detok ref.fairseq.tok \
    bleu.txt scores.json
stamp_out_dir "$OUT"
GEN="$OUT/generate-$SUBSET.txt"

args=("$DATA" --path "$CKPT" --gen-subset "$SUBSET" --source-lang "$SRC" --target-lang "$TGT"
      --beam "$BEAM" --lenpen "$LENPEN" --remove-bpe "@@ "
      # fairseq's batch_by_size (main branch, ve-fairseq 0.12.3) drops the last batch when its size is not
      # a multiple of --required-batch-size-multiple (default 8): up to 7 test sentences would go missing.
      --required-batch-size-multiple 1)
if [[ -n "$MAXTOK" ]]; then args+=(--max-tokens "$MAXTOK"); else args+=(--batch-size "$BATCH"); fi
if [[ -z "$USER_DIR" ]]; then
    # Vanilla fairseq cannot load its own checkpoints under torch >= 2.6 (weights_only loading refuses
    # argparse.Namespace); the plugin allow-lists exactly those types, so use it when it is installed.
    USER_DIR=$("$PYTHON" -c 'import importlib.util as u; s = u.find_spec("fusion_fairseq"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null || true)
    [[ -n "$USER_DIR" ]] && log "using --user-dir $USER_DIR (fusion_fairseq; --no-user-dir to leave it out)"
fi
[[ -n "$USER_DIR" && "$USER_DIR" != none ]] && args+=(--user-dir "$USER_DIR")
log "fairseq-generate $SUBSET ($SRC -> $TGT), beam $BEAM -> $GEN"
if ! "$PYTHON" -m fairseq_cli.generate "${args[@]}" "${EXTRA[@]+"${EXTRA[@]}"}" > "$GEN" 2> "$OUT/generate-$SUBSET.log"; then
    tail -n 20 "$OUT/generate-$SUBSET.log" >&2
    die "fairseq-generate failed (log: $OUT/generate-$SUBSET.log)"
fi

# hypotheses in the original order, BPE removed (fairseq's --remove-bpe, then sed -r 's/(@@ )|(@@ ?$)//g')
tool hyps "$GEN" --hyp "$OUT/hyp.tok" --ref "$OUT/ref.fairseq.tok" --expect "$(count_lines "$REF")" \
    || die "could not read the hypotheses in $GEN"
if [[ -z "$TOKREF" ]]; then
    log "no tokenised reference given or recorded: tokenised BLEU uses fairseq's T- lines (may contain <unk>)"
    TOKREF="$OUT/ref.fairseq.tok"
fi
tool detok --lang "$TGT" -i "$OUT/hyp.tok" -o "$OUT/hyp.detok"

bleu_args=(--hyp-detok "$OUT/hyp.detok" --ref "$REF" --hyp-tok "$OUT/hyp.tok" --tok-ref "$TOKREF" --json "$OUT/scores.json")
(( LOWER )) && bleu_args+=(--lowercase)
(( COMPOUND )) && bleu_args+=(--compound-split)
tool bleu "${bleu_args[@]}" | tee "$OUT/bleu.txt"
echo "Outputs are in: $(abspath "$OUT")"

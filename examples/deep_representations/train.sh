#!/usr/bin/env bash
# Dou et al. (EMNLP 2018), "Exploiting Deep Representations for Neural Machine Translation":
# Transformer-Base on WMT14 En-De, every model variation of Tables 1, 3 and 4.
# See examples/deep_representations/README.md for the variants, their flags and the readings.
set -euo pipefail

# shellcheck source=../train-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train-common.sh"  # PROG, REPO_ROOT and the shared helpers

usage() {
    cat <<EOF
Usage: $PROG DATA_BIN VARIANT [options] [-- extra fairseq-train arguments]

Train one model of Dou et al. (2018) on binarised WMT14 En-De (a dictionary per language; see README.md).
The vanilla Transformer-Base is trained from scratch; every other variant starts from it
(--finetune-from-model, as the paper initialises its models from the pre-trained vanilla model).

VARIANT (append +div to any of them for the layer-diversity regulariser, Eqs. 9-10, lambda 1.0):
  vanilla                          Table 1 row 1: Transformer-Base (--arch transformer_wmt_en_de)
  vanilla-continued                the control: the vanilla model fine-tuned from itself with the same
                                   restarted schedule and budget as every other variant
  dense | linear | iterative | hierarchical
                                   Table 1 rows 2-5: layer aggregation on encoder and decoder
  linear-output                    Eq. 5 as written: one linear combination of the layers, at the output
  mla2 | mla3                      Table 1 rows 6-7: multi-layer attention, k = 2 / 3
  encoder-only | decoder-only      Table 3: hierarchical aggregation on one side (both = hierarchical)
  residual-none | residual-top     Table 4: hierarchical, residual connection from no / the top input
                                   (all = hierarchical)
  fn-relu | fn-attention           Table 4: hierarchical, ReLU FFN / self-attention as the function
                                   of the aggregation node (sigmoid = hierarchical)
  The paper's rows 8-10 are iterative+div, hierarchical+div, mla2+div; its final system (Table 2)
  and "OURS" in Tables 3-4 are hierarchical+div.

Options:
  --big              Transformer-Big (Table 2): d 1024, FFN 4096, 16 heads, dropout 0.3, peak lr 4.94e-4
                     (Vaswani et al.'s d^-0.5 * 4000^-0.5), 300000 updates by default
  --save-root DIR    checkpoints go to DIR/VARIANT (default: checkpoints/deeprep-wmt14-en-de, -big with --big)
  --vanilla FILE     vanilla checkpoint to start from (default: SAVE_ROOT/vanilla/checkpoint_best.pt)
  --gpus N           GPUs to train on (default: nvidia-smi's count, else 1); --update-freq is 8/N so
                     that one update sees 8 x 4096 tokens, the paper's 8 GPUs x 4096 tokens
  --max-tokens N     tokens per GPU batch (default: 4096)
  --max-update N     updates (default: 100000; 300000 with --big)
EOF
    common_options_usage "--fp16 --max-epoch 30"
}

SAVE_ROOT=""
VANILLA=""
GPUS=""
MAX_TOKENS=4096
MAX_UPDATE=""
BIG=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --big) BIG=1; shift ;;
        --save-root) need_value "$1" "$#"; SAVE_ROOT=$2; shift 2 ;;
        --vanilla) need_value "$1" "$#"; VANILLA=$2; shift 2 ;;
        --gpus) need_value "$1" "$#"; check_int "$1" "$2" 1; GPUS=$2; shift 2 ;;
        --max-tokens) need_value "$1" "$#"; check_int "$1" "$2" 1; MAX_TOKENS=$2; shift 2 ;;
        --max-update) need_value "$1" "$#"; check_int "$1" "$2" 1; MAX_UPDATE=$2; shift 2 ;;
        *) take_common_option "$@"; shift "$TAKEN" ;;
    esac
done
take_data_bin_and_variant
# Vaswani et al. (2017), whose settings the paper follows: Base 100K steps at dropout 0.1, Big 300K at
# 0.3; the peak of their schedule, d^-0.5 * warmup^-0.5, is 7e-4 at d = 512 and 4.94e-4 at d = 1024.
if [[ $BIG -eq 1 ]]; then
    SIZE=_big; DROPOUT=0.3; PEAK_LR=4.94e-4; SAVE_ROOT=${SAVE_ROOT:-checkpoints/deeprep-wmt14-en-de-big}
    MAX_UPDATE=${MAX_UPDATE:-300000}; VANILLA_ARCH=transformer_vaswani_wmt_en_de_big
else
    SIZE=""; DROPOUT=0.1; PEAK_LR=7e-4; SAVE_ROOT=${SAVE_ROOT:-checkpoints/deeprep-wmt14-en-de}
    MAX_UPDATE=${MAX_UPDATE:-100000}; VANILLA_ARCH=transformer_wmt_en_de
fi
[[ -d "$DATA_BIN" ]] || usage_error "DATA_BIN $DATA_BIN: no such directory"

# ---------------------------------------------------------------------------------------------
# the variant's model flags

BASE=${VARIANT%+div}
DIVERSITY=0
if [[ "$BASE" != "$VARIANT" ]]; then DIVERSITY=1; fi
ARCH=(--arch "deeprep_transformer_wmt_en_de$SIZE")  # hierarchical aggregation on both sides
case "$BASE" in
    vanilla|vanilla-continued) ARCH=(--arch "$VANILLA_ARCH") ;;
    dense|linear|linear-output|iterative|hierarchical) ARCH+=(--aggregate-encoder "$BASE" --aggregate-decoder "$BASE") ;;
    mla2|mla3) ARCH+=(--aggregate-encoder none --aggregate-decoder none --multi-layer-attention "${BASE#mla}") ;;
    encoder-only) ARCH+=(--aggregate-encoder hierarchical --aggregate-decoder none) ;;
    decoder-only) ARCH+=(--aggregate-encoder none --aggregate-decoder hierarchical) ;;
    residual-none|residual-top) ARCH+=(--aggregation-residual "${BASE#residual-}") ;;
    fn-relu|fn-attention) ARCH+=(--aggregation-fn "${BASE#fn-}") ;;
    *) usage_error "unknown VARIANT '$VARIANT' (choose from: vanilla vanilla-continued dense linear linear-output iterative hierarchical mla2 mla3 encoder-only decoder-only residual-none residual-top fn-relu fn-attention, each optionally +div)" ;;
esac
if [[ $DIVERSITY -eq 1 && "$BASE" == vanilla* ]]; then
    usage_error "$VARIANT: the diversity regulariser is trained with the deep-representation variants (Table 1 rows 8-10)"
fi

CRITERION=(--criterion label_smoothed_cross_entropy --label-smoothing 0.1)
if [[ $DIVERSITY -eq 1 ]]; then
    CRITERION=(--criterion label_smoothed_cross_entropy_with_layer_diversity --label-smoothing 0.1 --diversity-lambda 1.0)
fi

INIT=()
if [[ "$BASE" != vanilla ]]; then
    VANILLA=${VANILLA:-$SAVE_ROOT/vanilla/checkpoint_best.pt}
    # fairseq uses --finetune-from-model only when SAVE_DIR has no checkpoint_last.pt yet, so a
    # restarted run resumes instead of starting over.
    if [[ ! -f "$SAVE_ROOT/$VARIANT/checkpoint_last.pt" && $DRY_RUN -eq 0 && ! -f "$VANILLA" ]]; then
        die "vanilla checkpoint $VANILLA not found: train it first ($PROG $DATA_BIN vanilla) or pass --vanilla FILE"
    fi
    INIT=(--finetune-from-model "$VANILLA")
fi

# ---------------------------------------------------------------------------------------------
# batch size and training schedule (Vaswani et al. 2017's base or big setting, as the paper follows it).
# No shared embeddings (source, target and softmax matrices of their own, THUMT's default): the
# paper's Transformer-Base has 88.0M parameters, which sharing all three (about 61M) cannot give.

default_gpus
(( 8 % GPUS == 0 )) || usage_error "--gpus $GPUS: the paper's 8 GPUs x 4096 tokens are emulated with --update-freq 8/N; use 1, 2, 4 or 8 GPUs"
UPDATE_FREQ=$(( 8 / GPUS ))

default_user_dir

SAVE_DIR="$SAVE_ROOT/$VARIANT"
COMMAND=(
    fairseq-train "$DATA_BIN" --user-dir "$USER_DIR"
    "${ARCH[@]}"
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-9 --clip-norm 0.0
    --lr "$PEAK_LR" --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --dropout "$DROPOUT" --weight-decay 0.0
    "${CRITERION[@]}"
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE"
    "${INIT[@]}"
    --save-dir "$SAVE_DIR" --keep-last-epochs 5 --best-checkpoint-metric nll_loss
    --log-format simple --log-interval 100
    "${EXTRA[@]}"
)

print_and_run

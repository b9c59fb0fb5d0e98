#!/usr/bin/env bash
# Liu et al. (ICLR 2021), "Understanding and Improving Encoder Layer Fusion in Sequence-to-Sequence
# Learning": WMT16 Romanian-English, Transformer-Base, the settings of the paper's Appendix Table 4
# (batch 16K tokens, 60K steps, dropout 0.3; testing with beam 4, length penalty 1.0).
# See examples/surface_fusion/README.md for the variants, the analyses and the readings.
set -euo pipefail

# shellcheck source=../train-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train-common.sh"  # PROG, REPO_ROOT and the shared helpers

usage() {
    cat <<EOF
Usage: $PROG DATA_BIN VARIANT [options] [-- extra fairseq-train arguments]

Train one model of Liu et al. (2021) on binarised WMT16 Ro-En (joined dictionary; see README.md).

VARIANT:
  vanilla    Table 2 "Vanilla": Transformer-Base (fairseq's transformer_wmt_en_de), dropout 0.3
  coarse     Table 1 "Coarse-grained layer attention" (Bapna et al. 2018), DropConnect 0.3
  fgla       Tables 1-2 "FGLA": fine-grained layer attention (Sec. 3.2), DropConnect 0.3
             (--arch fgla_wmt_en_ro); the model the analyses of Sec. 3.3 read
  hard       Table 2 "Hard fusion": SurfaceFusion, Eq. 6, lambda 0.8, tau 1 (--arch surface_fusion_wmt_en_ro)
  soft       Table 2 "Soft fusion": SurfaceFusion, Eq. 7, tau 5
  Append +released to hard or soft for SurfaceFusion as the authors' released code trains it
  (--surface-fusion-variant released, attention dropout 0.1; see README.md), e.g. hard+released.

Options:
  --save-root DIR    checkpoints go to DIR/VARIANT (default: checkpoints/surface-fusion-wmt16-ro-en)
  --gpus N           GPUs to train on (default: nvidia-smi's count, else 1)
  --max-tokens N     tokens per GPU batch (default: 4096); --update-freq is 16384 / (N x GPUs), so that one
                     update sees the paper's 16K-token batch
  --max-update N     updates (default: 60000, the paper's 60K steps)
EOF
    common_options_usage "--fp16 --seed 2"
}

SAVE_ROOT=checkpoints/surface-fusion-wmt16-ro-en
GPUS=""
MAX_TOKENS=4096
MAX_UPDATE=60000
while [[ $# -gt 0 ]]; do
    case "$1" in
        --save-root) need_value "$1" "$#"; SAVE_ROOT=$2; shift 2 ;;
        --gpus) need_value "$1" "$#"; check_int "$1" "$2" 1; GPUS=$2; shift 2 ;;
        --max-tokens) need_value "$1" "$#"; check_int "$1" "$2" 1; MAX_TOKENS=$2; shift 2 ;;
        --max-update) need_value "$1" "$#"; check_int "$1" "$2" 1; MAX_UPDATE=$2; shift 2 ;;
        *) take_common_option "$@"; shift "$TAKEN" ;;
    esac
done
take_data_bin_and_variant

# ---------------------------------------------------------------------------------------------
# the variant's model flags (every preset already has Transformer-Base dimensions and dropout 0.3)

BASE=${VARIANT%+released}
case "$BASE" in
    vanilla) ARCH=(--arch transformer_wmt_en_de --dropout 0.3) ;;
    coarse) ARCH=(--arch fgla_wmt_en_ro --layer-attention coarse --layer-attention-dropconnect 0.3) ;;
    fgla) ARCH=(--arch fgla_wmt_en_ro --layer-attention fine --layer-attention-dropconnect 0.3) ;;
    hard) ARCH=(--arch surface_fusion_wmt_en_ro --surface-fusion hard --surface-fusion-lambda 0.8 --surface-fusion-tau 1) ;;
    soft) ARCH=(--arch surface_fusion_wmt_en_ro --surface-fusion soft --surface-fusion-tau 5) ;;
    *) usage_error "unknown VARIANT '$VARIANT' (choose from: vanilla coarse fgla hard soft hard+released soft+released)" ;;
esac
if [[ "$BASE" != "$VARIANT" ]]; then
    [[ "$BASE" == hard || "$BASE" == soft ]] || usage_error "unknown VARIANT '$VARIANT': +released is a SurfaceFusion variant (hard+released, soft+released)"
    # the released code's architecture (base_architecture of its transformer.py) also sets attention
    # dropout 0.1, where fairseq's transformer_wmt_en_de keeps 0.0
    ARCH+=(--surface-fusion-variant released --attention-dropout 0.1)
fi
[[ -d "$DATA_BIN" || $DRY_RUN -eq 1 ]] || usage_error "DATA_BIN $DATA_BIN: no such directory"

# ---------------------------------------------------------------------------------------------
# batch: 16K tokens per update (Table 4), as fairseq counts them (--max-tokens summed over GPUs and
# accumulated batches)

default_gpus
PER_STEP=$(( MAX_TOKENS * GPUS ))
(( 16384 % PER_STEP == 0 )) || usage_error "--max-tokens $MAX_TOKENS x $GPUS GPU(s) = $PER_STEP tokens does not divide the paper's 16384-token batch; choose --max-tokens so that it does"
UPDATE_FREQ=$(( 16384 / PER_STEP ))

default_user_dir

# Adam and the inverse-square-root schedule with 4000 warm-up steps (Vaswani et al., which Appendix
# A.1 defers to), label smoothing 0.1, the checkpoint of best validation perplexity. Peak lr 5e-4 and
# warm-up from 1e-7: the authors' released training command (Vaswani et al.'s formula would peak at
# 7e-4); its 8 GPUs x --max-tokens 2048 are the 16K batch, counted as fairseq counts tokens.
SAVE_DIR="$SAVE_ROOT/$VARIANT"
COMMAND=(
    fairseq-train "$DATA_BIN" --user-dir "$USER_DIR"
    "${ARCH[@]}" --share-all-embeddings
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-9 --clip-norm 0.0
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE"
    --save-dir "$SAVE_DIR" --keep-last-epochs 5 --best-checkpoint-metric nll_loss
    --log-format simple --log-interval 100
    "${EXTRA[@]}"
)

print_and_run

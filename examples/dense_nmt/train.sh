#!/usr/bin/env bash
# DenseNMT training recipe (Shen et al., NAACL 2018, Sec. 4.3) with fairseq's ConvS2S settings.
# Usage: train.sh DATA_BIN [ARCH] [SAVE_DIR] [extra fairseq-train flags...]
#   ARCH: dense_fconv_iwslt_de_en (default), dense_fconv_iwslt_de_en_8l, dense_fconv_wmt_en_de,
#         dense_transformer_iwslt_de_en
set -euo pipefail
DATA_BIN=${1:?usage: train.sh DATA_BIN [ARCH] [SAVE_DIR] [extra flags]}
ARCH=${2:-dense_fconv_iwslt_de_en}
SAVE_DIR=${3:-checkpoints/${ARCH}}
shift $(( $# < 3 ? $# : 3 ))
USER_DIR=$(python -c 'import fusion_fairseq, os; print(os.path.dirname(fusion_fairseq.__file__))')

case "$ARCH" in
  *wmt*) BATCH=48 ;;   # "We set our batch size for the WMT14 English-German dataset to be 48"
  *)     BATCH=32 ;;   # "For other datasets, we set batch size to be 32"
esac

# NAG, lr 0.25; lr / 10 whenever the validation loss increases; stop below 1e-4; clip-norm 0.1 and
# dropout 0.2 as fairseq's ConvS2S recipe (for WMT the paper shrinks every epoch after the first
# increase, which reduce_lr_on_plateau approximates).
fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" --arch "$ARCH" \
  --optimizer nag --momentum 0.99 --lr 0.25 --clip-norm 0.1 \
  --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.1 --stop-min-lr 1e-4 \
  --dropout 0.2 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --batch-size "$BATCH" --save-dir "$SAVE_DIR" "$@"

# Beam 5 (Sec. 4.3)
fairseq-generate "$DATA_BIN" --user-dir "$USER_DIR" --path "$SAVE_DIR/checkpoint_best.pt" \
  --beam 5 --batch-size 128 --remove-bpe

#!/usr/bin/env bash
# DenseNMT-4L-2 against its residual ConvS2S baseline of similar size (BASE-4L, Table 2 sizes),
# trained side by side with identical data, optimiser (NAG at the paper's lr 0.25, momentum 0.99,
# clip 0.1, dropout 0.2; not its schedule: label smoothing 0.1, fairseq's reduce_lr_on_plateau and
# 4,000-token batches), batch and seed; prints the updates and training time each needs to reach the
# residual model's best validation NLL via fusion-fairseq-benchmark --time-to-loss (Shen et al.:
# DenseNMT-En-De-15 needs 29.3% less time than ConvS2S on WMT14 En-De before fine-tuning).
#
#   examples/dense_nmt/time_to_loss.sh DATA_BIN [OUT_DIR]      # default OUT_DIR: dense_time_to_loss
#
# DATA_BIN: binarised data with a joined dictionary, e.g. Multi30k De-En from
# `corpus prepare multi30k`. Environment: MAX_UPDATE (400), VALID_EVERY (25), MAX_TOKENS (4000),
# SEED (1), THREADS (1 per model; the two models train at the same time). Training time is logged
# once per validation interval (fairseq rounds each interval's to whole seconds). Step throughput on
# identical batches: the benchmark command in examples/dense_nmt/README.md.
# OUT is this script's own folder: one holding files it did not write is refused unless FORCE=1; each
# training's log is written by replace_file (scripts/files.sh) and appears when that training ends.
set -euo pipefail
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [[ $# -lt 1 || $# -gt 2 ]]; then usage >&2; exit 2; fi
DATA_BIN=$1
OUT=${2:-dense_time_to_loss}
if ! compgen -G "$DATA_BIN/train.*.idx" >/dev/null || ! compgen -G "$DATA_BIN/dict.*.txt" >/dev/null; then
  echo "error: $DATA_BIN: no binarised training data (train.SRC-TGT.*.idx, dict.*.txt from fairseq-preprocess)" >&2
  exit 2
fi
source "$(cd "$(dirname "$0")/../.." && pwd)/scripts/files.sh"
PYTHON=${PYTHON:-python}
USER_DIR=$("$PYTHON" -c 'from fusion_fairseq.cli import user_dir; print(user_dir())')
NAMES=(residual.log dense.log time_to_loss.json checkpoints-residual checkpoints-dense)
if ! held=$(claim_folder "$OUT" "fusion-fairseq examples/dense_nmt/time_to_loss.sh" "${NAMES[@]}"); then
  echo "error: OUT $OUT holds files that time_to_loss.sh did not write: $held; set FORCE=1 to replace them, or" \
    "give another OUT" >&2
  exit 2
fi

train() {  # name, model flags...
  local name=$1; shift
  # --no-save still probes the save directory (writes and deletes a file there): one per model, inside
  # OUT, so the two concurrent runs never race on it and nothing lands in the caller's directory.
  OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} fairseq-train "$DATA_BIN" --user-dir "$USER_DIR" "$@" \
    --save-dir "$OUT/checkpoints-$name" \
    --optimizer nag --momentum 0.99 --lr 0.25 --clip-norm 0.1 \
    --lr-scheduler reduce_lr_on_plateau --lr-shrink 0.1 \
    --dropout 0.2 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens "${MAX_TOKENS:-4000}" --max-update "${MAX_UPDATE:-400}" --seed "${SEED:-1}" \
    --validate-interval-updates "${VALID_EVERY:-25}" --validate-interval 1000000 --no-save \
    --log-format json --log-interval "${VALID_EVERY:-25}" --num-workers 0 --required-batch-size-multiple 1 \
    2>&1 | replace_file "$OUT/$name.log"  # the whole log, also of a training that fails (pipefail: its status)
}

# BASE-4L: fairseq's fconv_iwslt_de_en with 4 decoder layers (examples/dense_nmt/README.md, Table 2)
train residual --arch fconv_iwslt_de_en --decoder-layers "[(256, 3)] * 4" &
residual=$!
train dense --arch dense_fconv_iwslt_de_en &
dense=$!
wait "$residual" || { echo "error: the residual model's training failed, see $OUT/residual.log" >&2; exit 1; }
wait "$dense" || { echo "error: the dense model's training failed, see $OUT/dense.log" >&2; exit 1; }
# --force: OUT is this recipe's own directory, whose logs every run rewrites; the JSON is read from them
"$PYTHON" -m fusion_lab.benchmark --time-to-loss "$OUT/residual.log" "$OUT/dense.log" \
  --json "$OUT/time_to_loss.json" --force

#!/usr/bin/env bash
# Wang et al. (COLING 2018), "Multi-layer Representation Fusion for Neural Machine Translation":
# the paper's two-stage training (Sec. 4.2) of every fusion system of Tables 2 and 3.
# See examples/mlrf/README.md for the stages, the readings and evaluation.
set -euo pipefail

# shellcheck source=../train-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train-common.sh"  # PROG, REPO_ROOT and the shared helpers

usage() {
    cat <<EOF
Usage: $PROG DATA_BIN VARIANT [options] [-- extra fairseq-train arguments]

Train one stage of one MLRF system (Wang et al. 2018, Sec. 4.2):
  stage 1: MLE (no label smoothing), Adam (0.9, 0.98, 1e-9), lr = d^-0.5 min(t^-0.5, t 16k^-1.5),
           80 sentences a batch, 40 epochs (NIST: 10)
  stage 2: Adam restarted from stage 1's last checkpoint, fixed lr 5e-5, 32 sentences a batch,
           20 more epochs (NIST: 5)

VARIANT (Table 2 / Table 3 rows; the fusion function phi of each side, Eqs. 2-7):
  baseline                  no fusion (the Transformer of the setting)
  enc-avg | enc-fnn | enc-sa    fuse the encoder layers only
  dec-avg | dec-fnn | dec-sa    fuse the decoder layers only
  both-avg | both-fnn | both-sa fuse both sides with the same function
  both-fnn-sa               Enc-FNN + Dec-SA (Table 2's best system, mlrf_iwslt_de_en's default)
  both-avg-sa               Enc-AVG + Dec-SA (Table 3)
  Append +w1 for an independent W1 per layer (Table 3 "+ indep. W1"); nist-zh-en's dec-sa+w1 is Table 3's
  best system, mlrf_nist_zh_en.

Options:
  --setting S        iwslt-de-en (default: mlrf_iwslt_de_en, 3+3 layers, d=256; beam 8, length penalty 1.6)
                     or nist-zh-en (fusion_transformer, 6+6 layers, d=512, da=2048, df=1024 as
                     mlrf_nist_zh_en; 10 + 5 epochs; beam 12, length penalty 1.3)
  --stage N          1 (default) or 2
  --hops N           hops of self-attention fusion (default: 4; Table 2 also has 6)
  --save-root DIR    checkpoints go to DIR/VARIANT[-hopsN]/stageN (default: checkpoints/mlrf-SETTING)
  --stage1 FILE      stage 1 checkpoint that stage 2 restarts from
                     (default: SAVE_ROOT/VARIANT[-hopsN]/stage1/checkpoint_last.pt)
  --gpus N           GPUs to train on (default: nvidia-smi's count, else 1); each GPU gets 80/N (stage 2:
                     32/N) sentences, so that one update sees the paper's batch; N must divide 16
EOF
    common_options_usage "--fp16 --seed 2"
}

SETTING=iwslt-de-en
STAGE=1
HOPS=4
SAVE_ROOT=""
STAGE1=""
GPUS=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --setting) need_value "$1" "$#"; SETTING=$2; shift 2 ;;
        --stage) need_value "$1" "$#"; STAGE=$2; shift 2 ;;
        --hops) need_value "$1" "$#"; check_int "$1" "$2" 1; HOPS=$((10#$2)); shift 2 ;;
        --save-root) need_value "$1" "$#"; SAVE_ROOT=$2; shift 2 ;;
        --stage1) need_value "$1" "$#"; STAGE1=$2; shift 2 ;;
        --gpus) need_value "$1" "$#"; check_int "$1" "$2" 1; GPUS=$((10#$2)); shift 2 ;;
        *) take_common_option "$@"; shift "$TAKEN" ;;
    esac
done
take_data_bin_and_variant
[[ -d "$DATA_BIN" ]] || usage_error "DATA_BIN $DATA_BIN: no such directory"
[[ "$STAGE" == 1 || "$STAGE" == 2 ]] || usage_error "--stage: invalid value '$STAGE' (expected 1 or 2)"

# ---------------------------------------------------------------------------------------------
# the setting: architecture, peak learning rate d^-0.5 * 16000^-0.5, epochs per stage

case "$SETTING" in
    iwslt-de-en) ARCH=mlrf_iwslt_de_en; PEAK_LR=0.000494; EPOCHS=(40 20) ;;  # d = 256
    nist-zh-en) ARCH=fusion_transformer; PEAK_LR=0.000349; EPOCHS=(10 5) ;;  # d = 512
    *) usage_error "--setting: invalid value '$SETTING' (choose from: iwslt-de-en nist-zh-en)" ;;
esac

# ---------------------------------------------------------------------------------------------
# the variant's fusion flags

FUSION=${VARIANT%+w1}
case "$FUSION" in
    baseline) FUSE=(none none) ;;
    enc-avg|enc-fnn|enc-sa) FUSE=("${FUSION#enc-}" none) ;;
    dec-avg|dec-fnn|dec-sa) FUSE=(none "${FUSION#dec-}") ;;
    both-avg|both-fnn|both-sa) FUSE=("${FUSION#both-}" "${FUSION#both-}") ;;
    both-fnn-sa|both-avg-sa) FUSE=("$(cut -d- -f2 <<<"$FUSION")" sa) ;;
    *) usage_error "unknown VARIANT '$VARIANT' (choose from: baseline enc-avg enc-fnn enc-sa dec-avg dec-fnn dec-sa both-avg both-fnn both-sa both-fnn-sa both-avg-sa, each optionally +w1)" ;;
esac
MODEL=(--arch "$ARCH" --fuse-encoder "${FUSE[0]}" --fuse-decoder "${FUSE[1]}" --fusion-hops "$HOPS")
if [[ "$FUSION" != "$VARIANT" ]]; then
    [[ " ${FUSE[*]} " == *" sa "* ]] || usage_error "VARIANT '$VARIANT': +w1 is an option of self-attention fusion (sa)"
    MODEL+=(--fusion-independent-w1)
fi
NAME=$VARIANT
if [[ "$HOPS" != 4 ]]; then NAME="$VARIANT-hops$HOPS"; fi

# ---------------------------------------------------------------------------------------------
# the stage's optimiser and batch

default_gpus
(( 16 % GPUS == 0 )) || usage_error "--gpus $GPUS: the paper's batches of 80 and 32 sentences are split over the GPUs; use 1, 2, 4, 8 or 16 GPUs"
SAVE_ROOT=${SAVE_ROOT:-checkpoints/mlrf-$SETTING}
SAVE_DIR="$SAVE_ROOT/$NAME/stage$STAGE"
if [[ $STAGE -eq 1 ]]; then
    SCHEDULE=(--lr "$PEAK_LR" --lr-scheduler inverse_sqrt --warmup-updates 16000 --warmup-init-lr 1e-7
              --batch-size $(( 80 / GPUS )) --max-epoch "${EPOCHS[0]}")
else
    STAGE1=${STAGE1:-$SAVE_ROOT/$NAME/stage1/checkpoint_last.pt}
    # fairseq loads --finetune-from-model (weights only: Adam, the schedule, the meters and the data
    # loader start anew) only while SAVE_DIR has no checkpoint_last.pt, so an interrupted stage 2
    # resumes instead of restarting.
    if [[ ! -f "$SAVE_DIR/checkpoint_last.pt" && $DRY_RUN -eq 0 && ! -f "$STAGE1" ]]; then
        die "stage 1 checkpoint $STAGE1 not found: train stage 1 first ($PROG $DATA_BIN $VARIANT --stage 1) or pass --stage1 FILE"
    fi
    SCHEDULE=(--lr 5e-5 --lr-scheduler fixed --finetune-from-model "$STAGE1"
              --batch-size $(( 32 / GPUS )) --max-epoch "${EPOCHS[1]}")
fi

default_user_dir

COMMAND=(
    fairseq-train "$DATA_BIN" --user-dir "$USER_DIR"
    "${MODEL[@]}"
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-9 --clip-norm 0.0 --weight-decay 0.0
    "${SCHEDULE[@]}"
    # fairseq rounds a GPU's batch down to a multiple of 8 by default: 80/4 = 20 would give 16
    --required-batch-size-multiple 1
    --criterion cross_entropy
    --save-dir "$SAVE_DIR" --keep-last-epochs 5
    --log-format simple --log-interval 100
    "${EXTRA[@]}"
)

print_and_run

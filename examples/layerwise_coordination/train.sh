#!/usr/bin/env bash
# He et al. (NeurIPS 2018), "Layer-wise Coordination between Encoder and Decoder for Neural
# Machine Translation": the IWSLT14 De-En small configuration (Sec. 4), the Table 3 ablations,
# the Table 4 depths and the Transformer baseline of about the same size.
# See examples/layerwise_coordination/README.md for the recipe, the readings and evaluation.
set -euo pipefail

# shellcheck source=../train-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train-common.sh"  # PROG, REPO_ROOT and the shared helpers

usage() {
    cat <<EOF
Usage: $PROG DATA_BIN VARIANT [options] [-- extra fairseq-train arguments]

Train one model of He et al. (2018) on binarised IWSLT14 De-En. DATA_BIN must have been binarised
with ONE joined dictionary (fairseq-preprocess --joined-dictionary; \`corpus prepare iwslt14\` does so
by default): the model shares one stack and one embedding between source and target.

VARIANT:
  coordination     Table 3 row 1 / Table 1: 14 shared layers, d=256, d_ff=1024, 4 heads
                   (--arch layerwise_coordination_iwslt_de_en)
  no-sharing       Table 3 "w/o weight sharing": separate source and target layers, half the depth
                   (--layers 7 --no-layer-sharing)
  no-mixed         Table 3 "w/o mixed attention": target self-attention + source attention
                   (--no-mixed-attention)
  no-language      Table 3 "w/o source/target embedding" (--no-language-embedding)
  no-position      Table 3 "w/o position embedding" (--no-position-embedding)
  transformer      the baseline of about the same size: fairseq's transformer, 6+6 layers, d=256,
                   d_ff=1024, 4 heads, all embeddings shared (Sec. 4.2's 6-layer transformer_small)

Options:
  --layers N         depth of the coordination stack (default: 14; Table 4: 10, 14, 18, 22; with
                     no-sharing: half of it, 7); for transformer: encoder and decoder layers (default: 6;
                     Table 4's baseline: 4, 6, 8, 10)
  --save-root DIR    checkpoints go to DIR/VARIANT[-layersN] (default: checkpoints/lwc-iwslt14-de-en)
  --max-tokens N     tokens per batch as fairseq counts them, max(source, target) per pair (default: 2048:
                     the paper's "roughly 4096 tokens" on one GPU count the concatenated source and target)
  --max-epoch N      at most N epochs (default: 100)
  --patience N       stop when the validation loss has not improved for N epochs (default: 10; the
                     paper uses the validation set for early stopping)
  --pre-norm         pre-norm layers (LayerNorm before each sub-layer, one on top), for every VARIANT;
                     default post-norm. The paper does not say; its Transformer baseline, trained with
                     tensor2tensor, is pre-norm (see README.md)
  --seed N           (default: 1)
EOF
    common_options_usage "--fp16 --update-freq 2"
}

SAVE_ROOT=checkpoints/lwc-iwslt14-de-en
LAYERS=""
MAX_TOKENS=2048
MAX_EPOCH=100
PATIENCE=10
SEED=1
PRE_NORM=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --layers) need_value "$1" "$#"; check_int "$1" "$2" 1; LAYERS=$((10#$2)); shift 2 ;;
        --save-root) need_value "$1" "$#"; SAVE_ROOT=$2; shift 2 ;;
        --max-tokens) need_value "$1" "$#"; check_int "$1" "$2" 1; MAX_TOKENS=$2; shift 2 ;;
        --max-epoch) need_value "$1" "$#"; check_int "$1" "$2" 1; MAX_EPOCH=$2; shift 2 ;;
        --patience) need_value "$1" "$#"; check_int "$1" "$2" 1; PATIENCE=$2; shift 2 ;;
        --seed) need_value "$1" "$#"; check_int "$1" "$2" 0; SEED=$2; shift 2 ;;
        --pre-norm) PRE_NORM=1; shift ;;
        *) take_common_option "$@"; shift "$TAKEN" ;;
    esac
done
take_data_bin_and_variant
[[ -d "$DATA_BIN" ]] || usage_error "DATA_BIN $DATA_BIN: no such directory"

# the joined dictionary: fairseq-preprocess --joined-dictionary writes two identical dict files
shopt -s nullglob
dicts=("$DATA_BIN"/dict.*.txt)
shopt -u nullglob
if [[ ${#dicts[@]} -ge 2 ]] && ! cmp -s "${dicts[0]}" "${dicts[1]}"; then
    usage_error "DATA_BIN $DATA_BIN: ${dicts[0]##*/} and ${dicts[1]##*/} differ; layer-wise coordination needs one joined dictionary (fairseq-preprocess --joined-dictionary)"
fi

# ---------------------------------------------------------------------------------------------
# the variant's model flags

ARCH=(--arch layerwise_coordination_iwslt_de_en)
DEFAULT_LAYERS=14
case "$VARIANT" in
    coordination) ;;
    no-sharing) ARCH+=(--no-layer-sharing); DEFAULT_LAYERS=7 ;;
    no-mixed) ARCH+=(--no-mixed-attention) ;;
    no-language) ARCH+=(--no-language-embedding) ;;
    no-position) ARCH+=(--no-position-embedding) ;;
    transformer) DEFAULT_LAYERS=6 ;;
    *) usage_error "unknown VARIANT '$VARIANT' (choose from: coordination no-sharing no-mixed no-language no-position transformer)" ;;
esac
NAME=$VARIANT
if [[ -n "$LAYERS" && "$LAYERS" != "$DEFAULT_LAYERS" ]]; then NAME="$VARIANT-layers$LAYERS"; fi
LAYERS=${LAYERS:-$DEFAULT_LAYERS}
if [[ "$VARIANT" == transformer ]]; then
    ARCH=(--arch transformer --share-all-embeddings
          --encoder-layers "$LAYERS" --decoder-layers "$LAYERS"
          --encoder-embed-dim 256 --decoder-embed-dim 256
          --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
          --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1)
    (( PRE_NORM )) && ARCH+=(--encoder-normalize-before --decoder-normalize-before)
else
    ARCH+=(--layers "$LAYERS")
    (( PRE_NORM )) && ARCH+=(--normalize-before)
fi
if (( PRE_NORM )); then NAME="$NAME-prenorm"; fi

default_user_dir

# ---------------------------------------------------------------------------------------------
# Sec. 4.3: Adam (0.9, 0.98, 1e-9) and the learning-rate schedule of Vaswani et al. (2017):
# lr = d^-0.5 * min(step^-0.5, step * warmup^-1.5) with warmup 4000, which is fairseq's
# inverse_sqrt with a linear warm-up from ~0 to d^-0.5 * warmup^-0.5 = 256^-0.5 * 4000^-0.5 = 9.88e-4.
# Label smoothing 0.1 as Vaswani et al. (the paper does not say). Batch: the paper batches the
# concatenated source + target sentences, "roughly 4096 tokens"; fairseq's --max-tokens counts
# max(source, target) per pair, about half of that, hence 2048.
SAVE_DIR="$SAVE_ROOT/$NAME"
COMMAND=(
    fairseq-train "$DATA_BIN" --user-dir "$USER_DIR"
    "${ARCH[@]}"
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-9 --clip-norm 0.0
    --lr 0.000988 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
    --weight-decay 0.0
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens "$MAX_TOKENS" --max-epoch "$MAX_EPOCH" --patience "$PATIENCE"
    --seed "$SEED"
    --save-dir "$SAVE_DIR" --no-epoch-checkpoints
    --log-format simple --log-interval 100
    "${EXTRA[@]}"
)

print_and_run

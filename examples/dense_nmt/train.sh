#!/usr/bin/env bash
# Shen et al. (NAACL 2018), "Dense Information Flow for Neural Machine Translation": the training
# setting of Sec. 4.3 for every model of Sec. 4.2 (Tables 1, 2 and 5) and their residual baselines.
# See examples/dense_nmt/README.md for the models, the readings and evaluation.
set -euo pipefail

# shellcheck source=../train-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../train-common.sh"  # PROG, REPO_ROOT and the shared helpers

usage() {
    cat <<EOF
Usage: $PROG DATA_BIN VARIANT [options] [-- extra fairseq-train arguments]

Train one model of Shen et al. (2018): NAG, lr 0.25, shrunk by 10 whenever the validation loss rises
(WMT14 En-De: at every epoch from its first rise on), stopped below lr 1e-4; batches of 32 sentences (IWSLT14 De-En, Turkish-English) or 48
(WMT14 En-De), on one GPU; decode with beam 5 (README.md).

VARIANT (IWSLT14 De-En / Tr-En, embedding 256):
  4l-2 | 4l-1        DenseNMT-4L-2 / -4L-1 (Table 1): growth 128, DenseAtt-2 / DenseAtt-1
  8l-2 | 8l-1        DenseNMT-8L-2 / -8L-1 (Table 1): growth 96, sumlen 5
  base-4l | base-8l  the residual ConvS2S baselines BASE-4L (width 256) / BASE-8L (width 192)
  enc-4l | dec-4l | att-4l
                     Table 2 ablations: DenseENC-4L / DenseDEC-4L / DenseAtt-4L (BASE-4L with only the
                     encoder / the decoder / the attention made dense)
VARIANT (WMT14 En-De):
  en-de-15           DenseNMT-En-De-15 (Table 5): fconv_wmt_en_de at 1/4 of the hidden sizes, sumlen 6
  convs2s            its baseline, Gehring et al.'s fconv_wmt_en_de

Options:
  --embed E          Table 1's smaller embeddings (64, 128): embeddings and softmax of width E, projected
                     back to 256 (IWSLT variants only)
  --summary-layer K  conv or linear summary layers (default: the preset's, linear for the 8-layer models,
                     conv for en-de-15; README.md reports both readings' sizes)
  --save-root DIR    checkpoints go to DIR/VARIANT[-embedE][-K] (default: checkpoints/densenmt)
EOF
    common_options_usage "--fp16 --seed 2"
}

EMBED=""
SUMMARY=""
SAVE_ROOT=checkpoints/densenmt
while [[ $# -gt 0 ]]; do
    case "$1" in
        --embed) need_value "$1" "$#"; check_int "$1" "$2" 1; EMBED=$((10#$2)); shift 2 ;;
        --save-root) need_value "$1" "$#"; SAVE_ROOT=$2; shift 2 ;;
        --summary-layer) need_value "$1" "$#"
            [[ "$2" == conv || "$2" == linear ]] || usage_error "--summary-layer: invalid value '$2' (choose from: conv, linear)"
            SUMMARY=$2; shift 2 ;;
        *) take_common_option "$@"; shift "$TAKEN" ;;
    esac
done
take_data_bin_and_variant
[[ -d "$DATA_BIN" ]] || usage_error "DATA_BIN $DATA_BIN: no such directory"

# ---------------------------------------------------------------------------------------------
# the variant's model (the dense presets keep BASE's width on a residual side, --residual-dim)

NO_DENSE=(--no-dense-encoder --no-dense-decoder)
BATCH=32  # "For other datasets, we set batch size to be 32"
SHRINK=()  # IWSLT: shrink at every rise of the validation loss
case "$VARIANT" in
    4l-2) MODEL=(--arch dense_fconv_iwslt_de_en) ;;
    4l-1) MODEL=(--arch dense_fconv_iwslt_de_en --dense-attention 1) ;;
    8l-2) MODEL=(--arch dense_fconv_iwslt_de_en_8l) ;;
    8l-1) MODEL=(--arch dense_fconv_iwslt_de_en_8l --dense-attention 1) ;;
    base-4l) MODEL=(--arch dense_fconv_iwslt_de_en "${NO_DENSE[@]}" --dense-attention none) ;;
    base-8l) MODEL=(--arch dense_fconv_iwslt_de_en_8l "${NO_DENSE[@]}" --dense-attention none --summary-every 0) ;;
    enc-4l) MODEL=(--arch dense_fconv_iwslt_de_en --no-dense-decoder --dense-attention none) ;;
    dec-4l) MODEL=(--arch dense_fconv_iwslt_de_en --no-dense-encoder --dense-attention none) ;;
    att-4l) MODEL=(--arch dense_fconv_iwslt_de_en "${NO_DENSE[@]}") ;;
    # "batch size for WMT14 English-German ... 48"; the rate shrinks "every epoch since the first increment"
    en-de-15) MODEL=(--arch dense_fconv_wmt_en_de); BATCH=48; SHRINK=(--shrink-every-epoch-after-increase) ;;
    convs2s) MODEL=(--arch fconv_wmt_en_de); BATCH=48; SHRINK=(--shrink-every-epoch-after-increase) ;;
    *) usage_error "unknown VARIANT '$VARIANT' (choose from: 4l-2 4l-1 8l-2 8l-1 base-4l base-8l enc-4l dec-4l att-4l en-de-15 convs2s)" ;;
esac
NAME=$VARIANT
if [[ -n "$EMBED" ]]; then
    [[ $BATCH -eq 32 ]] || usage_error "--embed $EMBED: the smaller embeddings of Table 1 are IWSLT models; VARIANT $VARIANT is a WMT model"
    (( EMBED <= 256 )) || usage_error "--embed $EMBED: must not exceed the embedding size 256"
    MODEL+=(--embed-bottleneck-dim "$EMBED")
    NAME="$VARIANT-embed$EMBED"
fi
if [[ -n "$SUMMARY" ]]; then
    [[ "$VARIANT" != convs2s ]] || usage_error "--summary-layer $SUMMARY: VARIANT convs2s has no summary layers"
    MODEL+=(--summary-layer "$SUMMARY")
    NAME="$NAME-$SUMMARY"
fi

default_user_dir

# Sec. 4.3: NAG (momentum 0.99, fairseq's ConvS2S), lr 0.25; lr / 10 whenever the validation loss
# rises above the previous epoch's (WMT: at every epoch end from the first rise on), the plugin's
# shrink_on_validation_increase; stop below lr 1e-4. Gradient clipping 0.1 and dropout 0.2 as
# fairseq's ConvS2S recipe (the paper gives neither). No label smoothing: the paper names none and
# its ConvS2S (Gehring et al. 2017) trains with plain cross-entropy.
SAVE_DIR="$SAVE_ROOT/$NAME"
COMMAND=(
    fairseq-train "$DATA_BIN" --user-dir "$USER_DIR"
    "${MODEL[@]}"
    --optimizer nag --momentum 0.99 --lr 0.25 --clip-norm 0.1
    --lr-scheduler shrink_on_validation_increase --lr-shrink 0.1 "${SHRINK[@]}" --stop-min-lr 1e-4
    --dropout 0.2 --criterion cross_entropy
    --batch-size "$BATCH"
    # one GPU, as the paper (its speeds are on a single M40): fairseq would otherwise train on every
    # visible GPU, each with its own batch of 32 (48), which multiplies the paper's batch
    --distributed-world-size 1
    --save-dir "$SAVE_DIR" --keep-last-epochs 5
    --log-format simple --log-interval 100
    "${EXTRA[@]}"
)

print_and_run

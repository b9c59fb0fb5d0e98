#!/usr/bin/env bash
# The GPU measurements, prepared on any online machine and run on one NVIDIA GPU without internet.
#
#   bash examples/gpu/run.sh prepare [KIT]   online: wheels for Python 3.12
#   bash examples/gpu/run.sh install [KIT]   GPU machine: fusion-fairseq from KIT, beside its CUDA torch
#   bash examples/gpu/run.sh half OUT        GPU: every architecture in fp16, bf16, memory-efficient fp16
#   bash examples/gpu/run.sh speed OUT       GPU: the papers' speed ratios at Transformer-Base size, bf16
#
# KIT (default: gpu-kit/ in this checkout, ignored by git) travels with the checkout to the GPU
# machine. OUT receives small results only (logs, JSON, Markdown). SMOKE=1 runs speed at toy size on
# the CPU, which is how tests/test_gpu_runbook.py checks its commands.
# OUT is run.sh's own folder: one holding files it did not write is refused unless FORCE=1; every file
# is written by replace_file (scripts/files.sh), and Python imports nothing from the working directory (-P).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
source "$REPO/scripts/files.sh"
STEP=${1:-}
PY=${PYTHON:-python3}
usage() { sed -n '4,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
fail() { echo "run.sh $STEP: $*" >&2; exit 2; }
# OUT (made if missing) as run.sh's own folder, its NAMEs that are links removed
need_out() {
    local out=${1:-} held
    shift || true
    [[ -n "$out" ]] || fail "missing the output folder OUT"
    [[ ! -e "$out" || -d "$out" ]] || fail "OUT $out is not a folder"
    held=$(claim_folder "$out" "fusion-fairseq examples/gpu/run.sh" "$@") \
        || fail "OUT $out holds files that run.sh did not write: $held; set FORCE=1 to replace them, or give another OUT"
}

# Packages a CUDA PyTorch image already has, left out of the wheelhouse to keep the kit small; pip
# names any that the target lacks when it installs offline.
IMAGE_HAS=torch,torchaudio,numpy,scipy,scikit-learn,matplotlib,pillow,fonttools,lxml,cython,kiwisolver,contourpy,pyyaml,regex,joblib,threadpoolctl,packaging,tqdm,tabulate

# Dou et al. Table 1, MLRF's Dec-SA and Both-FNN-SA, SurfaceFusion; every ratio against fairseq's transformer.
# Batches of 128 sentence pairs of 32 tokens a side: the papers' 4,096 tokens per GPU and step, so that
# the matrix products, not the kernel launches of a tiny batch, set the pace
SPEED=(--encoder-layers 6 --decoder-layers 6 --embed-dim 512 --ffn-dim 2048 --heads 8 --vocab 32000
       --batch-size 128 --src-len 32 --tgt-len 32 --steps 10 --device cuda --dtype bf16 --repeats 5 --archs
       --variant "no fusion=fusion_transformer:"
       --variant "Dense=fusion_transformer:--aggregate-encoder dense --aggregate-decoder dense"
       --variant "Linear=fusion_transformer:--aggregate-encoder linear --aggregate-decoder linear"
       --variant "Iterative=fusion_transformer:--aggregate-encoder iterative --aggregate-decoder iterative"
       --variant "Hierarchical=fusion_transformer:--aggregate-encoder hierarchical --aggregate-decoder hierarchical"
       --variant "MLA-k2=fusion_transformer:--multi-layer-attention 2"
       --variant "MLRF Dec-SA=fusion_transformer:--fuse-decoder sa"
       --variant "MLRF Both-FNN-SA=fusion_transformer:--fuse-encoder fnn --fuse-decoder sa"
       --variant "SurfaceFusion-hard=fusion_transformer:--surface-fusion hard"
       --variant "SurfaceFusion-soft=fusion_transformer:--surface-fusion soft"
       --variant "Coarse-LA=fusion_transformer:--layer-attention coarse"
       --variant "Fine-LA=fusion_transformer:--layer-attention fine")
# DenseNMT against its convolutional baseline of similar size (Shen et al.: 8.1% slower per step)
SPEED_DENSENMT=(--baseline-arch fconv_iwslt_de_en --archs --vocab 32000 --batch-size 128 --src-len 32 --tgt-len 32
                --steps 10 --device cuda --dtype bf16 --repeats 5 --variant 'BASE-4L=fconv_iwslt_de_en:--decoder-layers "[(256, 3)] * 4"'
                --variant "DenseNMT-4L-2=dense_fconv_iwslt_de_en:")
if [[ "${SMOKE:-0}" == 1 ]]; then  # the same commands at toy size on the CPU: later flags override earlier ones
    SMOKE_SIZE=(--encoder-layers 3 --decoder-layers 3 --embed-dim 16 --ffn-dim 32 --heads 2 --vocab 64
                --batch-size 2 --device cpu --dtype fp32 --repeats 1 --steps 1 --warmup 0 --decode-batches 1
                --decode-warmup 0 --no-memory --no-flops)
    SPEED+=("${SMOKE_SIZE[@]}")
    SPEED_DENSENMT+=("${SMOKE_SIZE[@]}")
fi

case "$STEP" in
    prepare)
        KIT=${2:-$REPO/gpu-kit}
        # the wheelhouse script is tested by tests/test_install.py
        if [[ -d "$KIT/wheels" ]]; then echo "run.sh prepare: keeping the wheels in $KIT/wheels"
        else bash "$REPO/scripts/wheelhouse.sh" "$KIT/wheels" --python 3.12 --exclude "$IMAGE_HAS"
        fi
        du -sh "$KIT" ;;
    install)
        KIT=${2:-$REPO/gpu-kit}
        "$PY" -P -m pip install --quiet --no-index --find-links "$KIT/wheels" --no-build-isolation -e "$REPO[test]"
        "$PY" -P -c 'import torch, fairseq, fusion_fairseq; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "fairseq", fairseq.__version__)' ;;
    half)
        need_out "${2:-}" half.xml half.log
        # a passing test's folder goes at once (54 checkpoints at the presets' sizes fill a 64 GB disk);
        # -rfE lists every failure with its message at the end of half.log; loadgroup keeps the largest
        # models from training at the same time (tests/conformance_utils.py, LARGEST_ARCHITECTURES)
        PARALLEL=(); ((${WORKERS:-8} > 1)) && PARALLEL=(-n "${WORKERS:-8}" --dist loadgroup)  # WORKERS=1: no xdist
        "$PY" -P -m pytest -q -rfE -p no:cacheprovider -p no:benchmark -o tmp_path_retention_policy=failed \
            "$REPO/tests/test_gpu_training.py" "$REPO/tests/test_half_precision.py" -k "cuda or trains_and_decodes" \
            -m "slow or not slow" "${PARALLEL[@]}" --junitxml "$2/half.xml" \
            2>&1 | tee_file "$2/half.log" ;;
    speed)
        need_out "${2:-}" speed.json speed.md speed-densenmt.json speed-densenmt.md
        "$PY" -P "$REPO/scripts/benchmark.py" "${SPEED[@]}" --json "$2/speed.json" --markdown "$2/speed.md"
        "$PY" -P "$REPO/scripts/benchmark.py" "${SPEED_DENSENMT[@]}" --json "$2/speed-densenmt.json" \
            --markdown "$2/speed-densenmt.md" ;;
    *) usage ;;
esac

#!/usr/bin/env bash
# The GPU measurements, prepared on any online machine and run on one NVIDIA GPU without internet.
#
#   bash examples/gpu/run.sh prepare [KIT]   online: wheels for Python 3.12
#   bash examples/gpu/run.sh install [KIT]   GPU machine: fusion-fairseq from KIT, beside its CUDA torch
#   bash examples/gpu/run.sh half OUT        GPU: every architecture in fp16, bf16, memory-efficient fp16
#   bash examples/gpu/run.sh speed OUT       GPU: speed ratios at Transformer-Base size, bf16, 4,096 tokens a step
#   bash examples/gpu/run.sh speed-more OUT  GPU: the same at 16,384 tokens a step, and DenseNMT against its baseline
#
# KIT (default: gpu-kit/ in this checkout, ignored by git) travels with the checkout to the GPU
# machine. OUT receives small results only (logs, JSON, Markdown). SMOKE=1 runs speed and speed-more at toy
# size on the CPU, which is how tests/test_gpu_runbook.py checks their commands.
# OUT is run.sh's own folder: one holding files it did not write is refused unless FORCE=1; every file
# is written by replace_file (scripts/files.sh), and Python imports nothing from the working directory (-P).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
source "$REPO/scripts/files.sh"
STEP=${1:-}
PY=${PYTHON:-python3}
usage() { sed -n '4,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
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

# Every speed measurement: 7 rounds, interleaved, so that each ratio's median has a distribution-free 95%
# interval (docs/measurements.md); 3 untimed and 25 timed training steps a round (over a second at the
# Transformer's 82,700 tokens/s on one H100), 1 untimed and 2 timed decode batches; a second copy of the
# Transformer as the noise floor. About 6 minutes for speed, 4 for speed-more, on one H100 (estimated from the
# pace of the earlier, shorter run there: examples/gpu/README.md).
BASE_SIZE=(--encoder-layers 6 --decoder-layers 6 --embed-dim 512 --ffn-dim 2048 --heads 8 --vocab 32000
           --device cuda --dtype bf16 --repeats 7 --warmup 3 --steps 25 --decode-warmup 1 --decode-batches 2)
NOISE_FLOOR=(--variant "transformer again=transformer:")
TODAYS=(--variant "DenseFormer-1x1=fusion_transformer:--denseformer-encoder --denseformer-decoder"
        --variant "SHCx4=fusion_transformer:--hyper-connections-encoder static --hyper-connections-decoder static"
        --variant "DHCx4=fusion_transformer:--hyper-connections-encoder dynamic --hyper-connections-decoder dynamic"
        --variant "mHCx4=fusion_transformer:--hyper-connections-encoder manifold --hyper-connections-decoder manifold"
        --variant "MUDDFormer=fusion_transformer:--mudd-encoder --mudd-decoder")
# Dou et al. Table 1, MLRF's Dec-SA and Both-FNN-SA, SurfaceFusion and today's layer fusion against fairseq's
# transformer, in batches of 128 sentence pairs of 32 tokens a side: the papers' 4,096 tokens per GPU and step
SPEED=("${BASE_SIZE[@]}" --batch-size 128 --src-len 32 --tgt-len 32 --archs "${NOISE_FLOOR[@]}"
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
       --variant "Fine-LA=fusion_transformer:--layer-attention fine" "${TODAYS[@]}")
# a larger batch, closer to compute-bound, where the n-fold streams cost memory bandwidth rather than launches:
# 512 pairs of 32 tokens a side to train, 64 sentences to decode; today's layer fusion only
SPEED_LARGE=("${BASE_SIZE[@]}" --batch-size 512 --src-len 32 --tgt-len 32 --steps 10 --decode-batch-size 64
             --archs "${NOISE_FLOOR[@]}" "${TODAYS[@]}")
# DenseNMT against its convolutional baseline of similar size (Shen et al.: 8.1% slower per step)
SPEED_DENSENMT=("${BASE_SIZE[@]}" --baseline-arch fconv_iwslt_de_en --batch-size 128 --src-len 32 --tgt-len 32
                --archs --variant "fconv again=fconv_iwslt_de_en:"
                --variant 'BASE-4L=fconv_iwslt_de_en:--decoder-layers "[(256, 3)] * 4"'
                --variant "DenseNMT-4L-2=dense_fconv_iwslt_de_en:")
if [[ "${SMOKE:-0}" == 1 ]]; then  # the same commands at toy size on the CPU: later flags override earlier ones
    SMOKE_SIZE=(--encoder-layers 3 --decoder-layers 3 --embed-dim 16 --ffn-dim 32 --heads 2 --vocab 64
                --batch-size 2 --decode-batch-size 2 --device cpu --dtype fp32 --repeats 1 --steps 1 --warmup 0
                --decode-batches 1 --decode-warmup 0 --no-memory --no-flops)
    SPEED+=("${SMOKE_SIZE[@]}")
    SPEED_LARGE+=("${SMOKE_SIZE[@]}")
    SPEED_DENSENMT+=("${SMOKE_SIZE[@]}")
fi
# OUT/device.txt and OUT/pip-freeze.txt: the machine and every package version beside its results; a record
# that cannot be made is said on stderr and does not stop the measurement it would describe
record_machine() {
    replace_file "$1/device.txt" "$PY" -P -c 'import platform, shutil, subprocess, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
if shutil.which("nvidia-smi"):
    print(subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True).stdout)
print(platform.platform(), platform.processor() or platform.machine())' \
        || echo "run.sh $STEP: warning: no device record in $1/device.txt" >&2
    replace_file "$1/pip-freeze.txt" "$PY" -P -m pip freeze \
        || echo "run.sh $STEP: warning: no package list in $1/pip-freeze.txt" >&2
}
benchmark() {  # benchmark OUT NAME FLAGS...: OUT/NAME.json and OUT/NAME.md
    local out=$1 name=$2
    shift 2
    "$PY" -P "$REPO/scripts/benchmark.py" "$@" --json "$out/$name.json" --markdown "$out/$name.md"
}

case "$STEP" in
    prepare)
        KIT=${2:-$REPO/gpu-kit}
        # the wheelhouse script is tested by tests/test_install.py
        if [[ -d "$KIT/wheels" ]]; then echo "run.sh prepare: keeping the wheels in $KIT/wheels"
        else bash "$REPO/scripts/wheelhouse.sh" "$KIT/wheels" --python 3.12 --exclude "$IMAGE_HAS"
        fi
        # install's [test] extra (pyproject.toml), for an image without pytest; a wheel already there is kept
        "$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation=cp \
            --platform manylinux2014_x86_64 --dest "$KIT/wheels" "pytest>=7" "pytest-xdist>=3"
        du -sh "$KIT" ;;
    install)
        KIT=${2:-$REPO/gpu-kit}
        "$PY" -P -m pip install --quiet --no-index --find-links "$KIT/wheels" --no-build-isolation -e "$REPO[test]"
        "$PY" -P -c 'import torch, fairseq, fusion_fairseq; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "fairseq", fairseq.__version__)' ;;
    half)
        need_out "${2:-}" half.xml half.log device.txt pip-freeze.txt
        record_machine "$2"
        # a passing test's folder goes at once (54 checkpoints at the presets' sizes fill a 64 GB disk);
        # -rfE lists every failure with its message at the end of half.log; loadgroup keeps the largest
        # models from training at the same time (tests/conformance_utils.py, LARGEST_ARCHITECTURES)
        PARALLEL=(); ((${WORKERS:-8} > 1)) && PARALLEL=(-n "${WORKERS:-8}" --dist loadgroup)  # WORKERS=1: no xdist
        "$PY" -P -m pytest -q -rfE -p no:cacheprovider -p no:benchmark -o tmp_path_retention_policy=failed \
            "$REPO/tests/test_gpu_training.py" "$REPO/tests/test_half_precision.py" -k "cuda or trains_and_decodes" \
            -m "slow or not slow" "${PARALLEL[@]}" --junitxml "$2/half.xml" \
            2>&1 | tee_file "$2/half.log" ;;
    speed)
        need_out "${2:-}" speed.json speed.md device.txt pip-freeze.txt
        record_machine "$2"
        benchmark "$2" speed "${SPEED[@]}" ;;
    speed-more)
        need_out "${2:-}" speed-large.json speed-large.md speed-densenmt.json speed-densenmt.md device.txt pip-freeze.txt
        record_machine "$2"
        benchmark "$2" speed-large "${SPEED_LARGE[@]}"
        benchmark "$2" speed-densenmt "${SPEED_DENSENMT[@]}" ;;
    *) usage ;;
esac

#!/usr/bin/env bash
# The GPU measurements, prepared on any online machine and run on one NVIDIA GPU without internet.
#
#   bash examples/gpu/run.sh prepare [KIT]   online: wheels for Python 3.12 and the binarised Multi30k
#   bash examples/gpu/run.sh install [KIT]   GPU machine: fusion-fairseq from KIT, beside its CUDA torch
#   bash examples/gpu/run.sh half OUT        GPU: every architecture in fp16, bf16, memory-efficient fp16
#   bash examples/gpu/run.sh speed OUT       GPU: the papers' speed ratios at Transformer-Base size, bf16
#   bash examples/gpu/run.sh compare OUT [KIT]  GPU: the 6+6 comparison's plan (examples/comparison/deep.sh)
#
# KIT (default: gpu-kit/ in this checkout, ignored by git) travels with the checkout to the GPU
# machine: 26 MB. OUT receives small results only (logs, JSON, Markdown, the comparison's
# compare.tar.gz); the comparison's checkpoints and data stay in WORK (default: gpu-work/compare/ in
# this checkout). SMOKE=1 runs prepare (without the wheels), speed and compare at toy size on the CPU,
# which is how tests/test_gpu_runbook.py checks these commands. OUT is run.sh's own folder: one holding
# files it did not write is refused unless FORCE=1; every file is written by replace_file
# (scripts/files.sh), and Python imports nothing from the working directory (-P).
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
RAW=${MULTI30K_RAW:-$REPO/../shared/data/multi30k/raw}
TEST_SETS=(test_2016_flickr test_2017_flickr test_2017_mscoco test_2018_flickr)

# the 6+6 comparison's plan, as examples/comparison/deep.sh runs it on the CPU (same width, budget, seeds and
# rules, float32), so that the CPU runs replicate it on another device; 16 runs at a time on the one GPU, one
# CPU thread each: every from-scratch run of seeds 1 and 2 but two starts at once
COMPARE=(--deep --max-update 3000 --finetune-update 1000 --eval-every 250 --seeds 1 2 --device cuda
         --jobs 16 --threads 1)
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
    COMPARE+=(--width 1+1:16:32:2 --dropout 0.1 --max-update 4 --finetune-update 2 --eval-every 2 --seeds 1
              --device cpu --jobs 1 --threads 1 --train-args= --max-tokens 512 --warmup 2
              --methods transformer --gen-args="--max-len-a 0 --max-len-b 12")
    SMOKE_SIZE=(--encoder-layers 3 --decoder-layers 3 --embed-dim 16 --ffn-dim 32 --heads 2 --vocab 64
                --batch-size 2 --device cpu --dtype fp32 --repeats 1 --steps 1 --warmup 0 --decode-batches 1
                --decode-warmup 0 --no-memory --no-flops)
    SPEED+=("${SMOKE_SIZE[@]}")
    SPEED_DENSENMT+=("${SMOKE_SIZE[@]}")
fi

case "$STEP" in
    prepare)
        KIT=${2:-$REPO/gpu-kit}
        [[ -f "$RAW/train.de" ]] || { echo "run.sh prepare: no Multi30k in $RAW (set MULTI30K_RAW)" >&2; exit 2; }
        # the wheelhouse script is tested by tests/test_install.py; the smoke run skips its download
        if [[ -d "$KIT/wheels" ]]; then echo "run.sh prepare: keeping the wheels in $KIT/wheels"
        elif [[ "${SMOKE:-0}" != 1 ]]; then bash "$REPO/scripts/wheelhouse.sh" "$KIT/wheels" --python 3.12 --exclude "$IMAGE_HAS"
        fi
        # the comparison's own data preparation (comparison.prepare_data): joint BPE 8,000, joined
        # dictionary; made in a scratch folder, of which the kit keeps the binarised data and the BPE codes
        if [[ ! -f "$KIT/multi30k/data-bin/recipe.env" ]]; then
            [[ ! -e "$KIT/multi30k" ]] || { echo "run.sh prepare: $KIT/multi30k exists without prepared data; move it away" >&2; exit 2; }
            WORK=$(mktemp -d)
            PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" -P -m fusion_lab.corpus prepare multi30k \
                --from "$RAW" --dest "$WORK" --src de --tgt en --test-set test_2016_flickr --bpe-merges 8000
            mkdir -p "$KIT" && mkdir "$KIT/multi30k" && mv "$WORK/data-bin" "$WORK/code" "$KIT/multi30k/" && rm -rf "$WORK"
        fi
        # the kit's folders are written into only when they are this user's own and no link
        for folder in "$KIT/multi30k" "$KIT/multi30k/test-raw"; do
            [[ ! -L "$folder" ]] || fail "$folder is a link; move it away"
            [[ ! -e "$folder" || -z "$(untrusted "$folder")" ]] \
                || fail "$folder holds $(untrusted "$folder"), owned by another user or writable by group or others; move it away"
        done
        mkdir -p "$KIT/multi30k/test-raw"
        for name in "${TEST_SETS[@]}"; do
            for lang in de en; do
                [[ -e "$KIT/multi30k/test-raw/$name.$lang" ]] || replace_file "$KIT/multi30k/test-raw/$name.$lang" cat -- "$RAW/$name.$lang"
            done
        done
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
    compare)
        # the runs train in WORK; OUT receives the report, the runner's log and compare.tar.gz, the runs'
        # small results (examples/comparison/small-results.sh). TIME_LIMIT=S stops the runner after S
        # seconds (exit 124) and still packs what exists; the same command resumes from WORK
        need_out "${2:-}" compare.log results.md results.json learning_curves.png compare.tar.gz
        OUT=$(cd "$2" && pwd) KIT=${3:-$REPO/gpu-kit} WORK=${WORK:-$REPO/gpu-work/compare}
        mkdir -p "$WORK"  # compare_methods.py's own folder, which it claims
        status=0
        timeout "${TIME_LIMIT:-0}" "$PY" -P "$REPO/scripts/compare_methods.py" --out "$WORK" \
            --data-bin "$KIT/multi30k/data-bin" --raw "$KIT/multi30k/test-raw" "${COMPARE[@]}" 2>&1 \
            | tee_file "$OUT/compare.log" || status=$?
        for report in results.md results.json learning_curves.png; do
            [[ ! -f "$WORK/$report" || -L "$WORK/$report" ]] || replace_file "$OUT/$report" cat -- "$WORK/$report"
        done
        pack() { bash "$REPO/examples/comparison/small-results.sh" "$WORK" | tar -czf - -C "$WORK" -T -; }
        replace_file "$OUT/compare.tar.gz" pack
        ((status != 124)) || echo "run.sh compare: stopped after TIME_LIMIT=$TIME_LIMIT s; the same command resumes" >&2
        exit "$status" ;;
    *) usage ;;
esac

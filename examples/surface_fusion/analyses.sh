#!/usr/bin/env bash
# The analyses of Liu et al. (2021) on the checkpoints of a quickstart run:
#
#   examples/quickstart.sh --models transformer,fgla,surface_fusion --out qs
#   examples/surface_fusion/analyses.sh [--force] qs [FIGURES_DIR]   # default FIGURES_DIR: qs/analyses
#
# Needs qs/checkpoints/fgla/checkpoint_best.pt (fine-grained layer attention). Every model of the
# run that exists among transformer, fgla and surface_fusion enters Figure 4 and Table 3. Writes:
#   fig1_layer_attention.png/.json  decoder-layer x encoder-layer weights (Figure 1)
#   fig2_masking.png/.json          BLEU and output length with each encoder layer masked (Figure 2)
#   fig3_attended_dims.png/.json    spectra of the more / less attended embedding dimensions (Figure 3)
#   fig4_spectrum.png/.json         spectra of the embedding matrices of each model (Figure 4)
#   table3_cosine.json              cosine of aligned source/target embeddings (Table 3), with the
#                                   synthetic corpus's bilingual dictionary (qs/raw/dict.SRC-TGT.txt)
#                                   or DICT=FILE for a run on real data
# DATA=DIR/data-bin for a run trained on the output of corpus prepare (quickstart --data DIR).
# An existing output file is overwritten only with --force (a rerun needs it).
# PYTHON selects the interpreter (default: python3, else python) that has fusion-fairseq installed.
set -euo pipefail
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
force=()
if [[ "${1:-}" == --force ]]; then force=(--force); shift; fi
if [[ $# -lt 1 || $# -gt 2 ]]; then usage >&2; exit 2; fi
if [[ -z "${PYTHON:-}" ]]; then
  if command -v python3 >/dev/null 2>&1; then PYTHON=python3; else PYTHON=python; fi
fi
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
scripts="$(cd "$(dirname "$0")/../../scripts" && pwd)"
run="$1"
figures="${2:-$run/analyses}"
data="${DATA:-$run/data-bin}"
fgla="$run/checkpoints/fgla/checkpoint_best.pt"
if [[ ! -f "$fgla" ]]; then
  echo "error: $fgla not found: train it with examples/quickstart.sh --models transformer,fgla,surface_fusion --out $run" >&2
  exit 2
fi
if [[ ! -d "$data" ]]; then
  echo "error: $data not found: is $run the --out directory of a quickstart run? (one trained with --data DIR: pass DATA=DIR/data-bin)" >&2
  exit 2
fi
mkdir -p "$figures"

models=()  # --path/--label pairs of every checkpoint the run has, for Figure 4 and Table 3
for name in transformer fgla surface_fusion; do
  checkpoint="$run/checkpoints/$name/checkpoint_best.pt"
  [[ -f "$checkpoint" ]] && models+=(--path "$checkpoint" --label "$name")
done

echo "== Figure 1: layer-attention weights"
"$PYTHON" "$scripts/plot_layer_attention.py" "${force[@]}" --path "$fgla" --data "$data" \
  --out "$figures/fig1_layer_attention.png" --json "$figures/fig1_layer_attention.json"

echo "== Figure 2: masking one encoder layer at a time (fairseq-generate on the test split)"
"$PYTHON" "$scripts/mask_encoder_layers.py" "${force[@]}" --data "$data" --path "$fgla" --gen-subset test --beam 5 \
  --remove-bpe --batch-size 128 --out "$figures/fig2_masking.png" --json "$figures/fig2_masking.json"

echo "== Figure 3: spectra of the more / less attended embedding dimensions"
"$PYTHON" "$scripts/embedding_analysis.py" spectrum "${force[@]}" --path "$fgla" --data "$data" --split-by-attention \
  --out "$figures/fig3_attended_dims.png" --json "$figures/fig3_attended_dims.json"

echo "== Figure 4: spectra of the embedding matrices"
"$PYTHON" "$scripts/embedding_analysis.py" spectrum "${force[@]}" "${models[@]}" --data "$data" \
  --out "$figures/fig4_spectrum.png" --json "$figures/fig4_spectrum.json"

synthetic_dicts=("$run"/raw/dict.*-*.txt)  # written by the synthetic corpus (fusion_lab/synthetic.py)
dict="${DICT:-${synthetic_dicts[0]}}"
if [[ -f "$dict" ]]; then
  echo "== Table 3: cosine of aligned source/target embeddings ($dict)"
  "$PYTHON" "$scripts/embedding_analysis.py" cosine "${force[@]}" "${models[@]}" --data "$data" --dict "$dict" \
    --json "$figures/table3_cosine.json"
else
  echo "== Table 3 skipped: no bilingual dictionary at $dict (set DICT=FILE, one 'source target' pair per line)"
fi
echo "written: $figures"

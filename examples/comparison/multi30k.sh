#!/usr/bin/env bash
# RAW for the comparisons (converged.sh, deep.sh, scripts/compare_methods.py --raw): the Multi30k task-1
# raw De/En files, downloaded from the dataset's repository at one commit, unzipped, and checked against
# the SHA-256 of the files the committed runs read (multi30k.sha256) before they appear in RAW.
#
#   bash examples/comparison/multi30k.sh RAW     RAW: a new folder
#
# MULTI30K_BASE replaces the address of that commit (a mirror holding data/task1/raw/*.gz).
set -euo pipefail
COMMIT=a3d2e0d26b56f3846f66a952536ffed4e401d05a  # as fusion_lab/corpus.py downloads
BASE=${MULTI30K_BASE:-https://raw.githubusercontent.com/multi30k/dataset/$COMMIT}
SUMS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/multi30k.sha256"
fail() { echo "multi30k.sh: error: $*" >&2; exit 1; }

usage="usage: bash examples/comparison/multi30k.sh RAW (a new folder)"
if [ $# -eq 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then echo "$usage"; exit 0; fi
if [ $# -ne 1 ] || [[ $1 == -* ]]; then echo "$usage; an option is not a folder" >&2; exit 2; fi
RAW=$1
if [ -e "$RAW" ] || [ -L "$RAW" ]; then
  echo "multi30k.sh: error: RAW '$RAW' exists; give a new folder (nothing in it is replaced)" >&2; exit 2
fi
mkdir -p "$(dirname "$RAW")"
work=$(mktemp -d "$(dirname "$RAW")/.multi30k.XXXXXX")  # beside RAW: the final move is a rename
trap 'rm -rf "$work"' EXIT
for file in $(awk '{print $2}' "$SUMS"); do
  echo "downloading $BASE/data/task1/raw/$file.gz"
  curl -fsSL --retry 3 "$BASE/data/task1/raw/$file.gz" | gunzip > "$work/$file" \
    || fail "download of $BASE/data/task1/raw/$file.gz failed (offline? then set MULTI30K_BASE to a mirror)"
done
(cd "$work" && sha256sum --quiet -c "$SUMS") \
  || fail "the files above differ from the ones the committed runs read ($SUMS); RAW was not made"
chmod 755 "$work"
mv -nT "$work" "$RAW"
[ ! -e "$work" ] || fail "RAW '$RAW' appeared meanwhile; nothing in it was replaced"
echo "wrote $RAW"

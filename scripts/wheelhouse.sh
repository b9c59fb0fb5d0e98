#!/usr/bin/env bash
# Collect every wheel fusion-fairseq needs on an offline Linux x86-64 machine into one folder.
#
#   bash scripts/wheelhouse.sh DIR [--python 3.11|3.12] [--glibc 2.28] [--exclude torch,...]
#   # then, on the offline machine, beside the torch it already has:
#   pip install --no-index --find-links DIR fusion-fairseq
# torch and what only it pulls in (CUDA libraries, triton, ...) stay the target's own. Run from a clone,
# online, with Python >= 3.11; wheels are for CPython --python (default this one's), manylinux up to
# --glibc (default 2.28, the oldest the torch and ve-fairseq wheels support), never built for this host.
set -euo pipefail

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "wheelhouse.sh: $*" >&2; exit 2; }

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY=python DEST="" GLIBC="2.28" EXCLUDE="torch"
TARGET_PYTHON="$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

while [ $# -gt 0 ]; do
    case "$1" in
        --python) [ $# -ge 2 ] || die "--python needs a value (3.11 or 3.12)"; TARGET_PYTHON="$2"; shift 2 ;;
        --glibc) [ $# -ge 2 ] || die "--glibc needs a value such as 2.28"; GLIBC="$2"; shift 2 ;;
        --exclude) [ $# -ge 2 ] || die "--exclude needs a comma-separated list of package names"; EXCLUDE="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option $1 (allowed: --python, --glibc, --exclude, --help)" ;;
        *) [ -z "$DEST" ] || die "one output folder only, got '$DEST' and '$1'"; DEST="$1"; shift ;;
    esac
done
[ -n "$DEST" ] || die "missing the output folder: wheelhouse.sh DIR [--python 3.12]"
case "$TARGET_PYTHON" in
    3.11|3.12) ;;
    3.13) die "--python 3.13: ve-fairseq (fairseq for Python >= 3.11) publishes wheels for 3.11 and 3.12 only, so pip cannot install fusion-fairseq on 3.13; use 3.11 or 3.12" ;;
    *) die "--python '$TARGET_PYTHON' is not supported (allowed: 3.11, 3.12)" ;;
esac
[[ "$GLIBC" =~ ^2\.([0-9]+)$ ]] || die "--glibc '$GLIBC' is not a glibc version such as 2.28"
GLIBC_MINOR="${BASH_REMATCH[1]}"
[ "$GLIBC_MINOR" -ge 17 ] || die "--glibc '$GLIBC' is older than manylinux2014 (2.17), which is the oldest allowed"
[ ! -e "$DEST" ] || [ -z "$(ls -A "$DEST")" ] ||
    die "output folder '$DEST' exists and is not empty; give a new or empty folder (nothing is overwritten)"
DEST="$(mkdir -p "$DEST" && cd "$DEST" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# pip matches manylinux_2_N tags literally: every glibc from 2.17 (manylinux2014) up is named
PLATFORMS=(--platform manylinux2014_x86_64)
for minor in $(seq 17 "$GLIBC_MINOR"); do PLATFORMS+=(--platform "manylinux_2_${minor}_x86_64"); done
TARGET=(--only-binary=:all: "${PLATFORMS[@]}" --python-version "$TARGET_PYTHON" --implementation cp)

echo "== the plugin's own wheel"
$PY -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "$REPO"

# hydra-core needs antlr4-python3-runtime 4.9.*, a pure-Python source archive only: built here, it installs anywhere
echo "== source-only pure-Python dependencies, built into wheels"
$PY -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "antlr4-python3-runtime==4.9.3"

echo "== resolving the dependencies for CPython $TARGET_PYTHON, manylinux (glibc <= $GLIBC) x86-64"
# a dry run resolves the tree from the indexes' metadata (no torch download); its report gives what is needed
$PY -m pip install --quiet --dry-run --ignore-installed --target "$WORK/none" --report "$WORK/report.json" \
    "${TARGET[@]}" --find-links "$DEST" "$(ls "$DEST"/fusion_fairseq-*.whl)"
$PY "$REPO/scripts/wheelhouse_needs.py" "$WORK/report.json" \
    --python "$TARGET_PYTHON" --exclude "$EXCLUDE" > "$WORK/needs.txt"

echo "== downloading $(wc -l < "$WORK/needs.txt") wheels (left out: $EXCLUDE and what only they need)"
$PY -m pip download --quiet --no-deps "${TARGET[@]}" --find-links "$DEST" --dest "$DEST" -r "$WORK/needs.txt"

echo "wheelhouse: $DEST ($(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1))"
echo "install offline, beside torch: pip install --no-index --find-links $DEST fusion-fairseq"

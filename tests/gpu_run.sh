#!/usr/bin/env bash
# What a lent GPU's minutes measure, in one run: tests/gpu_run.sh OUT [--device cpu]
#
# Runs with the machine's python3 as it is (torch, triton, transformers, tiktoken; no
# agent stack, no network) plus only the wheels carried in wheels/ (git-ignored; fetch
# them with the command in the README's "A lent GPU" section). Each step has its own
# timeout and its own process, and writes each figure the moment it exists, so a step
# that runs out of time leaves the others' figures. Writes to OUT, at most 8 files:
#   summary.md     every step's end and every figure against its target
#   figures.json   the same as data (engine/benchmarks/device_run.py writes it)
#   run.log        everything the steps printed
#   junit.xml      the gpu tests and the compiled-kernel matrix
#   step-grid.json the step-time grid (kvgov twin fit --grid step-grid.json refits it)
# Exits non-zero if a step failed or timed out; the figures of the others are still there.
# The timeouts add up to under 6 minutes. --device cpu runs every step's short form on
# tiny-random (CI does, in a venv holding only the image's packages: tests/test_gpu_run.py).
set -uo pipefail

usage() { echo "usage: tests/gpu_run.sh OUT [--device cuda|cpu] [--wheels DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1
shift
DEVICE=cuda
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=$ROOT/wheels
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=${2:?}; shift 2 ;;
    --wheels) WHEELS=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/run.log
: > "$LOG"
rm -f "$OUT/figures.json" "$OUT/summary.md" "$OUT/junit.xml" "$OUT/step-grid.json"
cd "$ROOT"

# The carried wheels, unpacked beside the checkout (pure Python: unzipping installs them;
# pip would need the index the machine cannot reach).
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
for wheel in "$WHEELS"/*.whl; do
  [ -e "$wheel" ] || { echo "no wheels in $WHEELS: see the README's 'A lent GPU'" | tee -a "$LOG"; break; }
  "$PY" -m zipfile -e "$wheel" "$SITE"
done
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

FAILED=0
# step NAME SECONDS COMMAND...: run it under its own timeout, log it, record how it ended.
step() {
  local name=$1 limit=$2 began status rc ms
  shift 2
  echo "=== $name (at most ${limit}s): $*" >> "$LOG"
  began=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - began) / 1000000 ))
  case $rc in
    0) status=passed ;;
    124|137) status="timed out"; FAILED=1 ;;
    *) status="failed ($rc)"; FAILED=1 ;;
  esac
  echo "=== $name: $status" >> "$LOG"
  "${RECORD[@]}" step "$name" "$status" \
    "$((ms / 1000)).$((ms % 1000 / 100))" --out "$OUT" >> "$LOG" 2>&1
}

RUN=("$PY" -m engine.benchmarks.device_run --out "$OUT" --device "$DEVICE")
# Recording a step and the summary import no engine (nor torch): run as a plain script.
RECORD=("$PY" engine/benchmarks/device_run.py)
step env 20 "${RUN[@]}" env
# The gpu tests and the kernel matrix, engine/ only (tests/engine collects without the
# agent stack: tests/test_gpu_run.py runs this step in the image's packages). On a CPU the
# gpu tests skip and the kernel matrix, which the suite runs interpreted, is left out.
MARKS="gpu or kernels"
[ "$DEVICE" = cpu ] && MARKS=gpu
step tests 90 "$PY" -m pytest tests/engine -m "$MARKS" -q -p no:cacheprovider \
  --junitxml "$OUT/junit.xml"
step attention 35 "${RUN[@]}" attention
step model 45 "${RUN[@]}" model
step model-int4 55 "${RUN[@]}" model --quantize int4
step transformers 55 "${RUN[@]}" transformers
step grid 50 "${RUN[@]}" grid
"${RECORD[@]}" summary --out "$OUT" >> "$LOG" 2>&1 || FAILED=1
cat "$OUT/summary.md" 2>/dev/null
exit $FAILED

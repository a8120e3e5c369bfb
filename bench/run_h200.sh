#!/usr/bin/env bash
# The recorded H200 session: GPU tests, graph parity matrix, serving/attention/DETR benchmarks.
# Usage (on the GPU machine, repo root, .peer = unpacked reference wheel):
#   bash bench/run_h200.sh tests|bench|serving|serving-aoti OUTDIR
# serving-aoti: the AOTInductor rows of the dense and spread workloads (4 packages; no reference,
# whose rows are in the full serving run), which do not fit in one 10-minute call with the rest.
set -uo pipefail
phase=$1; out=${2:-bench/results}; mkdir -p "$out"
export PYTHONPATH=$PWD LIBREYOLO_HUB_KERNELS=0
day=$(date +%F)
if [ "$phase" = tests ]; then
  timeout 300 python -m pytest -q -m gpu tests -p no:cacheprovider > "$out/$day-gpu-tests.log" 2>&1
  echo "gpu tests rc=$?"; tail -40 "$out/$day-gpu-tests.log"
  timeout 280 python -m libreyolo.graphs.parity --json "$out/$day-graph-parity-h200.json" --md "$out/graph_parity.md" \
    > "$out/$day-graph-parity-h200.log" 2>&1; echo "parity rc=$?"; tail -45 "$out/graph_parity.md"
fi
if [ "$phase" = bench ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 200 python bench/graph_bench.py --peer --json "$out/$day-graph-bench-h200.json" 2>&1 | tail -30
  timeout 120 python bench/attention_bench.py --device cuda --out "$out/$day-attention-h200.json" 2>&1 | tail -30
  timeout 200 python bench/detr_bench.py --peer-python /tmp/peerpy --json "$out/$day-detr-h200.json" 2>&1 | tail -30
fi
if [ "$phase" = serving ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 480 python bench/serving_bench.py --peer-python /tmp/peerpy --shared .gpushared --n 30 --warmup 5 ${SERVING_ARGS:-} \
    --json "$out/$day-serving-h200.json" > "$out/$day-serving-h200.log" 2>&1
  echo "serving rc=$?"; tail -75 "$out/$day-serving-h200.log"
fi
if [ "$phase" = serving-aoti ]; then
  timeout 560 python bench/serving_bench.py --shared .gpushared --n 30 --warmup 5 --no-families \
    --workloads dense spread spread-0.001 --aoti-weights dense spread \
    --json "$out/$day-serving-aoti-h200.json" > "$out/$day-serving-aoti-h200.log" 2>&1
  echo "serving-aoti rc=$?"; tail -40 "$out/$day-serving-aoti-h200.log"
fi

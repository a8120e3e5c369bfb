#!/usr/bin/env bash
# The recorded H200 session: GPU tests, graph parity matrix, serving/attention/DETR benchmarks.
# Usage (on the GPU machine, repo root, .peer = unpacked reference wheel):
#   bash bench/run_h200.sh tests|bench|serving|serving-aoti|segformer|issue24|compile-tests|compile-bench OUTDIR
# serving-aoti: the AOTInductor rows of the dense and spread workloads (4 packages; no reference,
# whose rows are in the full serving run), which do not fit in one 10-minute call with the rest.
# segformer: the graph parity matrix of every SegFormer size (b0-b5, fp32 and fp16, at the
# harness's default 640/320, b5's own input size), then bench/segformer_bench.py (b0, b2; fp32
# and fp16; batch 1 and 8; the reference in a child process): at most 240 + 290 s.
# issue24: graph parity of every RTMDet and SwinIR size, their GPU tests (parity rows, graphed
# predict, fused-attention rule, training graphs), then bench/rtmdet_swinir_bench.py with the
# reference in a child process: at most 150 + 200 + 240 s.
# compile-tests: the compile=True GPU tests (fp16 reduce-overhead, cuda_graph=True on a compiled model) with
# the inference-copy and graph GPU tests next to them: at most 420 s (Inductor compiles from an empty cache).
# compile-bench: bench/compile_bench.py, YOLOv9-t b1 and b8 fp16: eager, cuda_graph=True, compile=default,
# compile=reduce-overhead (four compilations): at most 560 s.
# cgraph / cprof / cbench: compile=True inside our graphs (GPU tests, compile_bench rows, profile, Batcher);
# cfinal: GPU tests + the recorded serving run on compiled graphs (its first attempt did not come back);
# cserve, cautotune: prepared for the next call (Batcher settings on compiled graphs; max-autotune in the graphs);
# pack: prepared (staging packed by numpy copies: pack bench, GPU tests, stream and serving figures);
# detr26: prepared (rtdetr-r34 / dfine-s b1 fp32, graphs with and without compile, the reference b1 rows);
# decode26: decode="cuda" (nvJPEG): its GPU tests, the stream bench's JPEG rows (Pillow and nvJPEG, compiled graphs),
# then one py-spy sample of the Batcher at 32 clients;
# spy27: py-spy samples (GIL holder; all busy threads) of the Batcher at 32 clients, default and in_flight 1;
# stream26: prepared (stream bench at b32 with the compiled network in the graphs: arrays and JPEG files).
# decode27: prepared: decode="cuda" GPU tests (busy-device decoding on the thread's own stream), the JPEG rows with
# the legacy default stream and a stream of their own current, reading and nvJPEG decoding timed alone; then the
# DETR b1 rows (Stretch.place_batch) and the D-FINE-s compiled copy under the selection-edge rule.
# at40 / serve40 / rest40: three calls in a row (the machine kept warm): at40 starts the autotuned .pt2 export
# (bench/aoti_autotune_bench.py) in a process session of its own (it outlives the call) and runs the decode GPU
# tests beside it, then waits for it; serve40 waits for it to end (killing it past its time), brings its files back,
# then the recorded serving run on compiled graphs with four Batcher settings in one process; rest40: the DETR
# b1 rows and the decode27 stream rows.
# at41 / rest41: as at40, with autotune on CUDA limited to cuDNN for the convolutions other than 1x1 (the package
# without autotune exported and timed after it, --compare-default), and the export's timing held until the work
# beside it is done (--time-after): the AOTInductor/INT8 GPU tests and the fp16 validation survey beside the export;
# rest41 lets it time, collects it, then the Batcher with overlap=True at 32 and 8 clients (max_batch 16, compiled
# graphs) and, in the time left, the DETR b1 rows with the reference (serving_bench; with compile: DETR_ROWS=1).
# fp16survey: (prepared) the validator on fp16 AOTInductor packages of the reference-written fixtures (the seeded
# untrained models leave float16's range, 2026-12-05-h100-NOTES.md): true weights and outputs scaled by 1.001 and
# 1.0001, with every error quantile recorded (whether the error-distribution check can be applied to fp16).
# t26a / t26b / t26c: the recorded run of issue 26's Targets, three calls in a row on one warm machine (then
# `python3 bench/serving_targets.py --dir <the three calls' files>` builds the Targets table): t26a starts the
# autotuned .pt2 export of the sparse YOLOv9-t (its timing held until the work beside it ends) and runs the graph
# parity matrix of the seven families and the GPU tests of graphs, threads, copies, streaming and serving beside
# it; t26b waits for the export's timing, then serving_bench with the reference (YOLOv9-t workloads and the
# families, fp32 and fp16, batch 1, 8 and 32); t26c: compile_bench at batch 1, stream_bench (arrays sparse and
# dense, JPEG files) with the compiled network in the graphs and the reference on the same frames.
# fix43: (prepared) the GPU tests of the fixes made after the t26 run (RTMDet's batched normalisation, the
# classifiers' resize-crop) and vit-s at b1/b8/b32 with the reference (the 58.5 ms b32 fp16 row of t26b).
set -uo pipefail
phase=$1; out=${2:-bench/results}; mkdir -p "$out"
export PYTHONPATH=$PWD LIBREYOLO_HUB_KERNELS=0
day=$(date +%F)
detr_compile_rows() {  # rtdetr-r34 and dfine-s at batch 1, fp32: our graphs with and without the compiled network
  local suffix=$1 limit=$2 m tag
  for m in LibreRTDETRr34.yaml LibreDFINEs.yaml; do
    tag=$(echo "$m" | tr 'A-Z' 'a-z' | sed 's/^libre//; s/\.yaml$//')
    timeout "$limit" python -u bench/compile_bench.py --model $m --fp32 --batches 1 --rows graph,graph+compile:default \
      --n 60 --warmup 10 --stop-compile-workers --json "$out/$day-compile-graphs-$tag-$suffix.json" \
      > "$out/$day-compile-graphs-$tag-$suffix.log" 2>&1
    echo "compile bench $m rc=$?"; tail -4 "$out/$day-compile-graphs-$tag-$suffix.log"
  done
}
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
if [ "$phase" = segformer ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  rm -f "$out/graph_parity_segformer.md"
  timeout 240 python -u -m libreyolo.graphs.parity --family segformer --json "$out/$day-graph-parity-segformer-h200.json" \
    --md "$out/graph_parity_segformer.md" > "$out/$day-graph-parity-segformer-h200.log" 2>&1
  echo "segformer parity rc=$? (124: timed out, no JSON; the log has one line per finished size)"
  grep -E "^segformer-|Error" "$out/$day-graph-parity-segformer-h200.log" | tail -12; tail -25 "$out/graph_parity_segformer.md" 2>/dev/null
  timeout 290 python -u bench/segformer_bench.py --half --budget-s 150 --peer-timeout 110 --peer-python /tmp/peerpy \
    --json "$out/$day-segformer-h200.json" > "$out/$day-segformer-h200.log" 2>&1
  echo "segformer bench rc=$? (the JSON is rewritten after every stage)"; tail -45 "$out/$day-segformer-h200.log"
fi
if [ "$phase" = issue24 ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 150 python -u -m libreyolo.graphs.parity --family rtmdet --json "$out/$day-graph-parity-rtmdet-all-h200.json" \
    --md "$out/$day-graph-parity-rtmdet-all-h200.md" > "$out/$day-graph-parity-rtmdet-all-h200.log" 2>&1
  echo "rtmdet parity rc=$?"; grep -E "^rtmdet-" "$out/$day-graph-parity-rtmdet-all-h200.log"
  timeout 100 python -u -m libreyolo.graphs.parity --family swinir --imgsz 64 32 --json "$out/$day-graph-parity-swinir-all-h200.json" \
    --md "$out/$day-graph-parity-swinir-all-h200.md" > "$out/$day-graph-parity-swinir-all-h200.log" 2>&1
  echo "swinir parity rc=$?"; grep -E "^swinir-|Error" "$out/$day-graph-parity-swinir-all-h200.log" | tail -8
  timeout 200 python -m pytest -q -m gpu tests/test_restore_rtmdet_gpu.py tests/test_fused_attention_rule.py \
    tests/test_train_graph_gpu.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-issue24-graphs.log" 2>&1
  echo "gpu tests rc=$?"; tail -15 "$out/$day-gpu-tests-h200-issue24-graphs.log"
  timeout 240 python -u bench/rtmdet_swinir_bench.py --peer-python /tmp/peerpy --peer-timeout 100 \
    --json "$out/$day-rtmdet-swinir-h200.json" > "$out/$day-rtmdet-swinir-h200.log" 2>&1
  echo "bench rc=$?"; tail -30 "$out/$day-rtmdet-swinir-h200.log"
fi
if [ "$phase" = issue24-train ]; then
  # the bench again (detections matched as sets), then whole train() runs of RTMDet-t at batch 8,
  # ours and the reference's, on the reference bench's tiny dataset (.gpushared/make_tiny_dataset.py)
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 200 python -u bench/rtmdet_swinir_bench.py --peer-python /tmp/peerpy --peer-timeout 100 \
    --json "$out/$day-rtmdet-swinir-h200-run2.json" > "$out/$day-rtmdet-swinir-h200-run2.log" 2>&1
  echo "bench rc=$?"; grep -v Warning "$out/$day-rtmdet-swinir-h200-run2.log" | tail -24
  timeout 380 python -u bench/train_bench.py --sections loop --loop-runs rtmdet:t:8 --peer-python /tmp/peerpy \
    --json "$out/$day-train-loop-rtmdet-h200.json" > "$out/$day-train-loop-rtmdet-h200.log" 2>&1
  echo "train loop rc=$?"; grep -v Warning "$out/$day-train-loop-rtmdet-h200.log" | tail -12
fi
if [ "$phase" = issue27 ]; then
  # the Batcher against one forward per request (a lock around predict()), yolo9-t with CUDA graphs,
  # at 1, 8, 32 and 64 client threads; fp32, then fp16
  timeout 280 python -u bench/serve_bench.py --out "$out/$day-serve-h200.json" > "$out/$day-serve-h200.log" 2>&1
  echo "serve fp32 rc=$?"; tail -14 "$out/$day-serve-h200.log"
  timeout 240 python -u bench/serve_bench.py --half --out "$out/$day-serve-h200-fp16.json" > "$out/$day-serve-h200-fp16.log" 2>&1
  echo "serve fp16 rc=$?"; tail -14 "$out/$day-serve-h200-fp16.log"
fi
if [ "$phase" = issue26 ]; then
  # DETR whole-pipeline graph parity (top-k postprocessing captured), the GPU tests of the graphs, DETR and the
  # streaming pipeline, then where the b32 throughput path and DETR b1 spend their time
  timeout 150 python -u -m libreyolo.graphs.parity --family rtdetr dfine --json "$out/$day-graph-parity-detr-pipeline-h200.json" \
    --md "$out/$day-graph-parity-detr-pipeline-h200.md" > "$out/$day-graph-parity-detr-pipeline-h200.log" 2>&1
  echo "detr parity rc=$?"; grep -E "^(rtdetr|dfine)-|Error" "$out/$day-graph-parity-detr-pipeline-h200.log" | tail -10
  timeout 200 python -m pytest -q -m gpu tests/test_graphs_gpu.py tests/test_detr_gpu.py tests/test_stream_pipeline.py \
    -p no:cacheprovider > "$out/$day-gpu-tests-h200-issue26.log" 2>&1
  echo "gpu tests rc=$?"; tail -8 "$out/$day-gpu-tests-h200-issue26.log"
  timeout 200 python -u bench/throughput_profile.py --json "$out/$day-throughput-profile-h200.json" \
    > "$out/$day-throughput-profile-h200.log" 2>&1
  echo "profile rc=$?"; grep -v "^ *$" "$out/$day-throughput-profile-h200.log" | head -120
fi
if [ "$phase" = throughput ]; then
  # the b32 forward with and without cuDNN's autotuner; the Batcher (in_flight 2) against one forward per request,
  # fp16; the streaming pipeline on host arrays and JPEG files, graphed
  timeout 90 python -u bench/throughput_profile.py --sections forward --json "$out/$day-forward-cudnn-h200.json" \
    > "$out/$day-forward-cudnn-h200.log" 2>&1; echo "forward rc=$?"; tail -3 "$out/$day-forward-cudnn-h200.log"
  timeout 240 python -u bench/serve_bench.py --half --out "$out/$day-serve-h200-fp16-inflight.json" \
    > "$out/$day-serve-h200-fp16-inflight.log" 2>&1; echo "serve fp16 rc=$?"; tail -14 "$out/$day-serve-h200-fp16-inflight.log"
  timeout 200 python -u bench/stream_bench.py --graphs true --workers 4 8 --json "$out/$day-stream-h200-run2.json" \
    > "$out/$day-stream-h200-run2.log" 2>&1; echo "stream rc=$?"; tail -12 "$out/$day-stream-h200-run2.log"
fi
if [ "$phase" = serving26 ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 540 python bench/serving_bench.py --peer-python /tmp/peerpy --shared .gpushared --n 30 --warmup 5 --no-aoti \
    --workloads sparse dense --json "$out/$day-serving-h200.json" > "$out/$day-serving-h200.log" 2>&1
  echo "serving rc=$?"; tail -40 "$out/$day-serving-h200.log"
fi
if [ "$phase" = throughput2 ]; then
  # as "throughput", after the Batcher fixes; the serve bench on the reference-written yolo9-t (boxes above conf,
  # so its exactness column means something)
  timeout 90 python -u bench/throughput_profile.py --sections forward --json "$out/$day-forward-cudnn-h200.json" \
    > "$out/$day-forward-cudnn-h200.log" 2>&1; echo "forward rc=$?"; tail -3 "$out/$day-forward-cudnn-h200.log"
  timeout 240 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --out "$out/$day-serve-h200-fp16-run2.json" > "$out/$day-serve-h200-fp16-run2.log" 2>&1
  echo "serve fp16 rc=$?"; tail -12 "$out/$day-serve-h200-fp16-run2.log"
  timeout 200 python -u bench/stream_bench.py --graphs true --workers 4 8 --json "$out/$day-stream-h200-run3.json" \
    > "$out/$day-stream-h200-run3.log" 2>&1; echo "stream rc=$?"; tail -12 "$out/$day-stream-h200-run3.log"
fi
if [ "$phase" = throughput3 ]; then
  # after the plain path's pinned staging: GPU tests of the stream pipeline and graphs, the forward probe, the
  # Batcher on the reference-written yolo9-t (fp16), the streaming bench on arrays and JPEG files
  timeout 150 python -m pytest -q -m gpu tests/test_stream_pipeline.py tests/test_graphs_gpu.py tests/test_serve.py \
    -p no:cacheprovider > "$out/$day-gpu-tests-h200-staging.log" 2>&1; echo "gpu tests rc=$?"; tail -4 "$out/$day-gpu-tests-h200-staging.log"
  timeout 90 python -u bench/throughput_profile.py --sections forward --json "$out/$day-forward-cudnn-h200.json" \
    > "$out/$day-forward-cudnn-h200.log" 2>&1; echo "forward rc=$?"; tail -3 "$out/$day-forward-cudnn-h200.log"
  timeout 150 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 1,8,32 --requests 48 --out "$out/$day-serve-h200-fp16-run3.json" > "$out/$day-serve-h200-fp16-run3.log" 2>&1
  echo "serve fp16 rc=$?"; tail -12 "$out/$day-serve-h200-fp16-run3.log"
  timeout 100 python -u bench/stream_bench.py --graphs true --workers 4 --n 512 --json "$out/$day-stream-h200-run4.json" \
    > "$out/$day-stream-h200-run4.log" 2>&1; echo "stream rc=$?"; tail -9 "$out/$day-stream-h200-run4.log"
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 170 python bench/serving_bench.py --peer-python /tmp/peerpy --shared .gpushared --n 30 --warmup 5 --no-aoti \
    --workloads sparse --batches 1 --json "$out/$day-serving-b1-h200.json" > "$out/$day-serving-b1-h200.log" 2>&1
  echo "serving rc=$?"; tail -16 "$out/$day-serving-b1-h200.log"
fi
if [ "$phase" = compile-tests ]; then
  timeout 420 python -m pytest -q -m gpu tests/test_compile.py tests/test_inference_copies.py tests/test_graphs_gpu.py \
    -p no:cacheprovider > "$out/$day-compile-gpu-tests.log" 2>&1
  echo "compile gpu tests rc=$?"; tail -30 "$out/$day-compile-gpu-tests.log"
fi
if [ "$phase" = compile-bench ]; then
  timeout 560 python -u bench/compile_bench.py --json "$out/$day-compile-h200.json" > "$out/$day-compile-h200.log" 2>&1
  echo "compile bench rc=$?"; tail -20 "$out/$day-compile-h200.log"
fi
if [ "$phase" = final26 ]; then
  # the Batcher with per-batch-size exactness; compile=True at b1 (eager, graph, reduce-overhead); compile GPU tests
  timeout 150 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 1,8,32 --requests 32 --out "$out/$day-serve-h200-fp16-run4.json" > "$out/$day-serve-h200-fp16-run4.log" 2>&1
  echo "serve fp16 rc=$?"; grep -v "^ " "$out/$day-serve-h200-fp16-run4.log" | tail -9
  timeout 230 python -u bench/compile_bench.py --batches 1 --rows eager,graph,compile:reduce-overhead --n 100 --warmup 10 \
    --json "$out/$day-compile-h200.json" > "$out/$day-compile-h200.log" 2>&1
  echo "compile bench rc=$?"; tail -8 "$out/$day-compile-h200.log"
  timeout 190 python -m pytest -q -m gpu tests/test_compile.py -p no:cacheprovider > "$out/$day-compile-gpu-tests.log" 2>&1
  echo "compile gpu tests rc=$?"; tail -6 "$out/$day-compile-gpu-tests.log"
fi
if [ "$phase" = serve27 ]; then
  # the Batcher at 32 clients under its settings (batcher rows only), then the recorded run (both modes,
  # 1/8/32/64 clients) with the defaults; SERVE27_CFGS overrides the list of settings
  timeout 100 python -m pytest -q -m gpu tests/test_serve.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-serve27.log" 2>&1
  echo "gpu tests rc=$?"; tail -3 "$out/$day-gpu-tests-h200-serve27.log"
  m=.gpushared/compat/checkpoints/yolo9-t-seed0.pt
  IFS=';' read -ra cfgs <<< "${SERVE27_CFGS:-;--in-flight 1;--in-flight 3;--batch-sizes 1,2,4,8,12,16,20,24,28,32;--max-batch 16;--max-wait-ms 0.5;--max-wait-ms 5}"
  for cfg in "${cfgs[@]}"; do
    tag=$(echo "x $cfg" | tr -c 'a-z0-9' '-' | sed 's/-\+/-/g; s/-$//')
    timeout 60 python -u bench/serve_bench.py --half --model $m --clients 32 --requests 64 --modes batcher $cfg \
      --out "$out/$day-serve27-h200$tag.json" > "$out/$day-serve27-h200$tag.log" 2>&1
    echo "serve27 [$cfg] rc=$?"; grep -E "^batcher" "$out/$day-serve27-h200$tag.log" | tail -1
  done
  timeout 150 python -u bench/serve_bench.py --half --model $m --clients 1,8,32,64 --requests 32 --size-table \
    ${SERVE27_FINAL:-} --out "$out/$day-serve-h200-final27.json" > "$out/$day-serve-h200-final27.log" 2>&1
  echo "final rc=$?"; grep -E "^(lock|batcher|32 clients)" "$out/$day-serve-h200-final27.log"
fi
if [ "$phase" = probe27 ]; then
  # batch (in)dependence of one image's result by batch size; then the autotuned aoti package at b1
  m=.gpushared/compat/checkpoints/yolo9-t-seed0.pt
  timeout 120 python -u bench/batch_independence.py --model $m --json "$out/$day-batch-independence-h200.json" \
    > "$out/$day-batch-independence-h200.log" 2>&1; echo "independence rc=$?"; awk 'NR==1 || $5=="False"' "$out/$day-batch-independence-h200.log" | head -40
  timeout 430 python -u bench/aoti_autotune_bench.py --model $m --json "$out/$day-aoti-autotune-h200.json" \
    > "$out/$day-aoti-autotune-h200.log" 2>&1; echo "aoti autotune rc=$?"; grep -v Warning "$out/$day-aoti-autotune-h200.log" | tail -12
fi
if [ "$phase" = frames27 ]; then
  # the letterbox inside the whole-pipeline graph: GPU tests, then the size table and 32 clients with it and
  # without it, then the recorded run (both modes, 1/8/32/64 clients)
  timeout 110 python -m pytest -q -m gpu tests/test_stream_pipeline.py tests/test_serve.py -p no:cacheprovider \
    > "$out/$day-gpu-tests-h200-frames27.log" 2>&1; echo "gpu tests rc=$?"; tail -4 "$out/$day-gpu-tests-h200-frames27.log"
  m=.gpushared/compat/checkpoints/yolo9-t-seed0.pt
  for cfg in "" "--letterbox-outside"; do
    tag=$(echo "x $cfg" | tr -c 'a-z0-9' '-' | sed 's/-\+/-/g; s/-$//')
    timeout 75 python -u bench/serve_bench.py --half --model $m --clients 32 --requests 64 --modes batcher --size-table \
      --batch-sizes 1,2,4,8,16,32 $cfg --out "$out/$day-frames27-h200$tag.json" > "$out/$day-frames27-h200$tag.log" 2>&1
    echo "frames27 [$cfg] rc=$?"; grep -E "^ +(1|8|16|32) |^batcher" "$out/$day-frames27-h200$tag.log"
  done
  timeout 150 python -u bench/serve_bench.py --half --model $m --clients 1,8,32,64 --requests 32 \
    --out "$out/$day-serve-h200-final27.json" > "$out/$day-serve-h200-final27.log" 2>&1
  echo "final rc=$?"; grep -E "^(lock|batcher|32 clients)" "$out/$day-serve-h200-final27.log"
fi
if [ "$phase" = gpu27 ]; then
  # GPU tests of the paths the letterbox-inside-the-graph change touches, then the other families' GPU tests
  timeout 170 python -m pytest -q -m gpu tests/test_graphs_gpu.py tests/test_stream_pipeline.py tests/test_serve.py \
    tests/test_export_aoti.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-gpu27-a.log" 2>&1
  echo "gpu tests a rc=$?"; tail -8 "$out/$day-gpu-tests-h200-gpu27-a.log"
  timeout 115 python -m pytest -q -m gpu tests/test_restore_rtmdet_gpu.py tests/test_yolox.py tests/test_detr_gpu.py \
    tests/test_inference_copies.py tests/test_nms.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-gpu27-b.log" 2>&1
  echo "gpu tests b rc=$?"; tail -8 "$out/$day-gpu-tests-h200-gpu27-b.log"
fi
if [ "$phase" = serve32 ]; then
  # 32 clients: in_flight 3, and padded sizes in steps of 4 above 8 (less padding) against the defaults
  for cfg in "--in-flight 3" "--batch-sizes 1,2,4,8,12,16,20,24,28,32" "--in-flight 3 --batch-sizes 1,2,4,8,12,16,20,24,28,32"; do
    tag=$(echo "$cfg" | tr -c 'a-z0-9' '-' | sed 's/-\+/-/g; s/-$//')
    timeout 100 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
      --clients 32 --requests 32 $cfg --out "$out/$day-serve32-h200$tag.json" > "$out/$day-serve32-h200$tag.log" 2>&1
    echo "serve32 $cfg rc=$?"; grep -v "^ " "$out/$day-serve32-h200$tag.log" | tail -4
  done
fi
if [ "$phase" = cgraph ]; then
  # compile on + cuda_graph=True (our graphs hold the compiled network): the compile GPU tests, compile_bench
  # at b1/b8/b32 (graph against graph+compile), then the Batcher at 32 clients on compiled graphs
  timeout 240 python -m pytest -q -m gpu tests/test_compile.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-cgraph.log" 2>&1
  echo "compile gpu tests rc=$?"; tail -8 "$out/$day-gpu-tests-h200-cgraph.log"
  timeout ${CGRAPH_BENCH_S:-200} python -u bench/compile_bench.py --batches ${CGRAPH_BATCHES:-1,8,32} \
    --rows ${CGRAPH_ROWS:-graph,graph+compile:default} --n 60 --warmup 10 \
    --json "$out/$day-compile-graphs-h200.json" > "$out/$day-compile-graphs-h200.log" 2>&1
  echo "compile bench rc=$?"; tail -9 "$out/$day-compile-graphs-h200.log"
  timeout ${CGRAPH_SERVE_S:-140} python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 32 --requests 64 --modes batcher --size-table --batch-sizes 1,2,4,8,16,32 --compile true \
    --out "$out/$day-serve27-h200-compiled-graphs.json" > "$out/$day-serve27-h200-compiled-graphs.log" 2>&1
  echo "serve compiled rc=$?"; grep -E "^ +(1|8|16|32) |^batcher|Error|error" "$out/$day-serve27-h200-compiled-graphs.log" | tail -12
fi
if [ "$phase" = cprof ]; then
  # the compile GPU tests, then where host time goes with compiled graphs: rows graph / graph+compile / graph again
  # (a fresh model after a compilation in the process), cProfile and GC time per row
  timeout 200 python -m pytest -q -m gpu tests/test_compile.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-cgraph.log" 2>&1
  echo "compile gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-h200-cgraph.log" | tail -5
  timeout 250 python -u bench/compile_bench.py --batches 1,8 --rows graph,graph+compile:default,graph --n 40 --warmup 10 \
    --profile --json "$out/$day-compile-graphs-profile-h200.json" > "$out/$day-compile-graphs-profile-h200.log" 2>&1
  echo "compile bench rc=$?"; tail -8 "$out/$day-compile-graphs-profile-h200.log"
  python - "$out/$day-compile-graphs-profile-h200.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["row"], r["batch"], r["median_ms"], r["gc"], r["threads"])
    print("\n".join(r.get("profile", "").splitlines()[:10]))
PY
fi
if [ "$phase" = cbench ]; then
  # compiled graphs with Inductor's compile workers ended after compiling: compile_bench b1/b8/b32 (graph,
  # graph+compile, graph again) with the machine's busy cores per row, then the Batcher at 32 clients
  timeout 230 python -u bench/compile_bench.py --batches 1,8,32 --rows graph,graph+compile:default,graph --n 40 \
    --warmup 10 --stop-compile-workers --json "$out/$day-compile-graphs-h200.json" > "$out/$day-compile-graphs-h200.log" 2>&1
  echo "compile bench rc=$?"; tail -11 "$out/$day-compile-graphs-h200.log"
  timeout 300 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 32 --requests 64 --modes batcher --size-table --batch-sizes 1,2,4,8,16,32 --compile true \
    --stop-compile-workers --out "$out/$day-serve27-h200-compiled-graphs.json" > "$out/$day-serve27-h200-compiled-graphs.log" 2>&1
  echo "serve compiled rc=$?"; grep -E "^ +(1|2|4|8|16|32) |^batcher|Error|error" "$out/$day-serve27-h200-compiled-graphs.log" | tail -12
fi
if [ "$phase" = cfinal ]; then
  # the compile and Batcher GPU tests after the Batcher's warm-up change, then the recorded serving run on compiled
  # graphs (lock and Batcher, 1/8/32/64 clients, size table), Inductor's compile workers ended after each warm-up
  timeout 150 python -m pytest -q -m gpu tests/test_compile.py tests/test_serve.py -p no:cacheprovider \
    > "$out/$day-gpu-tests-h200-cfinal.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-h200-cfinal.log" | tail -5
  timeout 400 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 1,8,32,64 --requests 64 --size-table --compile true --stop-compile-workers \
    --out "$out/$day-serve-h200-compiled-graphs.json" > "$out/$day-serve-h200-compiled-graphs.log" 2>&1
  echo "serve rc=$?"; grep -E "^ +(1|2|4|8|16|32) |^(lock|batcher|32 clients)|Error" "$out/$day-serve-h200-compiled-graphs.log"
fi
if [ "$phase" = cserve ]; then
  # (prepared, not yet run) the Batcher on compiled graphs at 32 clients under in_flight 1/2/3 and max_batch 16,
  # then the recorded run of both modes on compiled graphs; compile workers ended after every warm-up
  m=.gpushared/compat/checkpoints/yolo9-t-seed0.pt
  # (2026-12-05: bench/batcher_sim.py --host gil, the host part holding the GIL, put in_flight 1 with
  # max_wait_ms 5 at p99 18 ms against 23-27 ms for the default in_flight 2: the first setting to try)
  for cfg in "--in-flight 1 --max-wait-ms 5" "--in-flight 1" "--in-flight 2" "--in-flight 2 --max-wait-ms 5"; do
    tag=$(echo "x $cfg" | tr -c 'a-z0-9' '-' | sed 's/-\+/-/g; s/-$//')
    timeout 100 python -u bench/serve_bench.py --half --model $m --clients 32 --requests 64 --modes batcher \
      --batch-sizes 1,2,4,8,16,32 --compile true --stop-compile-workers $cfg \
      --out "$out/$day-cserve-h200$tag.json" > "$out/$day-cserve-h200$tag.log" 2>&1
    echo "cserve [$cfg] rc=$?"; grep -E "^batcher" "$out/$day-cserve-h200$tag.log" | tail -1
  done
fi
if [ "$phase" = cautotune ]; then
  # (prepared, not yet run) compile="max-autotune" inside our graphs (max-autotune-no-cudagraphs) at batch 1:
  # Inductor benchmarks kernel choices for minutes (334 s for the bare network in limit-h200-2026-11-29.json)
  timeout 560 python -u bench/compile_bench.py --batches 1 --rows graph,graph+compile:max-autotune --n 60 \
    --warmup 10 --stop-compile-workers --json "$out/$day-compile-graphs-autotune-h200.json" \
    > "$out/$day-compile-graphs-autotune-h200.log" 2>&1
  echo "autotune rc=$?"; tail -5 "$out/$day-compile-graphs-autotune-h200.log"
fi
if [ "$phase" = pack ]; then
  # (prepared) staging packed by numpy copies instead of torch's parallel copy_: the pack bench on this host (pinned
  # buffers, idle and busy), the GPU tests of the paths that stage, then the throughput and serving figures it moves
  timeout 120 python -u bench/staging_bench.py --workers 4,8 --json "$out/$day-staging-h200.json" \
    > "$out/$day-staging-h200.log" 2>&1; echo "staging bench rc=$?"; cat "$out/$day-staging-h200.log"
  timeout 150 python -m pytest -q -m gpu tests/test_stream_pipeline.py tests/test_serve.py tests/test_graphs_gpu.py \
    -p no:cacheprovider > "$out/$day-gpu-tests-h200-pack.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-h200-pack.log" | tail -5
  timeout 130 python -u bench/stream_bench.py --graphs true --workers 4 8 --n 512 --json "$out/$day-stream-h200-pack.json" \
    > "$out/$day-stream-h200-pack.log" 2>&1; echo "stream bench rc=$?"; tail -12 "$out/$day-stream-h200-pack.log"
  timeout 120 python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 32 --requests 128 --modes batcher --size-table --batch-sizes 1,2,4,8,16,32 \
    --out "$out/$day-serve27-h200-pack.json" > "$out/$day-serve27-h200-pack.log" 2>&1
  echo "serve rc=$?"; grep -E "^ +(1|8|16|32) |^batcher|Error" "$out/$day-serve27-h200-pack.log"
fi
if [ "$phase" = detr26 ]; then
  # (prepared) issue 26 item 4: rtdetr-r34 and dfine-s at batch 1, fp32: our graphs with and without the compiled
  # network (compile_bench --model), then serving_bench's b1 rows with the reference in the same call
  detr_compile_rows h200 170
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 170 python bench/serving_bench.py --peer-python /tmp/peerpy --shared .gpushared --n 30 --warmup 5 --no-aoti \
    --workloads sparse --batches 1 --json "$out/$day-serving-b1-h200.json" > "$out/$day-serving-b1-h200.log" 2>&1
  echo "serving rc=$?"; tail -16 "$out/$day-serving-b1-h200.log"
fi
if [ "$phase" = stream26 ]; then
  # (prepared) issue 26 targets at b32 fp16: arrays >= 3,000 images/s, JPEG files with stream=True >= 2,000: the
  # stream bench with the compiled network in the graphs (plain path and the pipeline with 4 and 8 decode threads)
  timeout 400 python -u bench/stream_bench.py --graphs true --workers 4 8 --n 1024 --compile true \
    --json "$out/$day-stream-h200-compiled.json" > "$out/$day-stream-h200-compiled.log" 2>&1
  echo "stream compiled rc=$?"; tail -12 "$out/$day-stream-h200-compiled.log"
fi
if [ "$phase" = spy27 ]; then
  # where the host time goes while the Batcher serves 32 clients (fp16 graphs, not compiled): py-spy samples of the
  # thread holding the GIL, then of every busy thread, then the GIL holder with in_flight 1 (collapsed stacks)
  m=.gpushared/compat/checkpoints/yolo9-t-seed0.pt
  for run in "gil||--gil" "all||" "gil-inflight1|--in-flight 1|--gil"; do
    IFS='|' read -r tag cfg spy <<< "$run"
    json=/tmp/spy-$tag.json; [ "$tag" = gil ] && json="$out/$day-spy27-$tag.json"
    timeout 150 .peer/py-spy record $spy --threads --nonblocking -r 250 --format raw -o "$out/$day-spy27-$tag.txt" -- \
      python -u bench/serve_bench.py --half --model $m --clients 32 --requests 300 --modes batcher \
      --batch-sizes 1,2,4,8,16,32 $cfg --out "$json" > "$out/$day-spy27-$tag.log" 2>&1
    echo "spy27 [$tag] rc=$?"; grep -E "^batcher|Samples|rror" "$out/$day-spy27-$tag.log" | tail -3
  done
fi
if [ "$phase" = decode26 ]; then
  timeout 110 python -m pytest -q -m gpu tests/test_device_decode.py tests/test_stream_pipeline.py -p no:cacheprovider -s \
    > "$out/$day-gpu-tests-h200-decode26.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error|nvJPEG vs" "$out/$day-gpu-tests-h200-decode26.log" | tail -6
  timeout 170 python -u bench/stream_bench.py --graphs true --workers 4 8 --n 1024 --compile true --sources jpeg-cuda jpeg \
    --json "$out/$day-stream-h200-decode.json" > "$out/$day-stream-h200-decode.log" 2>&1
  echo "stream decode rc=$?"; grep -E "agreement|\|" "$out/$day-stream-h200-decode.log" | tail -9
  timeout 90 python -u bench/stream_bench.py --graphs true --workers 4 --n 1024 --compile true --sources arrays \
    --model .gpushared/bench/dense-yolo9t.pt --json "$out/$day-stream-h200-dense.json" > "$out/$day-stream-h200-dense.log" 2>&1
  echo "stream dense rc=$?"; grep -E "\|" "$out/$day-stream-h200-dense.log" | tail -3
  m=.gpushared/compat/checkpoints/yolo9-t-seed0.pt
  timeout 70 .peer/py-spy record --gil --threads --nonblocking -r 250 --format raw -o "$out/$day-spy27-gil.txt" -- \
    python -u bench/serve_bench.py --half --model $m --clients 32 --requests 300 --modes batcher \
    --batch-sizes 1,2,4,8,16,32 --out "$out/$day-spy27-gil.json" > "$out/$day-spy27-gil.log" 2>&1
  echo "spy27 rc=$?"; grep -E "^batcher|Samples|rror" "$out/$day-spy27-gil.log" | tail -3
fi
if [ "$phase" = decode27 ]; then
  timeout 100 python -m pytest -q -m gpu tests/test_device_decode.py tests/test_stream_pipeline.py -p no:cacheprovider -s \
    > "$out/$day-gpu-tests-h200-decode27.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error|nvJPEG vs" "$out/$day-gpu-tests-h200-decode27.log" | tail -6
  timeout 200 python -u bench/stream_bench.py --graphs true --workers 4 --n 1024 --compile true --sources jpeg-cuda \
    --compute-stream default side --json "$out/$day-stream-h200-decode27.json" > "$out/$day-stream-h200-decode27.log" 2>&1
  echo "stream decode rc=$?"; grep -E "agreement|alone|\|" "$out/$day-stream-h200-decode27.log" | tail -8
  detr_compile_rows 27 150
fi
at_dir=/tmp/at40
at_collect() {  # the autotune export's files into $out (whatever it has written so far)
  for f in "$at_dir"/*.json "$at_dir"/*.log; do [ -e "$f" ] && cp "$f" "$out/"; done
}
at_wait() {  # wait until the autotune export ends or $1 seconds pass; then kill it if $2 = kill
  local end=$((SECONDS + $1))
  local pid; pid=$(cat "$at_dir/pid" 2>/dev/null)
  [ -n "$pid" ] || return 0  # not started on this machine
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 2; done
  if kill -0 "$pid" 2>/dev/null && [ "${2:-}" = kill ]; then
    kill -- -"$pid"; sleep 2; echo "autotune export killed after its time" >> "$at_dir/$day-aoti-autotune-h200.log"
  fi
  echo "autotune: $(grep -E '^(export|eager model|aoti_|rc=|wrote|waited|without)|killed|Error' "$at_dir/$day-aoti-autotune-h200.log" | tail -8)"
}
if [ "$phase" = at40 ]; then
  mkdir -p "$at_dir"; echo "uid $(id -u)"
  setsid nohup bash -c "timeout 1100 python -u bench/aoti_autotune_bench.py --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --n 200 --warmup 20 --json $at_dir/$day-aoti-autotune-h200.json > $at_dir/$day-aoti-autotune-h200.log 2>&1; \
    echo rc=\$? >> $at_dir/$day-aoti-autotune-h200.log" > /dev/null 2>&1 < /dev/null &
  echo $! > "$at_dir/pid"
  timeout 150 python -m pytest -q -m gpu tests/test_device_decode.py tests/test_stream_pipeline.py -p no:cacheprovider -s \
    > "$out/$day-gpu-tests-h200-decode40.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error|nvJPEG vs" "$out/$day-gpu-tests-h200-decode40.log" | tail -6
  at_wait $(( ${AT_WAIT:-560} - SECONDS ))
  at_collect
fi
if [ "$phase" = serve40 ]; then
  at_wait ${AT_WAIT:-120} kill
  at_collect
  if [ -n "${DECODE_TESTS:-}" ]; then  # the decode GPU tests first (when at40 did not run them)
    timeout 100 python -m pytest -q -m gpu tests/test_device_decode.py tests/test_stream_pipeline.py -p no:cacheprovider \
      -s > "$out/$day-gpu-tests-h200-decode40.log" 2>&1
    echo "gpu tests rc=$?"; grep -E "passed|failed|Error|nvJPEG vs" "$out/$day-gpu-tests-h200-decode40.log" | tail -6
  fi
  timeout ${SERVE_LIMIT:-440} python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients 1,8,32,64 --requests 64 --size-table --compile true --stop-compile-workers --configs 2:2,1:5,1:2,2:5 \
    --out "$out/$day-serve-h200-compiled-graphs-40.json" > "$out/$day-serve-h200-compiled-graphs-40.log" 2>&1
  echo "serve rc=$?"; grep -E "^ +(1|2|4|8|16|32) |^(lock|b[0-9]|32 clients)|Error" "$out/$day-serve-h200-compiled-graphs-40.log"
fi
if [ "$phase" = rest40 ]; then
  detr_compile_rows 40 150
  timeout 200 python -u bench/stream_bench.py --graphs true --workers 4 --n 1024 --compile true --sources jpeg-cuda \
    --compute-stream default side --json "$out/$day-stream-h200-decode40.json" > "$out/$day-stream-h200-decode40.log" 2>&1
  echo "stream decode rc=$?"; grep -E "agreement|alone|\|" "$out/$day-stream-h200-decode40.log" | tail -8
fi
if [ "$phase" = at41 ]; then
  mkdir -p "$at_dir"; rm -f "$at_dir/go"
  setsid nohup bash -c "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED=3 timeout 1500 python -u bench/aoti_autotune_bench.py \
    --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt --n 200 --warmup 20 --compare-default --time-after $at_dir/go \
    --json $at_dir/$day-aoti-autotune-h200.json > $at_dir/$day-aoti-autotune-h200.log 2>&1; \
    echo rc=\$? >> $at_dir/$day-aoti-autotune-h200.log" > /dev/null 2>&1 < /dev/null &
  echo $! > "$at_dir/pid"
  timeout 240 python -m pytest -q -m gpu tests/test_export_aoti.py tests/test_quantize_gpu.py -p no:cacheprovider \
    > "$out/$day-gpu-tests-h200-aoti41.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-h200-aoti41.log" | tail -6
  timeout $(( ${SURVEY_END:-520} - SECONDS )) python -u tools/validation_survey.py --formats aoti --device cuda --half \
    --families yolo9,yolox,rtdetr --seeds 1 --first-seed 1 --gains normal --mutations scale \
    --json "$out/$day-validation-survey-aoti-fp16-h200.json" > "$out/$day-validation-survey-aoti-fp16-h200.log" 2>&1
  echo "survey rc=$?"; grep -v Warning "$out/$day-validation-survey-aoti-fp16-h200.log" | tail -14
  touch "$at_dir/go"
  at_wait $(( ${AT_WAIT:-570} - SECONDS ))
  at_collect
fi
if [ "$phase" = rest41 ]; then
  touch "$at_dir/go"
  at_wait ${AT_WAIT:-200} kill
  at_collect
  timeout 90 python -m pytest -q -m gpu tests/test_serve.py -p no:cacheprovider > "$out/$day-gpu-tests-h200-serve41.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-h200-serve41.log" | tail -4
  # the Batcher with overlap=True (one worker, the next batch started while one runs) against in_flight 1 without
  timeout ${SERVE_LIMIT:-280} python -u bench/serve_bench.py --half --model .gpushared/compat/checkpoints/yolo9-t-seed0.pt \
    --clients ${SERVE_CLIENTS:-32,8} --requests 64 --compile true --stop-compile-workers --max-batch 16 \
    --configs ${SERVE_CONFIGS:-1:5,1:5:o,1:2:o,2:2:o} \
    --out "$out/$day-serve-h200-overlap-41.json" > "$out/$day-serve-h200-overlap-41.log" 2>&1
  echo "serve rc=$?"; grep -E "^(lock|b[0-9])|32 clients|Error" "$out/$day-serve-h200-overlap-41.log"
  left=$(( 585 - SECONDS ))
  if [ $left -gt 100 ]; then
    printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
    timeout $left python bench/serving_bench.py --peer-python /tmp/peerpy --shared .gpushared --n 30 --warmup 5 --no-aoti \
      --workloads sparse --batches 1 --json "$out/$day-serving-b1-h200-run41.json" > "$out/$day-serving-b1-h200-run41.log" 2>&1
    echo "serving rc=$?"; tail -16 "$out/$day-serving-b1-h200-run41.log"
  else
    echo "serving b1 rows not run: $left s left"
  fi
  if [ -n "${DETR_ROWS:-}" ]; then detr_compile_rows 41 ${DETR_LIMIT:-110}; fi  # opt-in: device time for serving
fi
if [ "$phase" = fp16survey ]; then
  timeout ${SURVEY_LIMIT:-560} python -u tools/validation_survey.py --formats aoti --device cuda --half --mutations scale \
    --checkpoints .gpushared/compat/checkpoints/yolo9-t-seed0.pt,.gpushared/compat/checkpoints/yolox-n-seed0.pt \
    --imgsz 320 --json "$out/$day-validation-survey-aoti-fp16-fixtures.json" \
    > "$out/$day-validation-survey-aoti-fp16-fixtures.log" 2>&1
  echo "survey rc=$?"; grep -v Warning "$out/$day-validation-survey-aoti-fp16-fixtures.log" | tail -20
fi
t26_dir=/tmp/at26
if [ "$phase" = t26a ]; then
  mkdir -p "$t26_dir"; rm -f "$t26_dir/go"
  python -c "import sys; sys.path.insert(0, 'bench'); from stream_bench import sparse_model; \
sparse_model('cpu', 640).save('$t26_dir/yolo9t-sparse.pt')"
  setsid nohup bash -c "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED=3 timeout 1200 python -u bench/aoti_autotune_bench.py \
    --model $t26_dir/yolo9t-sparse.pt --n 200 --warmup 20 --time-after $t26_dir/go \
    --json $t26_dir/$day-aoti-autotune-t26.json > $t26_dir/$day-aoti-autotune-t26.log 2>&1; \
    echo rc=\$? >> $t26_dir/$day-aoti-autotune-t26.log" > /dev/null 2>&1 < /dev/null &
  echo $! > "$t26_dir/pid"
  timeout ${PARITY_LIMIT:-240} python -u -m libreyolo.graphs.parity --family yolo9 yolox rtdetr dfine vit deit swin \
    --json "$out/$day-graph-parity-t26.json" --md "$out/$day-graph-parity-t26.md" > "$out/$day-graph-parity-t26.log" 2>&1
  echo "parity rc=$?"; grep -E "^[a-z0-9]+-|Error|fail" "$out/$day-graph-parity-t26.log" | tail -30
  LIBREYOLO_SHARED_DIR=$PWD/.gpushared timeout ${TESTS_LIMIT:-240} python -m pytest -q -m gpu tests/test_graphs_gpu.py \
    tests/test_inference_copies.py tests/test_restore_rtmdet_gpu.py tests/test_classify_gpu.py \
    tests/test_stream_pipeline.py tests/test_serve.py tests/test_detr_gpu.py -p no:cacheprovider \
    > "$out/$day-gpu-tests-t26.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-t26.log" | tail -6
  touch "$t26_dir/go"
  pid=$(cat "$t26_dir/pid"); end=$(( ${AT_WAIT:-570} ))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 2; done
  cp "$t26_dir"/*.json "$t26_dir"/*.log "$out/" 2>/dev/null
  echo "autotune: $(kill -0 "$pid" 2>/dev/null && echo still running) $(tail -5 "$t26_dir/$day-aoti-autotune-t26.log")"
fi
if [ "$phase" = t26b ]; then
  touch "$t26_dir/go"
  pid=$(cat "$t26_dir/pid" 2>/dev/null); end=$(( ${AT_WAIT:-150} ))
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 2; done
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -- -"$pid"; echo "autotune killed after its time"; fi
  cp "$t26_dir"/*.json "$t26_dir"/*.log "$out/" 2>/dev/null
  echo "autotune: $(tail -5 "$t26_dir/$day-aoti-autotune-t26.log" 2>/dev/null)"
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout $(( ${SERVING_END:-585} - SECONDS )) python -u bench/serving_bench.py --peer-python /tmp/peerpy \
    --shared .gpushared --n ${SERVING_N:-20} --warmup 5 --no-aoti --workloads sparse dense --batches 1 8 32 \
    --family-batches 1 8 32 --family-precisions fp32 fp16 \
    --json "$out/$day-serving-t26.json" > "$out/$day-serving-t26.log" 2>&1
  echo "serving rc=$?"; grep -v "^ours\|^peer" "$out/$day-serving-t26.log" | tail -80
fi
if [ "$phase" = t26c ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 150 python -u bench/compile_bench.py --batches 1 --rows graph,compile:reduce-overhead,graph+compile:default \
    --n 100 --warmup 10 --stop-compile-workers --json "$out/$day-compile-t26.json" > "$out/$day-compile-t26.log" 2>&1
  echo "compile rc=$?"; tail -8 "$out/$day-compile-t26.log"
  for spec in "arrays|--sources arrays --workers 4 8" "dense|--sources arrays --workers 4 8 --model .gpushared/bench/dense-yolo9t.pt" \
      "jpeg|--sources jpeg-cuda jpeg --workers 8"; do
    tag=${spec%%|*}; left=$(( ${STREAM_END:-585} - SECONDS ))
    [ $left -gt 40 ] || { echo "stream $tag not run: $left s left"; continue; }
    timeout $left python -u bench/stream_bench.py --graphs true --n 1024 --compile true ${spec#*|} \
      --peer-python /tmp/peerpy --peer-frames 256 --json "$out/$day-stream-t26-$tag.json" \
      > "$out/$day-stream-t26-$tag.log" 2>&1
    echo "stream $tag rc=$?"; grep -v "^row\|^peer" "$out/$day-stream-t26-$tag.log" | tail -12
  done
fi
if [ "$phase" = fix43 ]; then
  LIBREYOLO_SHARED_DIR=$PWD/.gpushared timeout 300 python -m pytest -q -m gpu tests/test_restore_rtmdet_gpu.py \
    tests/test_classify_gpu.py tests/test_stream_pipeline.py -p no:cacheprovider > "$out/$day-gpu-tests-fix43.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$out/$day-gpu-tests-fix43.log" | tail -6
  printf '#!/bin/sh\nPYTHONPATH=%s/.peer exec python3 "$@"\n' "$PWD" > /tmp/peerpy; chmod +x /tmp/peerpy
  timeout 250 python -u bench/serving_bench.py --peer-python /tmp/peerpy --shared .gpushared --n 20 --warmup 5 \
    --no-aoti --workloads sparse --batches 1 --precisions fp16 --families vit-s --family-batches 1 8 32 \
    --family-precisions fp32 fp16 --json "$out/$day-serving-vit-fix43.json" > "$out/$day-serving-vit-fix43.log" 2>&1
  echo "serving rc=$?"; grep "vit-s" "$out/$day-serving-vit-fix43.log" | grep -v "^ours\|^peer"
fi

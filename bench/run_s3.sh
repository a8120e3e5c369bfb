#!/usr/bin/env bash
# Device calls of the 2026-12-07 evening session (issues 45, 47, 48), one per argument:
#   bash bench/run_s3.sh gpu|bench|video|gpu2|gpu4 OUTDIR
# Carry .whl (av, trackers, supervision wheels) and .peerlite (the unpacked reference 1.6.0
# package without its tokenizer files) and, for `bench`, .base (libreyolo/ of 9cc6a8c, the tree
# before the call plan). Every step has its own time limit and writes its log
# into OUTDIR as it goes, so a step that overruns costs only itself.
set -u
what=$1; out=$2; mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
py=python3
step() { local t=$1 name=$2; shift 2; echo "=== $name (limit ${t}s) $(date +%T)"; local s=$SECONDS
  timeout "$t" "$@" >"$out/$name.log" 2>&1; local rc=$?; echo "=== $name rc=$rc $((SECONDS-s))s"; tail -n 25 "$out/$name.log"; }
nvidia-smi -L; $py -c "import torch,sys;print(sys.version.split()[0],torch.__version__,torch.cuda.get_device_name())"
case $what in
gpu)
  step 300 gpu-tests $py -m pytest -q -rfE -m gpu -p no:cacheprovider --durations=15 tests
  step 180 parity-detr $py -m libreyolo.graphs.parity --family rfdetr deimv2 lwdetr --json "$out/parity-detr.json" --md "$out/parity-detr.md"
  step 60 bisect-lwdetr $py bench/graph_bisect.py --family lwdetr --size t --imgsz 640
  ;;
bench)
  step 250 detr-line $py bench/detr_line_bench.py --peer-path .peerlite --n 20 --warmup 5 --json "$out/detr-line.json" --md "$out/detr-line.md"
  step 160 host-a $py bench/host_overhead.py --device cuda --families yolo9 yolox rtdetr dfine segformer rtmdet --baseline-src .base --rounds 1 --n 100 --peer-python "$(which python3)" --peer-path .peerlite --json "$out/host-a.json"
  step 160 host-b $py bench/host_overhead.py --device cuda --families yolo9_e2e rtdetrv2 deim rtdetrv4 vit deit swin swinir --n 100 --peer-python "$(which python3)" --peer-path .peerlite --json "$out/host-b.json"
  ;;
gpu2)
  # the GPU tests in three processes at once (names printed as they run), then the DETR parity rows
  # after the LW-DETR level-shapes fix, the host profile and one video row with the threaded writer
  T="$py -m pytest -v -rfE -m gpu -p no:cacheprovider --durations=10"
  ( timeout 170 $T tests/test_kernels_gpu.py tests/test_fused_attention_rule.py tests/test_nms.py tests/test_quant.py \
      tests/test_quantize_gpu.py tests/test_device_decode.py tests/test_train_metrics.py >"$out/gt1.log" 2>&1 ) &
  ( timeout 170 $T tests/test_classify_gpu.py tests/test_detr_gpu.py tests/test_detr_graph_prep.py tests/test_graphs_gpu.py \
      tests/test_inference_copies.py tests/test_stream_pipeline.py tests/test_serve.py tests/test_yolox.py \
      tests/test_compat_swin.py >"$out/gt2.log" 2>&1 ) &
  ( timeout 170 $T tests/test_compile.py tests/test_export_aoti.py tests/test_train_graph_gpu.py \
      tests/test_restore_rtmdet_gpu.py >"$out/gt3.log" 2>&1 ) &
  wait
  for f in gt1 gt2 gt3; do echo "== $f"; grep -E "FAILED|ERROR|passed|failed" "$out/$f.log" | tail -12; tail -n 3 "$out/$f.log"; done
  step 90 parity-detr2 $py -m libreyolo.graphs.parity --family rfdetr lwdetr deimv2 --md "$out/parity-detr2.md"
  step 50 host-profile $py bench/host_profile.py --families yolo9 vit --half --n 200
  step 80 video-yolo9s $py bench/video_bench.py --model LibreYOLO9s.yaml --half --cuda-graph --frames 200 --device cuda --conf 0.05 --reference .peerlite --json "$out/video-yolo9s.json"
  ;;
gpu4)
  # the last minutes of device time: two GPU test groups, rfdetr/lwdetr parity, the yolo9 host profile
  T="$py -m pytest -v -rfE -m gpu -p no:cacheprovider --durations=5"
  ( timeout 80 $T tests/test_kernels_gpu.py tests/test_fused_attention_rule.py tests/test_nms.py tests/test_quant.py \
      tests/test_device_decode.py >"$out/gt1.log" 2>&1 ) &
  ( timeout 80 $T tests/test_classify_gpu.py tests/test_detr_gpu.py tests/test_detr_graph_prep.py tests/test_graphs_gpu.py \
      tests/test_inference_copies.py tests/test_stream_pipeline.py tests/test_serve.py >"$out/gt2.log" 2>&1 ) &
  ( timeout 80 $T tests/test_compile.py -k "compiled_model_replay and fp32" >"$out/gt3.log" 2>&1 ) &
  wait
  for f in gt1 gt2 gt3; do echo "== $f"; grep -E "FAILED|ERROR|passed|failed" "$out/$f.log" | tail -12; tail -n 2 "$out/$f.log"; done
  step 40 parity-detr2 $py -m libreyolo.graphs.parity --family rfdetr lwdetr --md "$out/parity-detr2.md"
  step 35 host-profile $py bench/host_profile.py --families yolo9 --half --n 100
  ;;
video)
  step 200 video-yolo9s $py bench/video_bench.py --model LibreYOLO9s.yaml --half --cuda-graph --frames 600 --device cuda --conf 0.05 --reference .peerlite --json "$out/video-yolo9s.json"
  step 200 video-rtdetr $py bench/video_bench.py --model LibreRTDETRr18.yaml --half --cuda-graph --frames 600 --device cuda --conf 0.05 --reference .peerlite --json "$out/video-rtdetr.json"
  ;;
esac

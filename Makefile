# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install, export the bundled demo detector (YOLOv9-t trained on synthetic shapes)
#                 to ONNX with its validation report, then detect the shapes of the bundled held-out image
#   make test   - create .venv, install with test extras, run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the CPU build of torch is enough for the demo and tests; set TORCH= to keep an existing install
TORCH ?= torch==2.13.0
# extras the test suite exercises (export formats that run on a CPU machine)
EXTRAS ?= dev,onnx-simplify,executorch,coreml,openvino,train,serve,ncnn,tflite,video,track
COMPAT ?= $(abspath ../shared/compat)
# the suite runs on both cores (pytest-xdist); a test file stays on one worker, so its module fixtures
# (exports shared by its tests) are built once. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2

.PHONY: venv demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	@if [ -n "$(TORCH)" ]; then $(BIN)/pip install -q "$(TORCH)"; fi
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"

demo: venv
	mkdir -p out
	$(BIN)/libreyolo export model=LibreYOLO9t-shapes.pt format=onnx output=out/LibreYOLO9t-shapes.onnx
	$(BIN)/libreyolo predict model=out/LibreYOLO9t-shapes.onnx source=libreyolo/assets/shapes.jpg save_dir=out

test: venv
	LIBREYOLO_COMPAT_DIR=$${LIBREYOLO_COMPAT_DIR:-$(COMPAT)} $(BIN)/python -m pytest -q -m "not gpu" -n $(PYTEST_WORKERS) --dist loadfile --durations=30 tests

lint: venv
	$(BIN)/ruff check libreyolo tests examples bench

clean:
	rm -rf $(VENV) out runs

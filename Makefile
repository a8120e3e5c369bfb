# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install, run predict with the default model on the bundled sample image
#                 (becomes the ONNX export with its validation report once export lands)
#   make test   - create .venv, install with test extras, run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the CPU build of torch is enough for the demo and tests; set TORCH= to keep an existing install
TORCH ?= torch==2.13.0
COMPAT ?= $(abspath ../shared/compat)

.PHONY: venv demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	@if [ -n "$(TORCH)" ]; then $(BIN)/pip install -q "$(TORCH)"; fi
	$(BIN)/pip install -q -e ".[dev]"

demo: venv
	$(BIN)/libreyolo predict model=LibreYOLO9t.yaml save_dir=out

test: venv
	LIBREYOLO_COMPAT_DIR=$${LIBREYOLO_COMPAT_DIR:-$(COMPAT)} $(BIN)/python -m pytest -q -m "not gpu" tests

lint: venv
	$(BIN)/ruff check libreyolo tests examples bench

clean:
	rm -rf $(VENV) out runs

# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BACKENDS ?= tensorflow jax torch
PYTEST_ARGS ?=
# Two pytest-xdist workers per backend (the machine has 2 cores; most test time is single-threaded
# tracing and compilation). Tests are grouped per file (see tests/conftest.py); XDIST= runs serially.
XDIST ?= -n 2 --dist loadfile
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: install demo lint test test-fast test-tensorflow test-jax test-torch notebooks bench gpu-check gpu-check-peers gpu-wheels clean

install: $(STAMP)

# setuptools says "Editable installation ... folders with the same name as your package" for every
# editable install whose packages are mapped from other folders (the preset zoo, the bundle runtime):
# information only, silenced so that a clean install prints nothing.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: install
	$(PY) examples/demo.py

# The linter and the format check over the whole repository (configured in pyproject.toml, [tool.ruff]).
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Lint first, then each backend in its own pytest process; any failure fails the target (after all have run).
test: install
	@status=0; $(MAKE) --no-print-directory lint || status=1; for b in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$b ==="; \
	  KERAS_BACKEND=$$b $(PY) -m pytest -q -p no:cacheprovider --durations=10 $(XDIST) $(PYTEST_ARGS) tests || status=1; \
	done; exit $$status

# Local iteration: skip the tests marked slow.
test-fast:
	$(MAKE) test PYTEST_ARGS="-m 'not slow' $(PYTEST_ARGS)"

test-tensorflow test-jax test-torch: install
	KERAS_BACKEND=$(@:test-%=%) $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS) tests

# Rebuild each examples/NN_*.ipynb from its script and run it (KERAS_BACKEND=jax), keeping its outputs;
# copies the README's pictures to docs/images/. `make notebooks NOTEBOOKS=09_lora_quantize` runs one.
NOTEBOOKS ?=
notebooks: install
	$(PY) examples/make_notebooks.py $(NOTEBOOKS)

# Benchmarks against keras-hub, one process per backend; results go to benchmarks/RESULTS.md by hand.
bench: install
	@for b in $(BACKENDS); do KERAS_BACKEND=$$b $(PY) benchmarks/train.py || exit 1; done
	$(PY) benchmarks/export_speed.py

# On a machine with an NVIDIA GPU, one prepared command for the GPU tables (benchmarks/RESULTS.md, "GPU"):
# decoding at the SmolLM2-135M shape (ours, keras-hub and, on PyTorch, transformers eager and compiled;
# float32 and bfloat16; the memory-bandwidth floor per row), GPT and T5 beam search against keras-hub on
# JAX, and GPT-2 124M training (mixed_bfloat16, MFU) against keras-hub and transformers + torch.compile.
# Every benchmark runs even when one fails; the target fails at the end if any did. `make gpu-check-peers`
# runs the older per-family comparisons against keras-hub (attention, generate, T5, BERT, Llama).
# A GPU machine that cannot reach a package registry can use its own Python instead of the venv
# (keras, keras-hub and the backends importable there; the repository on PYTHONPATH):
#   make gpu-check PY=python3 GPU_INSTALL= BACKENDS="jax torch"
# Each benchmark's output also goes to $(GPU_OUT)/gpu-check-BACKEND.txt as it prints, so that a run cut short keeps
# what it measured. On the lent device (its README): `make gpu-wheels` here, then carry .whl and run
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && make gpu-check PY=python3 GPU_INSTALL= \
#     BACKENDS="jax torch" GPU_OUT=$OUT
GPU_INSTALL ?= install
GPU_OUT ?= gpu_results
GPU_BENCHMARKS_jax = "decode_gpu.py" "train.py --shape gpt2 --dtype mixed_bfloat16 --steps 10 --rounds 2" \
	"decode_gpu.py --peers ours --xla-command-buffers" "moe_speed.py --shape gpu --repeats 2" \
	"generate.py --repeats 2" "generate_seq2seq.py --repeats 2" \
	"speculative_speed.py --shape smollm2_135m --dtype bfloat16 --repeats 3"
GPU_BENCHMARKS_torch = "decode_gpu.py" "train.py --shape gpt2 --dtype mixed_bfloat16 --steps 10 --rounds 2" \
	"moe_speed.py --shape gpu --repeats 2" "speculative_speed.py --shape smollm2_135m --dtype bfloat16 --repeats 3"
GPU_BENCHMARKS_tensorflow = "decode_gpu.py --peers ours,keras-hub"
GPU_PEER_BENCHMARKS = "attention.py" "attention.py --dtype bfloat16" "generate.py --repeats 2" \
	"generate_seq2seq.py --repeats 2" "bert_forward.py --repeats 3" "generate_llama.py --repeats 1"
gpu-check: $(GPU_INSTALL)
	@mkdir -p $(GPU_OUT); nvidia-smi | tee $(GPU_OUT)/nvidia-smi.txt
	@status=0; for b in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$b ==="; \
	  case $$b in jax) benches='$(GPU_BENCHMARKS_jax)';; torch) benches='$(GPU_BENCHMARKS_torch)';; \
	    *) benches='$(GPU_BENCHMARKS_tensorflow)';; esac; \
	  eval "set -- $$benches"; for bench in "$$@"; do \
	    echo "--- $$bench" | tee -a $(GPU_OUT)/gpu-check-$$b.txt; \
	    { PYTHONUNBUFFERED=1 KERAS_BACKEND=$$b $(PY) benchmarks/$$bench 2>&1; echo $$? > /tmp/gpu-check-status; } \
	      | tee -a $(GPU_OUT)/gpu-check-$$b.txt; \
	    [ "$$(cat /tmp/gpu-check-status)" = 0 ] || { echo "FAILED: KERAS_BACKEND=$$b $$bench" | tee -a $(GPU_OUT)/gpu-check-$$b.txt; status=1; }; \
	  done; \
	done; exit $$status

# The packages a GPU machine lacks (it has PyTorch, JAX and transformers, no package index), as Python 3.12 wheels
# in .whl/ (git-ignored) to carry there: keras, keras-hub and their own needs, at the tested versions.
GPU_WHEELS = keras keras-hub namex optree kagglehub kagglesdk
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	for name in $(GPU_WHEELS); do \
	  version=$$(grep -i "^$$name==" constraints.txt | cut -d= -f3); \
	  $(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux2014_x86_64 --platform any -d .whl "$$name==$$version" || exit 1; \
	done
	ls .whl

gpu-check-peers: $(GPU_INSTALL)
	nvidia-smi
	@status=0; for b in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$b ==="; \
	  for bench in $(GPU_PEER_BENCHMARKS); do \
	    echo "--- $$bench"; \
	    KERAS_BACKEND=$$b $(PY) benchmarks/$$bench || { echo "FAILED: KERAS_BACKEND=$$b $$bench"; status=1; }; \
	  done; \
	done; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info

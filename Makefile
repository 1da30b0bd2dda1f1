# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and (re)installs only when pyproject.toml changed.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo demo-distributed test test-cuda lint bench bench-gpu clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24,<27"

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[demo]"
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py

$(VENV)/.installed-distributed: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[distributed]"
	touch $@

# The demo's CNN trained data-parallel on 2 ranks (MPI; mpiexec comes with the distributed extra's MPICH).
demo-distributed: $(VENV)/.installed-distributed
	$(VENV)/bin/mpiexec -n 2 $(PY) examples/data_parallel.py

test: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2

$(VENV)/.installed-cuda: pyproject.toml $(VENV)/.installed-test
	$(PY) -m pip install --quiet -e ".[cuda]"
	touch $@

# The GPU tests (tests/cuda: every op on the device "cuda" against the CPU, training, DLPack) where CuPy sees a GPU;
# elsewhere they skip, saying why. On a machine that has CuPy and nothing to install: tests/cuda/run_on_gpu.sh.
test-cuda: $(VENV)/.installed-cuda
	$(PY) -m pytest -q -n 4 tests/cuda

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[bench]"
	touch $@

# The suite (bench/run.py: every case in a fresh process per framework, vs PyTorch, JAX and NumPy) writes
# bench/results/latest.{json,md,png}; program_vs_eager.py adds the executor's memory-plan diagnostics.
bench: $(VENV)/.installed-bench
	$(PY) bench/program_vs_eager.py
	$(PY) bench/run.py

# The GPU bench (bench/gpu.py, issue 26): opforge on "cuda" against PyTorch CUDA and raw CuPy, writing
# bench/results/gpu.{md,json}. It installs nothing (the lent GPU machine has no package registry): GPU_PYTHON is an
# interpreter that has CuPy and a CUDA build of PyTorch; opforge comes from this checkout. GPU_BENCH_ARGS=--quick.
GPU_PYTHON ?= python3
bench-gpu:
	PYTHONPATH=. $(GPU_PYTHON) bench/gpu.py --out bench/results $(GPU_BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

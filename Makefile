# One virtual environment per checkout; every target builds it on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test unit e2e lint demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[controller,test,plot]'
	touch $(STAMP)

venv: $(STAMP)

## make test: lint (import layers) + every test, e2e last
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests

e2e: $(STAMP)
	$(BIN)/pytest e2e

lint: $(STAMP)
	$(BIN)/lint-imports

demo: $(STAMP)
	$(BIN)/drain-router demo

bench: $(STAMP)
	bash bench/install.sh $(BIN) && $(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

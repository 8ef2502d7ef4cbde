# make setup: services + venv; make demo: the main job end to end; make test: the tests.
SHELL := /bin/bash
PYTHON ?= python3.11
REGISTRY ?= 127.0.0.1:5000/imgbuild
# A local directory of wheels that stands in for the PyTorch CPU index (these machines have
# one in /opt/wheels). Empty: torch comes from https://download.pytorch.org/whl/cpu.
WHEELS ?= $(shell test -d /opt/wheels && echo /opt/wheels)
PYTEST_ARGS ?=

export UV_PYTHON_DOWNLOADS := never
export IMGBUILD_WHEELS := $(WHEELS)
export HF_HUB_OFFLINE := 1
# Python's own default for every process make starts: it writes and reads the bytecode caches
# (__pycache__). Where the shell sets PYTHONDONTWRITEBYTECODE (some CI images do), every
# process compiles every module it imports, every time: `import torch, transformers` took
# 12.5 CPU-seconds instead of 5.3 here, in each smoke payload and checkpoint tool the tests
# run on the host, and each pytest worker rewrote every test file's asserts again (15
# CPU-seconds a worker). Empty is unset (Python reads only a non-empty value). Nothing that
# goes into an image or a content key reads __pycache__ (the payload is a list of files).
export PYTHONDONTWRITEBYTECODE :=

ifeq ($(WHEELS),)
TORCH_SOURCE := --extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match
else
TORCH_SOURCE := --find-links $(WHEELS)
endif

IMGBUILD := .venv/bin/imgbuild

.PHONY: setup services venv demo test test-slow dev-lock lint clean golden mutation docs payload-sentences
setup: services venv

services:
	bash scripts/services.sh

venv: .venv/.installed
.venv/.installed: requirements/dev.lock.txt pyproject.toml
	command -v uv >/dev/null || python3 -m pip install -q uv
	uv venv -q --allow-existing --python $(PYTHON) .venv
	uv pip install -q --python .venv/bin/python --require-hashes -r requirements/dev.lock.txt $(TORCH_SOURCE)
	uv pip install -q --python .venv/bin/python --no-deps -e .
	touch $@

# The dev lock: the test and smoke-model tooling, hash-pinned, torch from the CPU build. The
# docs lock: imgbuild and the documentation tools alone, at the dev lock's versions (the
# workflow's `pages` job installs it).
dev-lock:
	uv pip compile pyproject.toml --group dev --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-emit-find-links --no-header $(TORCH_SOURCE) \
	  -o requirements/dev.lock.txt
	uv pip compile pyproject.toml --group docs --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-header -c requirements/dev.lock.txt \
	  -o requirements/docs.lock.txt

# The documentation site (docs/, mkdocs.yml) in build/site, with the compatibility page
# (imgbuild report) in it, as the workflow's `pages` job publishes them.
docs: venv
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir build/site
	$(IMGBUILD) report --html build/site/compatibility

demo: setup
	$(IMGBUILD) base bootstrap --registry $(REGISTRY)
	$(IMGBUILD) tiny-cpu --push --registry $(REGISTRY)
	$(IMGBUILD) pull tiny-cpu --registry $(REGISTRY)
	$(IMGBUILD) smoke $(REGISTRY):tiny-cpu

# Three workers, on two cores too: the docker tests run in groups (tests/docker_guard.py), each
# group's tests one after another on one worker, the groups and the other tests beside them.
# Measured on 2 cores from a fresh clone (.ci/run; bench/results/test-suite.json): 2 workers
# with one engine group 27 min 40 s; 3 workers with two engine groups 17 min 28 s to 28 min 04 s
# over eight runs as the machine's speed varied, then 15 min 19 s to 17 min 39 s (four runs) after the
# suite's CPU was cut (the cores busy the whole run: CPU-seconds are the budget), 13 min 27 s from
# nothing on a faster machine, 16 min 25 s from nothing on a new one once the arm64 QEMU
# build went to the slow group. WORKERS=0: one process.
WORKERS ?= 3
XDIST := $(if $(filter 0,$(WORKERS)),-p no:xdist,-n $(WORKERS) --dist loadgroup)

# OMP_NUM_THREADS=1: torch in the test processes (the smoke payload and the checkpoint tools
# run on the host) takes one core each instead of spinning threads against the other workers:
# 15% less CPU for the payload tests here, measured one by one.
test: setup
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -m "not slow" $(XDIST) --durations=25 $(PYTEST_ARGS)

# Ruff, at the version the tree is clean under (pyproject.toml [tool.ruff] holds the rules); uvx
# fetches it once, so the dev lock does not carry a linter the tests never import.
lint:
	uvx ruff@0.17.6 check imgbuild tests bench docs scripts

test-slow: setup
	.venv/bin/python -m pytest -q -m slow $(PYTEST_ARGS)

# Mutation testing of every module of imgbuild/, one at a time (minutes each, hours in all; not
# part of `make test`): bench/results/mutation.json, its table per module and who is below 90%.
# MODULES="imgbuild/plan/key.py ..." picks some; MUTATION_ARGS="--budget-min 60" stops between
# modules after an hour (the rest keep their earlier record), "--explain-only" re-judges it.
mutation: venv
	.venv/bin/python bench/mutation.py $(MUTATION_ARGS) $(MODULES)

clean:
	rm -rf .venv .pytest_cache

# Record the reviewed copies in tests/golden/, after a change meant to give new tags, text or
# claims: every shipped target's content tag, the reference pages, the compatibility report,
# the CI matrix documents, what each refusal says, and each folder of pages in
# golden.PAGE_FOLDERS (docs/contributing.md says what each holds). The tests fail on any other
# change of them.
golden: venv
	.venv/bin/python -m tests.golden --write

# The catalog's sentences the image's entrypoint prints (imgbuild/payload/doctor-sentences.json),
# after a change to those failures' text in images/checks/failures.yaml; then `make golden`.
payload-sentences: venv
	.venv/bin/python -m imgbuild.catalog.failures --write-sentences

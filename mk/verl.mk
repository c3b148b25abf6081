# veRL plug-in (setpo_client.integrations.verl): its own environment, since veRL pins transformers < 5.11,
# which the service's sentence-transformers does not accept. The service package is installed without
# dependencies only for its LocalServer launcher; the tests run the service itself from the root .venv.
VENV_VERL := .venv-verl
VERL_STAMP := $(VENV_VERL)/.installed
TEST_TARGETS += test-verl
LOCK_TARGETS += lock-verl
.PHONY: test-verl lock-verl

$(VERL_STAMP): requirements/verl.lock clients/python/pyproject.toml services/trainer/pyproject.toml
	$(call venv,$(VENV_VERL),-c requirements/verl.lock -e core -e 'clients/python[verl]' -e services/trainer \
		pytest pytest-timeout pytest-xdist,-e services/embedding_server)

test-verl: $(VERL_STAMP) $(STAMP) $(SMOLLM2)
	$(SUITE_ENV) $(VENV_VERL)/bin/python -m pytest $(XDIST_ARGS) -p no:cacheprovider tests/integrations/verl $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

# Re-pin requirements/verl.lock from the current .venv-verl (everything but torch and our editables).
lock-verl: $(VERL_STAMP)
	{ sed -n '1p' requirements/verl.lock; $(VENV_VERL)/bin/python -m pip freeze --exclude-editable | grep -v '^torch=='; } > requirements/verl.lock.new
	mv requirements/verl.lock.new requirements/verl.lock
	touch $(VERL_STAMP)

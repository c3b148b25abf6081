# veRL plug-in (setpo_client.integrations.verl): its own environment, since veRL pins transformers < 5.11,
# which the service's sentence-transformers does not accept. The service package is installed without
# dependencies only for its LocalServer launcher; the tests run the service itself from the root .venv.
VENV_VERL := .venv-verl
VERL_STAMP := $(VENV_VERL)/.installed
TEST_TARGETS += test-verl
.PHONY: test-verl

$(VERL_STAMP): requirements/verl.lock clients/python/pyproject.toml services/trainer/pyproject.toml
	$(call venv,$(VENV_VERL),-c requirements/verl.lock -e core -e 'clients/python[verl]' -e services/trainer \
		pytest pytest-timeout,-e services/embedding_server)

test-verl: $(VERL_STAMP) $(STAMP)
	$(VENV_VERL)/bin/python -m pytest -p no:cacheprovider tests/integrations/verl

# TRL plug-in (setpo_client.integrations.trl): its own environment, since TRL pins its own versions.
# The service is installed here too (no conflict with TRL's pins), so tests start it from this venv.
VENV_TRL := .venv-trl
TRL_STAMP := $(VENV_TRL)/.installed
TEST_TARGETS += test-trl
LOCK_TARGETS += lock-trl
.PHONY: test-trl lock-trl

$(TRL_STAMP): requirements/trl.lock clients/python/pyproject.toml services/trainer/pyproject.toml services/embedding_server/pyproject.toml
	$(call venv,$(VENV_TRL),-c requirements/trl.lock -e core -e services/embedding_server -e 'clients/python[trl]' \
		-e 'services/trainer[data]' pytest pytest-timeout pytest-xdist gguf accelerate,$(DATA_PACKAGES))

# Under XDIST, test by test across the workers (--dist load), not file by file: nearly all of the suite's time is in
# one file, and a third of it is one test waiting for a service that never comes up (the start check's 120 s).
test-trl: $(TRL_STAMP)
	$(SUITE_ENV) $(VENV_TRL)/bin/python -m pytest $(patsubst loadfile,load,$(XDIST_ARGS)) tests/integrations/trl $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

# Re-pin requirements/trl.lock from the current .venv-trl (everything but torch and our editables).
lock-trl: $(TRL_STAMP)
	{ sed -n '1p' requirements/trl.lock; $(VENV_TRL)/bin/python -m pip freeze --exclude-editable | grep -v '^torch=='; } > requirements/trl.lock.new
	mv requirements/trl.lock.new requirements/trl.lock
	touch $(TRL_STAMP)

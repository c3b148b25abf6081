# Benchmarks: scripts that print ratios against a baseline run side by side (docs/benchmarks.md).
# infinity-emb, the peer, needs its own environment (it pins older transformers and sentence-transformers).
VENV_INFINITY := .venv-infinity
INFINITY_STAMP := $(VENV_INFINITY)/.installed
# In a variable: a comma written inside $(call venv,...) would split the argument.
INFINITY_PKG := 'infinity-emb[torch,server]==0.0.78'
LOCK_TARGETS += lock-infinity
.PHONY: bench lock-infinity

$(INFINITY_STAMP): requirements/infinity.lock
	$(call venv,$(VENV_INFINITY),-c requirements/infinity.lock $(INFINITY_PKG))

# Re-pin requirements/infinity.lock from the current .venv-infinity (everything but torch).
lock-infinity: $(INFINITY_STAMP)
	{ sed -n '1p' requirements/infinity.lock; $(VENV_INFINITY)/bin/python -m pip freeze --exclude-editable | grep -v '^torch=='; } > requirements/infinity.lock.new
	mv requirements/infinity.lock.new requirements/infinity.lock
	touch $(INFINITY_STAMP)

# peer_infinity: setpo, infinity-emb and in-process encode, in float32 and bfloat16, interleaved rounds: hours where
# bfloat16 is emulated (how long: docs/benchmarks.md, "bfloat16 on a CPU").
bench: $(STAMP) $(INFINITY_STAMP)
	$(PY) -m benchmarks.loo_closed_form --plot docs/figures/loo_speedup.png
	$(PY) -m benchmarks.http_vs_inprocess
	$(PY) -m benchmarks.peer_infinity
	$(PY) -m benchmarks.peer_infinity --compile --dtypes float32
	$(PY) -m benchmarks.collapsed_group
	$(PY) -m benchmarks.concurrency

# Before/after for a service change: this checkout's server against BASELINE's, interleaved, paired ratios.
BASELINE ?= HEAD
.PHONY: bench-ab
bench-ab: $(STAMP)
	$(PY) -m benchmarks.server_ab --baseline $(BASELINE)

# The full forms of the reliability suites (their quick forms run in make test): > 1000 schemathesis cases,
# 64 callers for 120 s (memory watched from minute 1 on), the hostile clients, and the fault suite.
.PHONY: soak
soak: $(STAMP)
	SETPO_FUZZ_EXAMPLES=500 SETPO_FUZZ_MIN_CASES=1000 $(PY) -m pytest -s tests/reliability/test_fuzz.py $(PYTEST_ARGS) $(PYTEST_NONE_OK)
	$(PY) -m tests.reliability.load --duration 120 --callers 64 --out out/soak/load.json --plot docs/figures/soak_rss.png
	$(PY) -m tests.reliability.hostile --full --out out/soak/hostile.json
	$(PY) -m pytest tests/reliability/test_faults.py $(PYTEST_ARGS) $(PYTEST_NONE_OK)

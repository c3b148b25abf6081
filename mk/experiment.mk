# GRPO vs SetPO+GRPO on a small language model pretrained from scratch on Countdown (experiments/countdown_lm,
# docs/experiments.md): pretraining, the lambda sweep on validation, both arms for every seed, setpo-eval on the
# test split, tables and plots (copied to docs/figures). <= 60 min on 2 cores. Runs in .venv-trl alone (TRL, the
# service, setpo-eval); one torch thread per process: on a shared 2-core machine a second one mostly spins.
EXPERIMENT_OUT ?= out/countdown_lm
TEST_TARGETS += test-experiment
.PHONY: experiment test-experiment

experiment: $(TRL_STAMP)
	rm -rf $(EXPERIMENT_OUT)
	OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m experiments.countdown_lm --out $(EXPERIMENT_OUT) --figures docs/figures

# The quick form (a few steps, one seed, ~2 min) and the task's own checks.
test-experiment: $(TRL_STAMP)
	OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m pytest tests/experiments

# Experiment v2 (experiments/countdown_lm, docs/experiments.md): which form of SetPO keeps distinct correct solutions
# alive on a small language model pretrained from scratch on Countdown. Pretraining, every arm and weight on the
# validation split (2 seeds), the weight controller, then the finalists on the test split (5 seeds), tables and plots
# (copied to docs/figures). Hours on 2 cores: two runs at a time, each a process with one torch thread; resumable
# run by run (rerun the python line below without the rm to continue). Runs in .venv-trl alone.
EXPERIMENT_OUT ?= out/countdown_lm
TEST_TARGETS += test-experiment
.PHONY: experiment test-experiment

experiment: $(TRL_STAMP)
	rm -rf $(EXPERIMENT_OUT)
	OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m experiments.countdown_lm --out $(EXPERIMENT_OUT) --jobs 2 --figures docs/figures

# The quick form (a few steps of every arm, one seed, ~1 min) and the task's own checks.
test-experiment: $(TRL_STAMP)
	OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m pytest tests/experiments

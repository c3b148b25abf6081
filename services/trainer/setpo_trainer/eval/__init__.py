"""setpo-eval: generate n samples per problem, then score accuracy (pass@k, Avg@n) and diversity."""

"""GPU figures (issue 28): `python -m benchmarks.gpu` runs them all in one call; see __main__.py."""

import torch


def sync() -> None:
    """Wait for the GPU's queued work, so that a clock read after it times the work (nothing without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()

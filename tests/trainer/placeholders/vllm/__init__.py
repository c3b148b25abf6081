"""Test-only placeholder for vLLM (see _placeholder.py)."""

from types import SimpleNamespace

from _placeholder import module_getattr

__getattr__ = module_getattr(__name__)


class SamplingParams(SimpleNamespace):
    """A record of the sampling settings OpenRLHF's SamplesGenerator builds for its rollout engines; the CPU
    rollout engine of the tests reads them. It samples nothing itself."""

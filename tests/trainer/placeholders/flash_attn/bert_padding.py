"""Test-only placeholder for flash-attn (see _placeholder.py)."""

from _placeholder import module_getattr

__getattr__ = module_getattr(__name__)

"""Test-only placeholders for vLLM and flash-attn, which are GPU-only and not installed on a CPU machine.

OpenRLHF imports names from both at module level, so importing its trainer needs the modules to exist. Every
name a placeholder module is asked for is a function that fails loudly when called: nothing on CPU may
silently run "vLLM" or "flash-attn". The one exception is vllm.SamplingParams (see vllm/__init__.py).
These directories are put on sys.path / PYTHONPATH by tests/trainer/conftest.py only.
"""


def module_getattr(module: str):
    def __getattr__(name: str):
        if name.startswith("__"):  # import machinery probes dunders (__path__, __file__...): not ours to fake
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{module}.{name} is a CPU test placeholder: {module.split('.')[0]} is GPU-only")

        return unavailable

    return __getattr__

"""Test-only stand-in for vLLM, which cannot be installed on the CPU machine the tests run on. Only the tests of
setpo-eval's vLLM path put it on the path (tests/eval/conftest.py, or PYTHONPATH of a subprocess); it is never
installed.

setpo-eval's real code builds `LLM(...)` and `SamplingParams(...)` and calls `generate`; this keeps what it was
given (`engines`), reads the model's config and tokenizer as vLLM does at start (so a model that does not load fails
here as it would there; the tokenizer is the real one), and answers every prompt `n` times with ANSWER. It samples
nothing: what the tests check is what reaches vLLM, not what vLLM would write.
"""

from types import SimpleNamespace

from transformers import AutoConfig, AutoTokenizer

ANSWER = "6 * 7 = 42, so the answer is \\boxed{42}."
engines: list["LLM"] = []  # every LLM built in this process, oldest first


class SamplingParams(SimpleNamespace):
    """vLLM's sampling settings, kept as given."""


class LLM:
    def __init__(self, model: str, **engine):
        AutoConfig.from_pretrained(model)  # vLLM reads the config first: a folder that is no model fails here
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.engine = {"model": model, **engine}
        self.requests: list[tuple[list[str], SamplingParams]] = []
        engines.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: list[str], params: SamplingParams) -> list[SimpleNamespace]:
        self.requests.append((prompts, params))
        return [SimpleNamespace(outputs=[SimpleNamespace(text=ANSWER) for _ in range(params.n)]) for _ in prompts]

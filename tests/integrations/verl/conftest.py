"""veRL pins transformers < 5.11, which the service's sentence-transformers does not accept: tests here start
the real service from the root .venv (make builds it first)."""

from pathlib import Path

import pytest

from setpo_server.local import LocalServer

ROOT_VENV_PYTHON = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python"


@pytest.fixture(scope="session")
def server():
    with LocalServer(command=[str(ROOT_VENV_PYTHON), "-m", "setpo_server.cli"]) as running:
        yield running

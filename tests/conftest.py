"""Fixtures shared by the integration tests: the real setpo-server, on a free 127.0.0.1 port, with the
real embedded model, driven over HTTP by the real client."""

import os

import pytest

from setpo_client import SetpoClient
from setpo_server.local import LocalServer

# The suites compare served numbers with float32 references; SETPO_DTYPE=auto may choose bfloat16 on a CPU with AMX,
# so every service a test starts runs float32 unless it names its dtype (tests/server/test_precision.py tests auto).
os.environ.setdefault("SETPO_DTYPE", "float32")


@pytest.fixture(scope="session")
def server():
    with LocalServer() as running:
        yield running


@pytest.fixture
def client(server):
    with SetpoClient(server.url, max_retries=2) as setpo:
        yield setpo


@pytest.fixture(scope="session")
def st_model():
    """The same model in-process, as the reference the service must agree with."""
    from sentence_transformers import SentenceTransformer

    from setpo_server.backend import embedded_model_path

    return SentenceTransformer(embedded_model_path(), device="cpu")


@pytest.fixture(scope="session")
def service():
    """The real app and model in this process (tests/inprocess.py): for HTTP behaviour that needs no socket."""
    from tests.inprocess import InProcessService

    with InProcessService() as running:
        yield running


@pytest.fixture
def inprocess(service):
    """The real client against the in-process app."""
    with service.client(max_retries=0) as setpo:
        yield setpo

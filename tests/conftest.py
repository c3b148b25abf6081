"""Fixtures shared by the integration tests: the real setpo app with the real embedded model, driven by the real
client, in this process (tests/inprocess.py) for HTTP behaviour that needs no socket; and the real setpo-server on a
free 127.0.0.1 port (setpo_server.local.LocalServer) for what does: timeouts and hang-ups, signals, the CLIs and
scripts that take a URL."""

import os

import pytest

from setpo_client import SetpoClient
from setpo_server.local import LocalServer

# The suites compare served numbers with float32 references; SETPO_DTYPE=auto may choose bfloat16 on a CPU with
# native bfloat16, AMX or AVX512-BF16 (tests/server/test_precision.py tests auto in process, the container test of
# make test-deploy in the image). In-process services (tests/inprocess.py) take float32 unless named.
# A LocalServer drops this process's SETPO_* variables by design: the session server below, and every other that is
# compared with a float32 reference, names float32 itself. The variable is for what runs in this process.
os.environ.setdefault("SETPO_DTYPE", "float32")


@pytest.fixture(scope="session")
def server():
    """The real setpo-server as a child process: for what needs a socket."""
    with LocalServer(dtype="float32") as running:
        yield running


@pytest.fixture
def client(server):
    """The real client against the real server (the framework suites' venvs cannot load the model in-process)."""
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
    """The real app and model in this process (tests/inprocess.py), default settings: loaded once per test run."""
    from tests.inprocess import InProcessService

    with InProcessService() as running:
        yield running


@pytest.fixture
def inprocess(service):
    """The real client against the in-process app, never retrying."""
    with service.client(max_retries=0) as setpo:
        yield setpo


@pytest.fixture
def http(service):
    """A plain httpx client of the in-process app, for requests a test writes itself."""
    with service.http() as plain:
        yield plain

"""What the setpo-eval tests share: the real command as a process, a tiny real model, a stand-in LLM judge, and the
placeholder vLLM for the tests of the vLLM path."""

import importlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

PLACEHOLDERS = str(Path(__file__).with_name("placeholders"))

BIN = Path(sys.executable).parent  # the venv's console scripts, as a user runs them


def setpo_eval(*argv: str, placeholder_vllm: bool = False) -> subprocess.CompletedProcess:
    """The real `setpo-eval` command as a process; with placeholder_vllm, tests/eval/placeholders' vLLM importable."""
    # Neither another suite's PYTHONPATH (tests/trainer puts its own vLLM placeholder there) nor the caller's keys
    leak = ("PYTHONPATH", "SETPO_API_KEY", "SETPO_JUDGE_KEY")
    env = {name: value for name, value in os.environ.items() if name not in leak}
    if placeholder_vllm:
        env["PYTHONPATH"] = PLACEHOLDERS
    command = [str(BIN / "setpo-eval"), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A random two-layer Llama with SmolLM2's tokenizer and chat template (tests/tiny_model.py): loads in a blink."""
    from tests.tiny_model import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def vllm(monkeypatch):
    """tests/eval/placeholders/vllm imported as `vllm`, for this test only: afterwards `vllm` is not importable
    again, so no other test finds it (setpo-eval's --backend auto looks for it)."""
    monkeypatch.syspath_prepend(PLACEHOLDERS)
    sys.modules.pop("vllm", None)
    placeholder = importlib.import_module("vllm")
    yield placeholder
    sys.modules.pop("vllm", None)


@pytest.fixture
def judge_server():
    """A real HTTP server on 127.0.0.1 answering /chat/completions with whatever `state["reply"]` says."""
    state = {"reply": "[[4]]\nThree distinct strategies.", "status": 200, "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            state["requests"].append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
            answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": state["reply"]}}]}).encode()
            self.send_response(state["status"])
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    server.shutdown()

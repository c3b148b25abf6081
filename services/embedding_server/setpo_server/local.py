"""Run a real setpo-server as a child process on 127.0.0.1: for the demo, the benchmarks and the tests.

with LocalServer(max_queue_texts=64) as server:   # settings as keyword arguments, SETPO_* in the child
    SetpoClient(server.url).diversity(...)
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalServer:
    def __init__(self, port: int | None = None, command: list[str] | None = None, **settings: object):
        self.port = port or free_port()
        self.command = command or [sys.executable, "-m", "setpo_server.cli"]
        self.env = {
            # the caller's own SETPO_* variables would silently change the server under test: only ours count
            **{name: value for name, value in os.environ.items() if not name.startswith("SETPO_")},
            "HF_HUB_OFFLINE": "1",  # the embedded model is on disk: never reach for a hub
            "TRANSFORMERS_OFFLINE": "1",
            "SETPO_HOST": "127.0.0.1",
            "SETPO_PORT": str(self.port),
            **{f"SETPO_{name.upper()}": str(value) for name, value in settings.items()},
        }
        self.log_path = Path(tempfile.mkstemp(prefix="setpo-server-", suffix=".log")[1])
        # readable for as long as this object is (a test reads it after stop()); gone with it, not left in /tmp
        weakref.finalize(self, self.log_path.unlink, missing_ok=True)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # far above what loading takes on the slowest CPU: only a server that neither gets ready nor exits waits this long
    def start(self, wait: bool = True, timeout: float = 600.0) -> "LocalServer":
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if wait:
            try:
                self.wait_until(lambda: httpx.get(f"{self.url}/ready", timeout=5).status_code == 200, timeout)
            except BaseException:  # not ready in time, or interrupted: `with` never reaches __exit__, so stop it here
                self.stop()
                raise
        return self

    def wait_until(self, condition: Callable[[], bool], timeout: float = 600.0) -> None:
        """Polls condition() until true; fails with the server's log if it dies or the time runs out."""
        assert self.process is not None, "start() the server first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"setpo-server exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            try:
                if condition():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"setpo-server not there after {timeout} s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""One way to say where the service is (issue 27, item 1): SETPO_URL and SETPO_API_KEY, read by the client, the
example and the bandit alike; a service is started only when none is given, and they say which."""

import os
import subprocess
import sys
from pathlib import Path

from setpo_client import SetpoClient
from setpo_trainer import bandit

ROOT = Path(__file__).parents[2]


def test_the_client_without_a_url_reads_setpo_url_and_setpo_api_key(server, monkeypatch):
    monkeypatch.setenv("SETPO_URL", server.url)
    monkeypatch.setenv("SETPO_API_KEY", "from-the-environment")
    with SetpoClient() as client:
        assert client.base_url == server.url
        assert client.headers["Authorization"] == "Bearer from-the-environment"
        assert client.info().model == "all-MiniLM-L6-v2"
    monkeypatch.delenv("SETPO_URL")
    assert SetpoClient().base_url == "http://127.0.0.1:8000"


def run_example(env: dict) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SETPO_")}
    return subprocess.run(
        [sys.executable, str(ROOT / "examples/math_solutions_demo.py")],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_example_uses_the_service_it_is_given_and_starts_one_only_without(server):
    given = run_example({"SETPO_URL": server.url})
    assert given.returncode == 0, given.stderr[-2000:]
    assert f"Using the setpo service at {server.url}" in given.stdout and "starting" not in given.stdout.lower()
    alone = run_example({})
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert "SETPO_URL is not set: starting setpo-server" in alone.stdout


def test_the_bandit_uses_setpo_url(server, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SETPO_URL", server.url)
    bandit.main(["--out", str(tmp_path), "--steps", "3", "--seeds", "0"])
    assert f"using the setpo service at {server.url}" in capsys.readouterr().out

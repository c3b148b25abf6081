"""`setpo-server` takes every setting as a flag, like every server: --help lists them, flags beat SETPO_*
variables, an unknown flag is an error, and the API key is never taken from the command line."""

import re
import subprocess
import sys

import httpx

import setpo_server
from setpo_server.local import LocalServer, free_port
from setpo_server.settings import Settings

SERVER = [sys.executable, "-m", "setpo_server.cli"]


def test_help_lists_every_setting_with_its_variable_and_starts_nothing():
    result = subprocess.run([*SERVER, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for name in Settings.model_fields:
        if name == "api_key":
            assert not re.search(r"--api-key\b(?!-)", result.stdout)  # secrets never on a command line (a path may be)
            assert "SETPO_API_KEY, from the environment only" in result.stdout  # but --help says where it goes
            continue
        assert f"--{name.replace('_', '-')}" in result.stdout and f"SETPO_{name.upper()}" in result.stdout, name


def test_version_prints_the_packages_version():
    result = subprocess.run([*SERVER, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == f"setpo-server {setpo_server.__version__}\n", result.stderr


def test_unknown_flag_and_key_on_the_command_line_are_refused():
    unknown = subprocess.run([*SERVER, "--prot", "9000"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unrecognized arguments: --prot" in unknown.stderr
    key = subprocess.run([*SERVER, "--api-key=abc"], capture_output=True, text=True, timeout=60)
    assert key.returncode != 0 and "SETPO_API_KEY" in key.stderr


def test_flags_override_the_environment():
    port = free_port()
    # SETPO_PORT (LocalServer's own) and SETPO_MAX_GROUPS say otherwise; the flags win
    server = LocalServer(command=[*SERVER, "--port", str(port), "--max-groups", "7", "--threads", "1"], max_groups=9)
    assert server.env["SETPO_PORT"] != str(port)
    server.port = port  # where the flag says it listens
    with server:
        info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["limits"]["max_groups"] == 7 and info["threads"] == 1


def test_a_uvicorn_outside_the_range_its_protocol_was_written_for_stops_the_start_naming_the_range():
    """protocol.py subclasses uvicorn's HTTP protocol: setpo-server declares the uvicorn releases it was written
    against, and refuses to start with another (an older uvicorn installed beside it, say)."""
    older = (
        "import importlib.metadata as m\n"
        "installed = m.version\n"
        "m.version = lambda name: '0.29.0' if name == 'uvicorn' else installed(name)\n"
        "from setpo_server.cli import main\n"
        "main()\n"
    )
    run = subprocess.run([sys.executable, "-c", older], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "uvicorn 0.29.0 is installed" in run.stderr and ">=0.30" in run.stderr, run.stderr[-2000:]

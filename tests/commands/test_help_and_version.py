"""Every command answers --help and --version on a machine without the heavy stack (issue 27, item 4): this root
.venv has neither OpenRLHF nor vLLM nor TRL. setpo-train's help then lists SetPO's own flags and says what to
install for OpenRLHF's; anything else it is asked without OpenRLHF is that one message, not a traceback."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
VERSION = importlib.metadata.version("setpo-trainer")
INSTALL = "pip install 'openrlhf[vllm]==0.11.2' 'setpo-trainer[openrlhf]'"


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300)


def test_this_environment_has_no_openrlhf():  # what the tests below stand on
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("openrlhf")


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        ("setpo-train", f"setpo-train {VERSION} (openrlhf not installed)"),
        ("setpo-bandit", f"setpo-bandit {VERSION}"),
        ("setpo-eval", f"setpo-eval {VERSION}"),
        ("setpo-server", f"setpo-server {importlib.metadata.version('setpo-server')}"),
    ],
)
def test_version(command, answer):
    done = run(command, "--version")
    assert done.returncode == 0 and done.stdout.strip() == answer, done.stderr


def test_setpo_train_help_without_openrlhf_lists_setpos_flags_and_what_to_install():
    done = run("setpo-train", "--help")
    assert done.returncode == 0, done.stderr
    for flag in ("--setpo.url", "--setpo.weight", "--setpo.min_reward", "--setpo.kernel", "--setpo.target_ratio"):
        assert flag in done.stdout
    assert INSTALL in " ".join(done.stdout.split())  # argparse wraps the epilog


def test_setpo_train_without_openrlhf_is_one_message_naming_the_install():
    done = run("setpo-train", "--setpo.check_only", "--setpo.url", "http://127.0.0.1:9")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("setpo-train: cannot import OpenRLHF's trainer") and INSTALL in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["setpo-train", "setpo-bandit", "setpo-eval", "setpo-server"])
def test_help(command):
    done = run(command, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: " + command), done.stderr

"""`make test` on a fresh clone: every suite's command runs from a venv that make has built before it.

`make -n -B` prints every command make would run with no venv present, in order, without running any. A rule whose
prerequisite expands to nothing (a variable defined in a later-included mk/*.mk file) shows up as a command that
uses `.venv-x/bin/...` before `python -m venv .venv-x`: on a fresh machine that is "No such file or directory".
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_USE = re.compile(r"(?<![\w./-])(\.venv[\w-]*)/bin/")
VENV_MADE = re.compile(r"-m venv (\.venv[\w-]*)\s*$")


def dry_run(*targets: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    out = subprocess.run(
        ["make", "-n", "-B", *targets], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.splitlines()


@pytest.mark.parametrize("target", ["test", "demo", "experiment", "bench"])
def test_every_venv_is_built_before_it_is_used(target):
    made: set[str] = set()
    for line in dry_run(target):
        if m := VENV_MADE.search(line):
            made.add(m.group(1))
        for venv in VENV_USE.findall(line):
            assert venv in made, f"`make {target}` runs {line!r} before it builds {venv}"


def test_make_test_runs_lint_first_and_every_suite():
    lines = dry_run("test")
    pytest_lines = [line for line in lines if "-m pytest" in line]
    suites = {"tests/integrations/trl", "tests/integrations/verl", "tests/trainer", "tests/experiments", "tests/deploy"}
    assert all(any(s in line for line in pytest_lines) for s in suites), pytest_lines
    first_check = next(line for line in lines if "ruff check" in line or "-m pytest" in line)
    assert "ruff check" in first_check


def test_pytest_args_reach_every_suite():
    pytest_lines = [line for line in dry_run("test", "PYTEST_ARGS=-k readme -x") if "-m pytest" in line]
    assert len(pytest_lines) >= 6, pytest_lines
    assert all("-k readme -x" in line for line in pytest_lines), pytest_lines

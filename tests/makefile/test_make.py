"""`make test` on a fresh clone: every suite's command runs from a venv that make has built before it.

`make -n -B` prints every command make would run with no venv present, in order, without running any. A rule whose
prerequisite expands to nothing (a variable defined in a later-included mk/*.mk file) shows up as a command that
uses `.venv-x/bin/...` before `python -m venv .venv-x`: on a fresh machine that is "No such file or directory".
"""

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_USE = re.compile(r"(?<![\w./-])(\.venv[\w-]*)/bin/")
VENV_MADE = re.compile(r"-m venv (\.venv[\w-]*)\s*$")
# make puts a variable set on its command line (make test TEST_JOBS=3) in its recipes' environment: the make runs
# below see the Makefile's own defaults, not those of the make that runs this suite
KNOBS = {"TEST_JOBS", "XDIST", "PYTEST_ARGS", "SLOWEST", "INSTALLER", "SUITE_ENV"}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in KNOBS}


def dry_run(*targets: str) -> list[str]:
    env = clean_env()
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


def test_the_root_suite_runs_as_two_suites_that_together_run_each_of_its_folders_once():
    """test-service and test-client, side by side in make test: every folder of pytest.ini's testpaths in one of them."""
    testpaths = configparser.ConfigParser()
    testpaths.read(ROOT / "pytest.ini")
    root_lines = [line for line in dry_run("test") if re.match(r"(\S+=\S* )*\.venv/bin/python -m pytest ", line)]
    parts = [next(s for s in ("test-service", "test-client") if f"out/junit/{s}.xml" in line) for line in root_lines]
    assert parts == ["test-service", "test-client"], root_lines
    folders = [word for line in root_lines for word in line.split() if word.startswith("tests/")]
    assert sorted(folders) == sorted(testpaths["pytest"]["testpaths"].split()), root_lines


def test_every_suite_and_make_check_run_with_openmp_threads_that_sleep_while_they_wait():
    """SUITE_ENV: a suite's torch processes share the cores with each other and with the suite beside it, where
    OpenMP threads spinning for work would take the CPU the others' forward passes need (docs/development.md)."""
    pytest_lines = [line for line in dry_run("test", "check") if "-m pytest" in line]
    assert len(pytest_lines) == 8, pytest_lines  # seven suites and make check
    assert all(line.startswith("OMP_WAIT_POLICY=PASSIVE ") for line in pytest_lines), pytest_lines


def make_value(variable: str) -> list[str]:
    """A variable of the Makefile as make sees it once every mk/*.mk is read."""
    env = clean_env()
    out = subprocess.run(
        ["make", "-s", "--eval", f"print-value: ; @echo $({variable})", "print-value"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.split()


def test_make_test_times_every_suite_and_prints_the_summary_last():
    lines = dry_run("test")
    suites = make_value("TEST_TARGETS")
    assert "test-service" in suites and len(suites) >= 6, suites
    reset = lines.index("rm -f out/test-times.txt out/test-failed out/junit/*.xml")
    assert reset < next(i for i, line in enumerate(lines) if "ruff check" in line)
    timed = [line for line in lines if "| tee -a out/test-times.txt; exit $rc" in line]
    assert [line for line in timed if "-m pytest" in line] == timed, timed
    assert [next(s for s in suites if f'echo "{s} $SECONDS s' in line) for line in timed] == suites, timed
    # each suite's JUnit report, from which the slowest tests over every suite are printed before the times
    assert [next(s for s in suites if f"--junitxml=out/junit/{s}.xml" in line) for line in timed] == suites, timed
    assert "mk/slowest.py" in lines[-3], lines[-3]
    assert lines[-2].endswith("cat out/test-times.txt"), lines[-2]
    assert lines[-1].startswith("[ ! -e out/test-failed ] ||") and "exit 2" in lines[-1], lines[-1]


def test_make_test_runs_the_suites_two_at_a_time_and_every_one_even_after_a_failure():
    (suites_line,) = [line for line in dry_run("test") if "--output-sync=target" in line]
    assert "--keep-going -j2 " in suites_line and suites_line.endswith(" || touch out/test-failed"), suites_line
    assert all(f" {suite} " in suites_line for suite in make_value("TEST_TARGETS")), suites_line


def test_a_failing_suite_still_fails_make_and_its_time_is_kept(tmp_path):
    rules = tmp_path / "suites.mk"
    rules.write_text("passes:\n\ttrue $(SUITE_TIME)\nfails:\n\t(exit 3) $(SUITE_TIME)\n")
    times = tmp_path / "times.txt"
    env = clean_env()
    run = subprocess.run(
        ["make", "-s", "-f", "Makefile", "-f", str(rules), f"TEST_TIMES={times}", "passes", "fails"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "Error 3" in run.stderr, run
    passed, failed = times.read_text().splitlines()
    assert re.fullmatch(r"passes \d+ s", passed) and re.fullmatch(r"fails \d+ s \(exit 3\)", failed), (passed, failed)


def test_make_check_runs_lint_then_the_fast_tests_of_the_math_the_service_and_the_client():
    lines = dry_run("check")
    lint = [".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy"]
    assert [line for line in lines if line in lint] == lint, lines
    pytest_lines = [line for line in lines if "-m pytest" in line]
    assert len(pytest_lines) == 1 and lines[-1] == pytest_lines[0] and lines.index(lint[-1]) < len(lines) - 1, lines
    args = pytest_lines[0].split()
    paths = [a for a in args if a.startswith("tests/")]
    assert "tests/core" in paths
    assert any(p.startswith("tests/client/") for p in paths) and any(p.startswith("tests/server/") for p in paths)
    # the suites of real server processes stay in make test alone
    assert not {
        "tests/server/test_lifecycle.py",
        "tests/server/test_supervision.py",
        "tests/client/test_replicas.py",
    } & set(paths)
    # every path and every deselected test still exists: a renamed test would silently come back into the loop
    deselected = [args[i + 1] for i, a in enumerate(args) if a == "--deselect"]
    assert deselected, args
    assert all((ROOT / p.split("::")[0]).exists() for p in paths + deselected), paths + deselected
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *deselected],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert collected.returncode == 0 and f"{len(deselected)} test" in collected.stdout, collected.stdout


def test_pytest_args_reach_make_check():
    (pytest_line,) = [line for line in dry_run("check", "PYTEST_ARGS=-k readme -x") if "-m pytest" in line]
    assert pytest_line.endswith("-k readme -x || [ $? -eq 5 ]"), pytest_line

"""Keys never ride on the command line, where every user of the machine can read them (ps, /proc): the old flags are
refused with where the key goes now, and the key from a file or the environment reaches the service and the judge."""

import json

import pytest

from setpo_server.local import LocalServer
from setpo_trainer.eval import cli
from tests.eval.conftest import setpo_eval

KEY = "sk-eval-0123456789"


@pytest.mark.parametrize(
    ("argv", "instead"),
    [
        (["--setpo-api-key", KEY], "set SETPO_API_KEY or pass --setpo-api-key-file PATH"),
        (["--judge-key", KEY], "set SETPO_JUDGE_KEY or pass --judge-key-file PATH"),
        ([f"--judge-key={KEY}"], "set SETPO_JUDGE_KEY or pass --judge-key-file PATH"),
    ],
)
def test_a_key_on_the_command_line_is_refused_with_where_it_goes(argv, instead):
    done = setpo_eval("run", "--dataset", "gsm8k", "--samples", "s.jsonl", "--method", "m", "--out", "o", *argv)
    flag = argv[0].split("=")[0]
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        f"setpo-eval: error: {flag} is not taken: a command line is visible to every user of the machine (ps); {instead}"
    )
    assert KEY not in done.stderr


def scored(tmp_path, *argv: str, out: str = "out") -> list[str]:
    """setpo-eval run on one written sample: the judge or the service is all that is asked."""
    dataset, samples = tmp_path / "problems.jsonl", tmp_path / "samples.jsonl"
    dataset.write_text(json.dumps({"id": "p1", "question": "What is 6 * 7?", "answer": "42"}) + "\n")
    samples.write_text(
        "".join(json.dumps({"problem_id": "p1", "response": r}) + "\n" for r in ("\\boxed{42}", "42", "six sevens"))
    )
    out_dir = str(tmp_path / out)
    return [
        "run",
        "--dataset",
        str(dataset),
        "--kind",
        "math",
        "--samples",
        str(samples),
        "--method",
        "m",
        "--out",
        out_dir,
        *argv,
    ]


def test_the_judge_key_comes_from_its_file_else_the_environment(judge_server, tmp_path, monkeypatch):
    url, state = judge_server
    key_file = tmp_path / "judge.key"
    key_file.write_text(KEY + "\n")  # as `echo KEY > file` leaves it
    monkeypatch.setenv("SETPO_JUDGE_KEY", "from-the-environment")
    cli.main(scored(tmp_path, "--judge-url", url, "--judge-key-file", str(key_file)))
    cli.main(scored(tmp_path, "--judge-url", url))
    assert [request["auth"] for request in state["requests"]] == [f"Bearer {KEY}", "Bearer from-the-environment"]


@pytest.fixture(scope="module")
def guarded():
    with LocalServer(api_key=KEY) as server:
        yield server


def test_the_service_key_comes_from_its_file(guarded, tmp_path, monkeypatch):
    monkeypatch.delenv("SETPO_API_KEY", raising=False)
    key_file = tmp_path / "setpo.key"
    key_file.write_text(KEY + "\n")
    cli.main(scored(tmp_path, "--setpo-url", guarded.url, "--setpo-api-key-file", str(key_file)))
    assert "set_score" in json.loads((tmp_path / "out" / "summary.json").read_text())["diversity"]
    with pytest.raises(SystemExit, match="setpo server answered 401"):  # the same run without it: the key mattered
        cli.main(scored(tmp_path, "--setpo-url", guarded.url, out="without"))

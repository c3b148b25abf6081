"""What a user who gets something wrong sees: the real `setpo-eval` command, run as a process, answers with one
sentence on stderr and exit code 2 (argparse's code for a bad command line), never a traceback. A service or judge
that fails after the samples are written is exit code 1, with where the samples are."""

import json

import pytest

from tests.eval.conftest import setpo_eval


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A good dataset and samples, and the bad things a user may hand setpo-eval."""
    tmp = tmp_path_factory.mktemp("inputs")
    (tmp / "problems.jsonl").write_text(json.dumps({"id": "p1", "question": "What is 6 * 7?", "answer": "42"}) + "\n")
    (tmp / "samples.jsonl").write_text(json.dumps({"problem_id": "p1", "response": "\\boxed{42}"}) + "\n")
    (tmp / "not-json.jsonl").write_text("question: what is 6 * 7?\n")
    (tmp / "empty.jsonl").write_text("\n")
    (tmp / "empty.key").write_text("\n")
    (tmp / "no-model").mkdir()
    (tmp / "broken-model").mkdir()
    (tmp / "broken-model" / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (tmp / "no-run").mkdir()
    return {
        name: str(tmp / name)
        for name in ("problems.jsonl", "samples.jsonl", "not-json.jsonl", "empty.jsonl", "broken-model")
    } | {"tmp": str(tmp)}


def run_command(files: dict[str, str], *argv: str) -> list[str]:
    return [
        "run",
        "--dataset",
        files["problems.jsonl"],
        "--kind",
        "math",
        "--method",
        "m",
        "--out",
        files["tmp"] + "/out",
        *argv,
    ]


CASES = {
    "unknown dataset": (
        lambda f: ["run", "--dataset", "gsm9k", "--samples", f["samples.jsonl"], "--method", "m", "--out", f["tmp"]],
        "setpo-eval: unknown dataset 'gsm9k': use gsm8k, math500, countdown or a .jsonl file",
    ),
    "missing dataset file": (
        lambda f: (
            ["run", "--dataset", f["tmp"] + "/nope.jsonl", "--kind", "math", "--samples", f["samples.jsonl"]]
            + ["--method", "m", "--out", f["tmp"]]
        ),
        "setpo-eval: no dataset file {tmp}/nope.jsonl",
    ),
    "dataset not JSON lines": (
        lambda f: (
            ["run", "--dataset", f["not-json.jsonl"], "--kind", "math", "--samples", f["samples.jsonl"]]
            + ["--method", "m", "--out", f["tmp"]]
        ),
        "setpo-eval: {tmp}/not-json.jsonl has a line that is not JSON (",
    ),
    "dataset without problems": (
        lambda f: (
            ["run", "--dataset", f["empty.jsonl"], "--kind", "math", "--samples", f["samples.jsonl"]]
            + ["--method", "m", "--out", f["tmp"]]
        ),
        "setpo-eval: dataset {tmp}/empty.jsonl has no problems",
    ),
    "samples file without samples": (
        lambda f: run_command(f, "--samples", f["empty.jsonl"]),
        "setpo-eval: {tmp}/empty.jsonl holds no samples",
    ),
    "missing samples file": (
        lambda f: run_command(f, "--samples", f["tmp"] + "/nope.jsonl"),
        "setpo-eval: no samples file {tmp}/nope.jsonl",
    ),
    "samples of other problems": (
        lambda f: (
            ["run", "--dataset", "countdown", "--limit", "2", "--samples", f["samples.jsonl"]]
            + ["--method", "m", "--out", f["tmp"]]
        ),
        "setpo-eval: {tmp}/samples.jsonl has no samples for problem countdown-0-0 (2 of 2 lack them)",
    ),
    "missing model folder": (
        lambda f: run_command(f, "--model", f["tmp"] + "/nowhere"),
        "setpo-eval: no model folder at {tmp}/nowhere",
    ),
    "folder that is no model": (
        lambda f: run_command(f, "--model", f["tmp"] + "/no-model"),
        "setpo-eval: {tmp}/no-model has no config.json: it is not a transformers model folder",
    ),
    "model transformers cannot load": (
        lambda f: run_command(f, "--model", f["broken-model"], "--backend", "transformers"),
        "setpo-eval: cannot load the model {tmp}/broken-model with transformers: ",
    ),
    "--backend vllm without vLLM": (
        lambda f: run_command(f, "--model", f["broken-model"], "--backend", "vllm"),
        "setpo-eval: --backend vllm needs vLLM in this environment (pip install vllm), or use --backend auto",
    ),
    "vLLM's flags where transformers generates": (
        lambda f: run_command(
            f, "--model", f["broken-model"], "--backend", "transformers", "--gpu-memory-utilization", "0.5"
        ),
        "setpo-eval: --gpu-memory-utilization set vLLM's engine, but this run generates with transformers",
    ),
    "unreadable judge key file": (
        lambda f: (
            run_command(f, "--samples", f["samples.jsonl"], "--judge-url", "http://127.0.0.1:9/v1")
            + ["--judge-key-file", f["tmp"] + "/no-key"]
        ),
        "setpo-eval: cannot read the key file {tmp}/no-key: No such file or directory",
    ),
    "empty judge key file": (
        lambda f: (
            run_command(f, "--samples", f["samples.jsonl"], "--judge-url", "http://127.0.0.1:9/v1")
            + ["--judge-key-file", f["tmp"] + "/empty.key"]
        ),
        "setpo-eval: the key file {tmp}/empty.key is empty",
    ),
    "compare a folder that is no run": (
        lambda f: ["compare", f["tmp"] + "/no-run", "--out", f["tmp"] + "/cmp"],
        "setpo-eval: {tmp}/no-run has no summary.json: it is not a directory setpo-eval run wrote",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_sentence_and_exit_code_2(case, files):
    argv, sentence = CASES[case]
    done = setpo_eval(*argv(files))
    assert done.returncode == 2 and done.stderr.startswith(sentence.format(tmp=files["tmp"])), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_a_model_vllm_cannot_load_is_one_sentence(files):
    done = setpo_eval(*run_command(files, "--model", files["broken-model"], "--backend", "vllm"), placeholder_vllm=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"setpo-eval: cannot load the model {files['broken-model']} with vLLM: ")


@pytest.mark.parametrize(
    ("flag", "failure"),
    [
        ("--setpo-url", "setpo-eval: cannot reach the setpo server at http://127.0.0.1:9 after 6 attempts"),
        ("--judge-url", "setpo-eval: cannot reach the judge at http://127.0.0.1:9/v1"),
    ],
)
def test_a_service_or_judge_that_fails_is_one_sentence_and_exit_code_1(flag, failure, files):
    url = "http://127.0.0.1:9" + ("/v1" if flag == "--judge-url" else "")  # port 9 (discard): nothing listens
    done = setpo_eval(*run_command(files, "--samples", files["samples.jsonl"], flag, url))
    last = done.stderr.splitlines()[-1]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert last.startswith(failure) and last.endswith(
        f"({files['tmp']}/out/samples.jsonl is kept: --samples scores it again)"
    )

"""setpo-eval on GPUs: vLLM's engine settings reach vllm.LLM (through the real code path, with the placeholder vLLM of
tests/eval/placeholders), transformers runs on the device torch offers in the dtype asked, and a summary records
the temperature and top-p its samples were actually drawn at."""

import json

import pytest
import torch

from setpo_trainer.eval import cli
from setpo_trainer.eval.errors import InputError
from setpo_trainer.eval.generate import encode, load_transformers, pick_device


def write_problem(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps({"id": "p1", "question": "What is 6 * 7?", "answer": "42"}) + "\n")
    return path


def run_args(tmp_path, *extra: str, out: str = "out") -> list[str]:
    dataset = str(write_problem(tmp_path))
    return ["run", "--dataset", dataset, "--kind", "math", "--method", "m", "--out", str(tmp_path / out), *extra]


def summary(tmp_path, out: str = "out") -> dict:
    return json.loads((tmp_path / out / "summary.json").read_text())


def test_vllm_flags_reach_the_engine(vllm, tiny_model, tmp_path):
    engine = ["--tensor-parallel-size", "2", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.55"]
    cli.main(run_args(tmp_path, "--model", tiny_model, "--backend", "vllm", "--n", "3", "--seed", "7", *engine))

    llm = vllm.engines[-1]
    assert llm.engine == {
        "model": tiny_model,
        "seed": 7,
        "dtype": "bfloat16",
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.55,
    }
    (prompts, params), *_ = llm.requests
    assert (params.n, params.temperature, params.top_p, params.seed) == (3, 0.5, 0.9, 7)
    assert prompts[0].startswith("<|im_start|>") and "What is 6 * 7?" in prompts[0]  # SmolLM2's chat template
    assert summary(tmp_path)["accuracy"]["avg@3"] == 1.0  # the placeholder's answer, scored


def test_without_the_flags_vllm_keeps_its_own_defaults(vllm, tiny_model, tmp_path):
    cli.main(run_args(tmp_path, "--model", tiny_model, "--backend", "vllm", "--n", "1"))
    assert vllm.engines[-1].engine == {"model": tiny_model, "seed": 0, "dtype": "auto"}


def test_vllm_flags_are_refused_where_transformers_generates(tiny_model, tmp_path):
    args = run_args(tmp_path, "--model", tiny_model, "--backend", "transformers", "--tensor-parallel-size", "2")
    with pytest.raises(InputError, match="--tensor-parallel-size set vLLM's engine, but this run generates with"):
        cli.run(cli.parse_args(args))


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_memory_fraction_is_a_fraction(value, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(
            ["run", "--dataset", "gsm8k", "--model", "m", "--method", "m", "--out", "x"]
            + ["--gpu-memory-utilization", value]
        )
    assert "is not a fraction in (0, 1]" in capsys.readouterr().err


def test_the_device_is_the_gpu_when_torch_sees_one():
    assert pick_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_model_and_inputs_land_on_the_device_given(tiny_model):
    # "meta" rather than the CPU: a model and inputs left where they were made (the CPU) would pass a CPU check too
    meta = torch.device("meta")
    tokenizer, model = load_transformers(tiny_model, "auto", meta)
    assert {p.device for p in model.parameters()} == {meta}
    for chat in (True, False):
        assert {t.device for t in encode(tokenizer, "What is 6 * 7?", chat, meta).values()} == {meta}


def test_dtype_applies_to_transformers_too(tiny_model):
    _, model = load_transformers(tiny_model, "bfloat16", torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    _, model = load_transformers(tiny_model, "auto", torch.device("cpu"))  # the checkpoint's own: float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_transformers_generates_on_the_gpu(tiny_model):
    tokenizer, model = load_transformers(tiny_model, "auto", pick_device())
    encoded = encode(tokenizer, "What is 6 * 7?", True, pick_device())
    assert next(model.parameters()).is_cuda and encoded["input_ids"].is_cuda
    assert model.generate(**encoded, do_sample=True, max_new_tokens=4).is_cuda


def test_a_samples_run_records_the_settings_its_samples_were_drawn_at(vllm, tiny_model, tmp_path):
    sampling = ["--temperature", "1.0", "--top-p", "0.95"]
    cli.main(run_args(tmp_path, "--model", tiny_model, "--backend", "vllm", "--n", "2", *sampling, out="drawn"))
    params = vllm.engines[-1].requests[0][1]
    assert (params.temperature, params.top_p) == (1.0, 0.95)
    assert (summary(tmp_path, "drawn")["temperature"], summary(tmp_path, "drawn")["top_p"]) == (1.0, 0.95)

    # Scored again without the flags: the settings come from the rows, not the paper's 0.5 and 0.9
    drawn = str(tmp_path / "drawn" / "samples.jsonl")
    cli.main(run_args(tmp_path, "--samples", drawn, out="rescored"))
    assert (summary(tmp_path, "rescored")["temperature"], summary(tmp_path, "rescored")["top_p"]) == (1.0, 0.95)
    with pytest.raises(SystemExit) as refused:  # a flag that contradicts the rows is refused, not recorded
        cli.main(run_args(tmp_path, "--samples", drawn, "--temperature", "0.5", out="wrong"))
    assert refused.value.code == 2


def test_samples_from_elsewhere_record_the_flags_or_nothing(tmp_path):
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps({"problem_id": "p1", "response": "\\boxed{42}"}) + "\n")
    cli.main(run_args(tmp_path, "--samples", str(foreign), out="unknown"))
    assert (summary(tmp_path, "unknown")["temperature"], summary(tmp_path, "unknown")["top_p"]) == (None, None)
    cli.main(run_args(tmp_path, "--samples", str(foreign), "--temperature", "0.7", "--top-p", "1.0", out="told"))
    assert (summary(tmp_path, "told")["temperature"], summary(tmp_path, "told")["top_p"]) == (0.7, 1.0)
    rows = (tmp_path / "told" / "samples.jsonl").read_text().splitlines()
    assert json.loads(rows[0])["temperature"] == 0.7  # carried into the rows it writes, for the next --samples


def test_samples_drawn_at_two_temperatures_are_refused(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    rows = [{"problem_id": "p1", "response": "\\boxed{42}", "temperature": t, "top_p": 0.9} for t in (0.5, 1.0)]
    mixed.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(InputError, match=r"mixes samples drawn at temperature 0\.5, 1\.0"):
        cli.run(cli.parse_args(run_args(tmp_path, "--samples", str(mixed))))

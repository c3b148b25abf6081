"""Shared by the setpo-train tests, which run in .venv-openrlhf against the real pinned OpenRLHF.

vLLM and flash-attn cannot exist on a CPU machine; OpenRLHF imports them at module level, so the
placeholder packages of tests/trainer/placeholders go first on the path of this process and of every
process it starts (setpo-train, Ray workers). Nothing else is replaced; where vLLM would sample, the tests
use written responses (rollouts.py).
"""

import os
import sys
from pathlib import Path

import pytest

PLACEHOLDERS = str(Path(__file__).with_name("placeholders"))
REPO = str(Path(__file__).parents[2])  # so Ray workers can import tests.trainer.rollouts too
sys.path.insert(0, PLACEHOLDERS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [PLACEHOLDERS, REPO, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """What OpenRLHF's trainer loads (tokenizer, config): see tests/tiny_model.py."""
    from tests.tiny_model import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def problems():
    from tests.trainer.rollouts import KINDS, gsm8k_problems

    return gsm8k_problems(len(KINDS))

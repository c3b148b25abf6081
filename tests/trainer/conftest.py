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
    """A tiny random Llama with SmolLM2's real tokenizer: what OpenRLHF's trainer loads (tokenizer, config)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from setpo_trainer.models import smollm2_path

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def problems():
    from tests.trainer.rollouts import KINDS, gsm8k_problems

    return gsm8k_problems(len(KINDS))

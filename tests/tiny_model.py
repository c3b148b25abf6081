"""A tiny random Llama with SmolLM2's real tokenizer: a real transformers model that trains in about a second a
step on CPU. Shared by the TRL and OpenRLHF suites (each in its own venv)."""

from pathlib import Path


def tiny_llama(path: Path) -> str:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from setpo_trainer.models import smollm2_path

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)

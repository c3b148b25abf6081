"""A causal LM shaped like Qwen/Qwen2.5-Math-1.5B (the paper's smallest policy), with random weights.

For benchmarks.trl_wait on the GPU machine, where no weights can be fetched and SmolLM2's 270 MB are over the
carry limit: a step's time depends on the shape, not the weights' values. The shape is Qwen2.5-1.5B's config
(28 layers, hidden 1536, MLP 8960, 12 query and 2 key/value heads); the tokenizer is SmolLM2's (Qwen's is not
here), so the vocabulary is its 49152 tokens. Random weights rarely emit an end token: every completion runs to
max_completion_length, which fixes the step's size.

    python3 -m benchmarks.gpu.policy_shaped OUT_DIR --tokenizer .gpu/smollm2-tokenizer [--tiny]
"""

import argparse
import shutil
from pathlib import Path
from typing import Any

import torch

QWEN25_15B: dict[str, Any] = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# a CPU check of the same code path (--tiny)
TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True, help="a folder with SmolLM2's tokenizer files")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the same kind, for a CPU check")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    shape = {**QWEN25_15B, **(TINY if args.tiny else {})}
    config = Qwen2Config(
        **shape,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (args.tokenizer / name).exists():
            shutil.copy(args.tokenizer / name, args.out / name)
    print(f"{args.out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()

"""A sentence-transformers folder shaped like Qwen/Qwen3-Embedding-0.6B, with random weights.

Throughput does not depend on the weights' values, and no weights can be fetched on the GPU machine. The
architecture and dimensions are the model's own (its config.json): 28 Qwen3 layers, hidden 1024, MLP 3072,
16 query and 8 key/value heads of 128, a 151669-token vocabulary, last-token pooling on left-padded input, then
unit length. The tokenizer is MiniLM's (Qwen's is not here): token counts, not ids, set the cost, and every
figure is given per token of this tokenizer.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import torch

QWEN3_EMBEDDING_06B: dict[str, Any] = {
    "vocab_size": 151669,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def build(folder: Path, tokenizer_from: Path, max_seq_length: int, dtype: torch.dtype, **shape: int) -> Path:
    """Writes the folder (shape overrides QWEN3_EMBEDDING_06B's entries, for a small test model) and returns it."""
    from transformers import AutoModel, Qwen3Config

    config = Qwen3Config(**{**QWEN3_EMBEDDING_06B, **shape}, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialising 0.6B on a CPU takes a while
        model = AutoModel.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(tokenizer_from / name, folder / name)
    tokenizer_config = json.loads((tokenizer_from / "tokenizer_config.json").read_text())
    tokenizer_config.update(padding_side="left", model_max_length=max_seq_length)  # Qwen3-Embedding pads left
    write(folder / "tokenizer_config.json", tokenizer_config)
    write(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    write(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    (folder / "1_Pooling").mkdir(exist_ok=True)
    write(
        folder / "1_Pooling" / "config.json",
        {"word_embedding_dimension": config.hidden_size, "pooling_mode_lasttoken": True, "include_prompt": True},
    )
    return folder


def write(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2))

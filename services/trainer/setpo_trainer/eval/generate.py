"""n samples per prompt from a local model: vLLM when it is installed and a GPU is there, else transformers."""

import importlib.util
from typing import TYPE_CHECKING, Literal, cast

import torch
from tqdm import tqdm

if TYPE_CHECKING:
    from transformers import BatchEncoding

Backend = Literal["auto", "transformers", "vllm"]


def pick_backend(backend: Backend) -> str:
    if backend != "auto":
        return backend
    return "vllm" if importlib.util.find_spec("vllm") and torch.cuda.is_available() else "transformers"


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
) -> list[list[str]]:
    """For each prompt, n sampled completions (the paper's evaluation: temperature 0.5, top-p 0.9).

    chat: wrap each prompt as a user turn with the tokenizer's chat template; None = when it has one.
    """
    if pick_backend(backend) == "vllm":
        return _generate_vllm(model_path, prompts, n, temperature, top_p, max_new_tokens, seed, chat)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    samples = []
    for prompt in tqdm(prompts, desc="generating", unit="problem"):
        if use_chat:
            encoded = cast(
                "BatchEncoding",
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}],
                    add_generation_prompt=True,
                    return_tensors="pt",
                    return_dict=True,
                ),
            )
        else:
            encoded = tokenizer(prompt, return_tensors="pt")
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


def _generate_vllm(model_path, prompts, n, temperature, top_p, max_new_tokens, seed, chat) -> list[list[str]]:
    """GPU path; vLLM cannot be installed on the CPU machine the tests run on, so this is untested there."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_path, seed=seed)
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed)
    tokenizer = llm.get_tokenizer()
    if chat if chat is not None else tokenizer.chat_template is not None:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
    return [[choice.text for choice in result.outputs] for result in llm.generate(prompts, params)]

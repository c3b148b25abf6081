"""Reward functions for OpenRLHF's `--reward.remote_url <file>.py`: math_reward.py (GSM8K / MATH boxed final
answer) and countdown_reward.py (Countdown, with the paper's 0.1 format term). OpenRLHF loads such a file by
path and calls `reward_func(queries, prompts, labels)`; the scoring itself is `setpo_trainer.rewards`, the
same functions the evaluation uses.

    --reward.remote_url "$(python -c 'from setpo_trainer.openrlhf.rewards import path; print(path("math"))')"
"""

import re
from os.path import commonprefix
from pathlib import Path

FILES = {"math": "math_reward.py", "countdown": "countdown_reward.py"}


# Chat-template tokens: OpenRLHF decodes the query with skip_special_tokens=False, so a response ends with
# e.g. "<|im_end|>" (Qwen, SmolLM), "<|eot_id|>" (Llama 3) or "</s>"; "The answer is 10.<|im_end|>" must read 10.
SPECIAL_TOKENS = re.compile(r"<\|[^<>|\s]*\|>|</s>")
PROMPT_TAIL = 32  # characters of the prompt's end that locate it in a query that does not decode it exactly


def response_text(query: str, prompt: str) -> str:
    """The response inside OpenRLHF's query (the decoded prompt + response tokens), without chat-template
    tokens. Decoding usually gives the prompt back exactly. If not, the response starts after the prompt's
    last characters, looked for from where query and prompt part, so the prompt's own example answers (a
    Countdown <answer>, a filled-in \\boxed{}) are never scored."""
    if query.startswith(prompt):
        response = query[len(prompt) :]
    else:
        parted, tail = len(commonprefix([query, prompt])), prompt[-PROMPT_TAIL:]  # noqa: RUF071 (characters are wanted)
        found = query.find(tail, parted) if tail else -1
        response = query[found + len(tail) :] if found >= 0 else query[parted:]
    return SPECIAL_TOKENS.sub("", response)


def path(name: str) -> Path:
    if name not in FILES:
        raise ValueError(f"no reward function {name!r}: choose {' or '.join(FILES)}")
    return Path(__file__).with_name(FILES[name])

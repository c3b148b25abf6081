"""The paper's LLM-judge diversity score (appendix "Prompts Used in this Paper"), against any OpenAI-compatible
chat endpoint: POST {url}/chat/completions with a bearer key. The judge answers [[n]], n in 1..5."""

import re

import httpx

JUDGE_PROMPT = """You are an expert in Mathematics Competition Coach evaluating solutions for the AIME.
Your task is to rate the DIVERSITY of problem-solving strategies across {count} generated attempts.

INPUT DATA
PROBLEM:
{problem}

{count} SOLUTION ATTEMPTS:
{responses}

EVALUATION CRITERIA
1. Identify Strategy Clusters: Group solutions by their fundamental mathematical path.
2. Computational/Brute-force: Python scripts or trial-and-error without proof are ONE cluster.
3. Ignore Surface Variations: Different variable names or minor algebraic steps are the SAME strategy.

SCORING RUBRIC (1-5)
Score 1 (Minimal)
- 13+ responses rely on the exact same theorem or computational path.
- Zero meaningful exploration of alternative mathematical properties.
Score 2 (Low)
- 10-12 responses follow the standard textbook approach.
- Only 1 or 2 attempts show a different perspective.
Score 3 (Moderate)
- 7-9 responses use the dominant strategy.
- There are 2-3 clearly distinct mathematical frameworks present.
Score 4 (High)
- 4-6 responses use the most common approach.
- The set demonstrates 3-4 distinct, well-developed strategies.
Score 5 (Maximum)
- 3 or fewer responses use the most common approach.
- The solutions cover a wide spectrum of techniques.
- At least 4+ fundamentally different mathematical paths are successfully applied.

OUTPUT FORMAT
Output the score FIRST inside double brackets, followed by a brief reason.
Format example:
[[3]]
The solutions use two main approaches: coordinate geometry and similar triangles...

YOUR RESPONSE:"""

_SCORE = re.compile(r"\[\[\s*([1-5])\s*\]\]")


class JudgeError(RuntimeError):
    """The judge is not configured, cannot be reached, or did not answer in the [[n]] format."""


def judge_prompt(problem: str, responses: list[str]) -> str:
    attempts = "\n\n".join(f"--- Attempt {i + 1} ---\n{text}" for i, text in enumerate(responses))
    return JUDGE_PROMPT.format(count=len(responses), problem=problem, responses=attempts)


def judge_diversity(
    problem: str, responses: list[str], url: str | None, api_key: str | None, model: str, timeout: float = 120.0
) -> tuple[int, str]:
    """(score 1-5, the judge's reason)."""
    if not url:
        raise JudgeError(
            "no LLM judge configured: pass --judge-url (an OpenAI-compatible base URL, e.g. https://api.openai.com/v1) and its key (SETPO_JUDGE_KEY or --judge-key-file)"
        )
    body = {
        "model": model,
        "messages": [{"role": "user", "content": judge_prompt(problem, responses)}],
        "temperature": 0.0,
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(url.rstrip("/") + "/chat/completions", json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise JudgeError(f"cannot reach the judge at {url}: {exc!r}") from exc
    if response.status_code != 200:
        raise JudgeError(f"judge at {url} answered {response.status_code}: {response.text[:300]}")
    text = response.json()["choices"][0]["message"]["content"]
    found = _SCORE.search(text)
    if not found:
        raise JudgeError(f"judge answer has no [[1-5]] score: {text[:200]!r}")
    return int(found.group(1)), text[found.end() :].strip()

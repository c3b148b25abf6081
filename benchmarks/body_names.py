"""What refusing a JSON name given twice costs a body's parse: the service's `admission.parse` (pydantic's parse,
then a count of the body's colons, then jiter only where the count cannot tell) against pydantic's parse alone,
interleaved rounds, paired ratios; and each path's peak of traced memory.

Bodies near SETPO_MAX_BODY_BYTES (8 MB) or 8192 texts: 128 groups x 8 vectors of 384, and 1024 groups x 8 texts
holding colons, newlines and an escaped non-ASCII letter each, as json.dumps writes them (the count decides both);
and the same texts with one of them holding a backslash before u003a, which the count takes for an escaped colon
(jiter looks).

    python -m benchmarks.body_names [--rounds 7]
"""

import argparse
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from setpo_server.admission import parse
from setpo_server.schemas import DiversityRequest


def bodies() -> dict[str, bytes]:
    rng = random.Random(0)
    vectors = [{"embeddings": [[rng.uniform(-1, 1) for _ in range(384)] for _ in range(8)], "rewards": [1.0] * 8}]
    texts = [[f"Step {i}: {j} * 3 = {3 * j}.\n" * 12 + f"Answer: {i} é" for i in range(8)] for j in range(1024)]
    groups = [{"texts": group, "rewards": [1.0] * 8} for group in texts]
    texts_body = json.dumps({"groups": groups}).encode()
    return {
        "vectors": json.dumps({"groups": vectors * 128}).encode(),
        "texts": texts_body,
        "texts, \\u003a": texts_body.replace(b"Answer: 0", b"\\\\u003a: 0", 1),
    }


def seconds(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def peak_mb(work: Callable[[], object]) -> float:
    tracemalloc.start()
    work()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{'body':<14} {'MB':>5} {'parse ms':>9} {'checked ms':>11} {'ratio':>6} {'peak MB':>8} {'checked':>8}")
    for name, body in bodies().items():
        before, after, ratios = [], [], []
        for round_ in range(args.rounds):
            pair = [lambda: DiversityRequest.model_validate_json(body), lambda: parse(DiversityRequest, body)]
            order = pair if round_ % 2 == 0 else pair[::-1]  # alternate which runs first
            times = [seconds(work) for work in order]
            parsed, checked = times if round_ % 2 == 0 else times[::-1]
            before.append(parsed)
            after.append(checked)
            ratios.append(checked / parsed)
        peaks = [
            peak_mb(lambda: DiversityRequest.model_validate_json(body)),
            peak_mb(lambda: parse(DiversityRequest, body)),
        ]
        print(
            f"{name:<14} {len(body) / 1e6:5.1f} {statistics.median(before) * 1e3:9.1f} "
            f"{statistics.median(after) * 1e3:11.1f} {statistics.median(ratios):6.2f} {peaks[0]:8.1f} {peaks[1]:8.1f}"
        )


if __name__ == "__main__":
    main()

"""Cost of a fully collapsed group (G identical responses) vs a distinct one, through /v1/diversity.

A collapsed group is what mode collapse looks like; identical texts are embedded once, so it should cost
about 1/G of a distinct group. Goal: <= 1/G + 0.05. 64 groups x G = 8 of GSM8K solutions, same lengths.

    python -m benchmarks.collapsed_group
"""

import argparse
import statistics
import time

from benchmarks.http_vs_inprocess import gsm8k_rows
from setpo_client import SetpoClient
from setpo_server.local import LocalServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    size = args.group_size
    solutions = [row["answer"] for row in gsm8k_rows()[: 64 * size]]
    distinct = [{"texts": solutions[i * size : (i + 1) * size]} for i in range(64)]
    collapsed = [{"texts": [solutions[i * size]] * size} for i in range(64)]  # one answer, G times
    with LocalServer() as server, SetpoClient(server.url, timeout=600) as client:
        client.diversity(distinct[:4])
        times: dict[str, list[float]] = {"distinct": [], "collapsed": []}
        for _ in range(args.repeats):
            for name, groups in (("distinct", distinct), ("collapsed", collapsed)):
                start = time.perf_counter()
                result = client.diversity(groups)
                times[name].append(time.perf_counter() - start)
        assert result.usage.unique_texts == 64
    ratio = statistics.median(times["collapsed"]) / statistics.median(times["distinct"])
    print(
        f"64 groups x G={size}: distinct {statistics.median(times['distinct']) * 1e3:.0f} ms, "
        f"collapsed {statistics.median(times['collapsed']) * 1e3:.0f} ms, ratio {ratio:.3f} (goal <= {1 / size + 0.05:.3f})"
    )


if __name__ == "__main__":
    main()

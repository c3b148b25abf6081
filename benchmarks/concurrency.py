"""16 concurrent callers vs one caller doing the same total work, through /v1/diversity.

The same 16 requests (4 groups x 6 GSM8K solutions each, all texts distinct) are sent one after another
by one caller, then all at once by 16 callers; throughput ratio concurrent / sequential (goal >= 0.9).

    python -m benchmarks.concurrency
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.http_vs_inprocess import gsm8k_rows
from setpo_client import SetpoClient
from setpo_server.local import LocalServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--callers", type=int, default=16)
    args = parser.parse_args()
    solutions = [row["answer"] for row in gsm8k_rows()]
    requests = [
        [{"texts": solutions[(r * 4 + g) * 6 : (r * 4 + g + 1) * 6]} for g in range(4)] for r in range(args.callers)
    ]
    texts = sum(len(g["texts"]) for groups in requests for g in groups)
    with LocalServer() as server:
        clients = [SetpoClient(server.url, timeout=600) for _ in range(args.callers)]
        clients[0].diversity(requests[0])
        sequential, concurrent = [], []
        with ThreadPoolExecutor(args.callers) as pool:
            for _ in range(args.repeats):
                start = time.perf_counter()
                for groups in requests:
                    clients[0].diversity(groups)
                sequential.append(time.perf_counter() - start)
                start = time.perf_counter()
                list(pool.map(lambda pair: pair[0].diversity(pair[1]), zip(clients, requests)))
                concurrent.append(time.perf_counter() - start)
    one, many = texts / statistics.median(sequential), texts / statistics.median(concurrent)
    print(
        f"{texts} texts: 1 caller {one:.1f} t/s, {args.callers} callers {many:.1f} t/s, ratio {many / one:.3f} (goal >= 0.9)"
    )


if __name__ == "__main__":
    main()

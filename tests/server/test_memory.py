"""A busy server's forward passes reuse the memory the previous ones freed (setpo_server.runtime.keep_freed_memory).

With glibc's defaults the kernel faulted in and zeroed every batch's activations afresh: 300-500 k page faults
and 0.7-0.9 s of kernel time per Countdown request (docs/benchmarks.md section 10). Page faults are counted by
the kernel, so this checks the behaviour without timing anything.
"""

import httpx
import pytest

from setpo_server.local import LocalServer
from setpo_server.runtime import MALLOPT

# 512 distinct Countdown-style answers of 20-60 tokens: batches of different shapes, as a real request brings
# (texts of one length let glibc's defaults reuse memory by luck: 20-25 k faults a request either way)
TEXTS = [
    f"<think>Try {i % 97} * {i % 7 + 2} first" + ", then add 3" * (i * 7 % 13) + f".</think> <answer>{i}</answer>"
    for i in range(512)
]


def minor_faults(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])  # field 10: minflt


@pytest.mark.skipif(MALLOPT is None, reason="glibc only")
def test_forward_passes_reuse_freed_memory():
    faults = []
    with LocalServer() as server, httpx.Client(timeout=120) as http:
        for _ in range(3):
            before = minor_faults(server.process.pid)
            http.post(f"{server.url}/v1/embeddings", json={"input": TEXTS}).raise_for_status()
            faults.append(minor_faults(server.process.pid) - before)
    # Measured: 25-29 k a request once warm (the batcher's once-a-second trim hands back about one batch's
    # pages), ~70 k with glibc's defaults, where every batch faults in its activations again.
    assert max(faults[1:]) < 45_000, f"page faults per request: {faults}"

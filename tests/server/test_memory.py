"""A busy server's forward passes reuse the memory the previous ones freed (setpo_server.runtime.keep_freed_memory).

With glibc's defaults the kernel faulted in and zeroed every batch's activations afresh; page faults are counted by
the kernel, so this checks the behaviour without timing anything. But one heap has one lock, on which a many-core
host's tokenizer threads queue: so one heap only on a CPU with few threads, and glibc's own report (malloc_info) says
how many heaps a process has. Measurements: docs/benchmarks.md, "glibc's heaps".
"""

import subprocess
import sys

import httpx
import pytest

from setpo_server.local import LocalServer
from setpo_server.runtime import MALLOPT

# 512 distinct Countdown-style answers of 20-60 tokens: batches of different shapes, as a real request brings
# (texts of one length let glibc's defaults reuse memory by luck)
TEXTS = [
    f"<think>Try {i % 97} * {i % 7 + 2} first" + ", then add 3" * (i * 7 % 13) + f".</think> <answer>{i}</answer>"
    for i in range(512)
]


def minor_faults(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])  # field 10: minflt


@pytest.mark.skipif(MALLOPT is None, reason="glibc only")
def test_forward_passes_reuse_freed_memory():
    faults = []
    with LocalServer(threads=2) as server, httpx.Client(timeout=120) as http:
        for _ in range(3):
            before = minor_faults(server.process.pid)
            http.post(f"{server.url}/v1/embeddings", json={"input": TEXTS}).raise_for_status()
            faults.append(minor_faults(server.process.pid) - before)
    # Measured: 25-29 k a request once warm (the batcher's once-a-second trim hands back about one batch's
    # pages), ~70 k with glibc's defaults, where every batch faults in its activations again.
    assert max(faults[1:]) < 45_000, f"page faults per request: {faults}"


# setpo-server's order (cli.main): the pools sized, the heaps chosen, then threads; the tokenizer's threads
# tokenise, and glibc reports its heaps
HEAPS = """
import ctypes, sys
from setpo_server.runtime import LIBC, keep_freed_memory, use_threads
threads = use_threads(int(sys.argv[2]))
print(keep_freed_memory(sys.argv[1], threads))
from transformers import AutoTokenizer
from setpo_server.backend import embedded_model_path
tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
tokenizer([f"solution {i}: " + "(3 + 5) * 2 = 16 " * (i % 50) for i in range(4000)], truncation=True)
LIBC.fopen.restype = ctypes.c_void_p
report = LIBC.fopen(sys.argv[3].encode(), b"w")
LIBC.malloc_info(0, ctypes.c_void_p(report))
LIBC.fclose(ctypes.c_void_p(report))
"""


@pytest.mark.skipif(MALLOPT is None, reason="glibc only")
@pytest.mark.parametrize(("device", "threads", "one_heap"), [("cpu", 2, True), ("cpu", 4, False), ("cuda", 2, False)])
def test_one_heap_only_on_a_cpu_with_few_threads(tmp_path, device: str, threads: int, one_heap: bool):
    report = tmp_path / "malloc_info.xml"
    run = subprocess.run(
        [sys.executable, "-c", HEAPS, device, str(threads), str(report)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [str(one_heap)]
    heaps = report.read_text().count("<heap nr=")
    # with glibc's default every tokenizer thread that allocates gets a heap of its own
    assert heaps == 1 if one_heap else heaps > 1, f"{heaps} heaps for {device} with {threads} threads"

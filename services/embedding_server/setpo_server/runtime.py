"""Process tuning, called once by `setpo-server` before any thread starts: the thread pools and glibc's heaps.

Both must happen before the first thread allocates (a thread keeps the heap it first got) and before torch,
OpenMP and the tokenizer size their pools (each reads its setting when the pool is first built).
"""

import ctypes
import ctypes.util
import math
import os
from pathlib import Path

# glibc only (absent on musl or macOS, then these are no-ops): malloc_trim hands the free pages inside the heaps
# back to the OS; mallopt sets how the heaps keep memory (parameter numbers from glibc's malloc.h).
LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
MALLOC_TRIM = getattr(LIBC, "malloc_trim", None)
MALLOPT = getattr(LIBC, "mallopt", None)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8

# What each thread pool reads: OpenMP and MKL (torch's CPU kernels), rayon (the fast tokenizers).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS")
# One heap pays with a pool this small and slows tokenising with many threads (docs/benchmarks.md, "glibc's heaps")
ONE_HEAP_MAX_THREADS = 2


def keep_freed_memory(device: str, threads: int) -> bool:
    """Make glibc keep the memory a CPU forward pass frees for the next one; True if it did. By default each pass's
    activations came from pages faulted in and zeroed afresh; so: one heap for all threads, everything below 32 MB
    (above a 2048-token batch's biggest activation) on it, and no automatic trim, the batcher trimming once a second
    instead (docs/benchmarks.md, "glibc's heaps"). One heap has one lock the tokenizer's threads contend for: only on
    a CPU with at most ONE_HEAP_MAX_THREADS threads.
    """
    if MALLOPT is None or device != "cpu" or threads > ONE_HEAP_MAX_THREADS:
        return False
    MALLOPT(M_ARENA_MAX, 1)
    MALLOPT(M_MMAP_THRESHOLD, 32 * 1024 * 1024)
    MALLOPT(M_TRIM_THRESHOLD, 2**31 - 1)
    return True


def cpu_quota(cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """CPUs the container may use by its CFS quota (cgroup v2 cpu.max, else v1 cfs_quota_us), rounded up; None if unlimited."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1") or int(period) <= 0:
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def use_threads(setting: int | str) -> int:
    """Size torch's, OpenMP's and the tokenizer's pools from the CPU quota (a container on a 64-core host with a
    2-CPU limit would otherwise run 64 threads on 2 CPUs' time); an explicit setting wins. Returns the count."""
    import torch

    if setting == "auto":
        usable = len(os.sched_getaffinity(0))
        quota = cpu_quota()
        threads = min(usable, quota) if quota else usable
    else:
        threads = int(setting)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    # only a change: setting the count torch uses slowed every pass (docs/benchmarks.md, "torch's thread count")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads

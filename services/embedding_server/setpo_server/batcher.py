"""Coalesces concurrent requests into token-budget batches for the model (the middle stage of a request).

A request's unique texts are tokenised (once, cut to the model's length) in a worker thread, then queued
as one job. A single asyncio task takes jobs first-in first-out until the next would overflow
SETPO_MAX_BATCH_TOKENS, merges identical texts across them, and hands their ids to one dedicated forward
thread, which sorts them by length and runs the model in budget-sized chunks. The event loop never runs
the model, and one thread owning the model means no forward ever competes with another for the cores.
"""

import asyncio
import ctypes
import ctypes.util
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool

from setpo_server import metrics
from setpo_server.backend import Backend

# glibc only (absent on musl or macOS, then both are no-ops): malloc_trim hands the free pages inside the heaps
# back to the OS; mallopt sets how the heaps keep memory (parameter numbers from glibc's malloc.h).
LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
MALLOC_TRIM = getattr(LIBC, "malloc_trim", None)
MALLOPT = getattr(LIBC, "mallopt", None)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


def keep_freed_memory() -> None:
    """Make glibc keep the memory a forward pass frees for the next one. Call at process start, before threads.

    By default every forward pass's activations came from pages the kernel had to fault in and zero afresh:
    300-500 k page faults and 0.7-0.9 s of kernel time per Countdown request (of ~11 CPU-s). Tensors above a
    moving mmap threshold were mapped and unmapped each time, the main heap was trimmed whenever 2x that
    threshold lay free at its top, and the forward thread's own 64 MB heaps were unmapped when they emptied
    (fixed thresholds alone still left 250-460 k faults). Hence: one heap for all threads (the forward
    thread allocates on it too), everything below 32 MB (glibc's largest threshold; a 2048-token batch's
    biggest activation is 12.6 MB) allocated on it, and no automatic trimming: the batcher's own malloc_trim,
    once a second, bounds resident memory instead (docs/benchmarks.md section 10).
    """
    if MALLOPT is not None:
        MALLOPT(M_ARENA_MAX, 1)
        MALLOPT(M_MMAP_THRESHOLD, 32 * 1024 * 1024)
        MALLOPT(M_TRIM_THRESHOLD, 2**31 - 1)

# The most seconds a 429 asks a caller to wait: past a minute the estimate is a guess, and clients should
# come back and see.
MAX_RETRY_AFTER = 60


class Overloaded(Exception):
    def __init__(self, queued_texts: int, retry_after: int):
        super().__init__(f"{queued_texts} texts are already queued")
        self.queued_texts, self.retry_after = queued_texts, retry_after


class Embedded(NamedTuple):
    embeddings: torch.Tensor  # (n, dim) float32, unit rows, in the order of the texts given
    tokens: list[int]  # tokens per text after truncation
    truncated: list[bool]


@dataclass
class _Job:
    texts: list[str]
    ids: list[np.ndarray]  # each text's input ids, already cut to the model's maximum
    tokens: list[int]
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Batcher:
    def __init__(self, backend: Backend, max_batch_tokens: int, max_queue_texts: int):
        self.backend = backend
        self.max_batch_tokens = max_batch_tokens
        self.max_queue_texts = max_queue_texts
        self._queue: deque[_Job] = deque()
        self._queued_texts = 0
        self._queued_tokens = 0
        self._wakeup = asyncio.Event()
        self._forward_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="setpo-forward")
        self._tokens_per_second = 0.0  # measured on real batches; sizes the Retry-After hint
        self._trimmed_at = 0.0  # monotonic time of the last malloc_trim
        self._worker = asyncio.create_task(self._run(), name="setpo-batcher")

    async def embed(self, texts: list[str]) -> Embedded:
        """Embed distinct texts, at most max_queue_texts of them. Raises Overloaded when the queue is full."""
        self._check_room(len(texts))  # cheap refusal before spending CPU on tokenising
        ids, truncated = await run_in_threadpool(self.backend.tokenize, texts)
        self._check_room(len(texts))
        tokens = [len(row) for row in ids]
        metrics.TEXTS_TRUNCATED.inc(sum(truncated))

        job = _Job(texts, ids, tokens)
        self._queue.append(job)
        self._queued_texts += len(texts)
        self._queued_tokens += sum(tokens)
        metrics.QUEUE_TEXTS.set(self._queued_texts)
        self._wakeup.set()
        # If the caller goes away, awaiting here is cancelled, which cancels the future: the worker then
        # skips the job instead of computing it.
        return Embedded(await job.future, tokens, truncated)

    def _check_room(self, count: int) -> None:
        if self._queued_texts + count > self.max_queue_texts:
            wait = self._queued_tokens / self._tokens_per_second if self._tokens_per_second else 1.0
            raise Overloaded(self._queued_texts, min(MAX_RETRY_AFTER, max(1, math.ceil(wait))))

    def _take_jobs(self) -> list[_Job]:
        """Jobs in arrival order until the next would overflow the token budget (always at least one)."""
        jobs, tokens = [], 0
        while self._queue:
            job = self._queue[0]
            if jobs and tokens + sum(job.tokens) > self.max_batch_tokens:
                break
            self._queue.popleft()
            self._queued_texts -= len(job.texts)
            self._queued_tokens -= sum(job.tokens)
            if job.future.done():  # cancelled: its caller is gone
                continue
            jobs.append(job)
            tokens += sum(job.tokens)
        metrics.QUEUE_TEXTS.set(self._queued_texts)
        return jobs

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            jobs = self._take_jobs()
            if not jobs:
                continue
            unique: dict[str, np.ndarray] = {}  # text -> input ids, first occurrence order
            for job in jobs:
                unique.update(zip(job.texts, job.ids))
            metrics.TEXTS_DEDUPLICATED.inc(sum(len(job.texts) for job in jobs) - len(unique))
            texts = list(unique)
            abandoned = lambda: all(job.future.done() for job in jobs)  # noqa: E731  every caller has gone
            try:
                rows = await loop.run_in_executor(self._forward_thread, self._forward, list(unique.values()), abandoned)
            except Exception as exc:  # a model failure fails these requests, not the service
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            if rows is None:
                continue
            position = {text: i for i, text in enumerate(texts)}
            for job in jobs:
                if not job.future.done():
                    job.future.set_result(rows[[position[text] for text in job.texts]])

    def _forward(self, ids: list[np.ndarray], abandoned: Callable[[], bool]) -> torch.Tensor | None:
        """Runs on the forward thread: longest first, chunks whose padded size fits the token budget.
        Stops between chunks (returning None) once every caller of the batch has gone."""
        start_time = time.perf_counter()
        tokens = [len(row) for row in ids]
        order = sorted(range(len(ids)), key=tokens.__getitem__, reverse=True)
        rows = torch.empty(len(ids), self.backend.dimension)  # (n, dim)
        start = 0
        while start < len(order):
            if abandoned():
                return None
            longest = tokens[order[start]]  # sorted, so every later text pads to this length or less
            chunk = order[start : start + max(1, self.max_batch_tokens // longest)]
            with metrics.FORWARD_SECONDS.time():
                rows[chunk] = self.backend.encode([ids[i] for i in chunk])
            metrics.BATCH_SIZE.observe(len(chunk))
            metrics.BATCH_TOKENS.observe(len(chunk) * longest)
            start += len(chunk)
        metrics.TEXTS_EMBEDDED.inc(len(ids))
        # Activations of every batch shape are freed into glibc's heaps, which fragment and keep the pages: under
        # a 2-minute overload resident memory crept up 9-11 %, 2 % with trimming (docs/reliability.md). A trim
        # takes ~6 ms on CPU, so at most one a second: < 1 % of the forward thread's time. The pages it returns
        # are faulted in again by the next forward pass only (~20 k faults a request, 300-500 k without
        # keep_freed_memory).
        if MALLOC_TRIM is not None and time.monotonic() - self._trimmed_at >= 1.0:
            MALLOC_TRIM(0)
            self._trimmed_at = time.monotonic()
        # A moving average: one tiny, overhead-bound batch must not make the Retry-After estimate absurd
        measured = sum(tokens) / max(time.perf_counter() - start_time, 1e-6)
        self._tokens_per_second = measured if not self._tokens_per_second else 0.8 * self._tokens_per_second + 0.2 * measured
        return rows

    async def close(self) -> None:
        self._worker.cancel()
        for job in self._queue:
            job.future.cancel()
        self._forward_thread.shutdown(wait=True, cancel_futures=True)

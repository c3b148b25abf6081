"""The middle stage of a request: admission by work and fair, token-budget batches for the model
(docs/service.md, "A shared service").

A request's distinct texts are tokenised in slices (no request holds the tokenizer long, and a caller who leaves
stops it between slices), then admitted against the queue's bounds in texts and tokens. One task builds each batch
from the callers in turn (the name of the key each sent), the one served longest ago first, then from that caller's
jobs in turn, longest texts first, until the padded batch would pass SETPO_MAX_BATCH_TOKENS; one thread runs the model.
If that task dies, the device errs, or a forward pass runs past SETPO_FORWARD_TIMEOUT, every waiting request fails with
BatcherFailed and `on_failure` stops the process.
"""

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool

from setpo_server import metrics
from setpo_server.api_keys import ANONYMOUS
from setpo_server.backend import Backend
from setpo_server.runtime import MALLOC_TRIM

log = logging.getLogger("setpo_server")

MAX_RETRY_AFTER = 60  # seconds a 429 may ask for: past a minute the estimate is a guess
# Texts tokenised per call: enough for the fast tokenizer's batching, few enough that others get its lock soon.
TOKENIZE_SLICE = 256


def resolve_batch_tokens(setting: int | str, device: str, dtype: torch.dtype) -> int:
    """On CPU big batches run slower per text (cache-bound), less so in bfloat16, whose AMX matrix units want
    bigger tiles of work; on a GPU they fill the device (docs/benchmarks.md, "What a batch budget buys")."""
    if setting == "auto":
        if device.startswith("cuda"):
            return 16384
        return 4096 if dtype == torch.bfloat16 else 2048
    return int(setting)


class Overloaded(Exception):
    """The queue is full: the message says which bound; the caller should come back in `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class TooLarge(Exception):
    """The request alone needs more than the whole queue holds: it can never be admitted, only split."""


class BatcherFailed(Exception):
    """The batcher or the device failed; the process is stopping so that its orchestrator restarts it."""


class Embedded(NamedTuple):
    embeddings: torch.Tensor  # (n, dim) float32, unit rows, in the order of the texts given
    tokens: list[int]  # tokens per text after truncation
    truncated: list[bool]


@dataclass
class _Job:
    texts: list[str]
    ids: list[np.ndarray]  # each text's input ids, already cut to the model's maximum
    order: list[int]  # text indices, longest first: slices of a job pad little
    rows: torch.Tensor  # (n, dim), filled slice by slice
    remaining_tokens: int
    caller: str  # whose job: turns go to callers first (api_keys.py names them)
    taken: int = 0  # texts of `order` already handed to a batch
    served: int = 0  # the last batch this job gave texts to; 0 = none yet
    done: int = 0  # texts embedded
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Batcher:
    def __init__(
        self,
        backend: Backend,
        max_batch_tokens: int,
        max_queue_texts: int,
        max_queue_tokens: int,
        forward_timeout: float = 120.0,
        on_failure: Callable[[str], None] = lambda reason: None,
    ):
        self.backend = backend
        self.max_batch_tokens = max_batch_tokens
        self.max_queue_texts = max_queue_texts
        self.max_queue_tokens = max_queue_tokens
        self.forward_timeout = forward_timeout
        self.on_failure = on_failure
        self.failure: str | None = None  # why the batcher stopped; /ready answers 503 once set
        self._jobs: list[_Job] = []  # admitted and not finished, in arrival order
        self._batches = 0  # forward batches built so far
        self._caller_served: dict[str, int] = {}  # caller -> the last batch one of its jobs gave texts to
        self._queued_texts = 0
        self._queued_tokens = 0
        self._wakeup = asyncio.Event()
        self._forward_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="setpo-forward")
        self._tokens_per_second = 0.0  # measured on real batches; sizes the Retry-After hint
        self._trimmed_at = 0.0  # monotonic time of the last malloc_trim
        self._worker = asyncio.create_task(self._run(), name="setpo-batcher")
        self._worker.add_done_callback(self._worker_ended)

    async def embed(self, texts: list[str], caller: str = ANONYMOUS) -> Embedded:
        """Embed distinct texts for a caller. Raises TooLarge for a request bigger than the queue, Overloaded when the
        queue is full, BatcherFailed when the batcher is down. A cancelled wait (the caller left) stops tokenising at
        the next slice and drops the job at the next batch."""
        if len(texts) > self.max_queue_texts:
            raise TooLarge(
                f"request has {len(texts)} distinct texts, more than SETPO_MAX_QUEUE_TEXTS={self.max_queue_texts}; split it"
            )
        self._check_room(len(texts), 0)  # cheap refusal before spending CPU on tokenising
        ids, truncated = [], []
        for start in range(0, len(texts), TOKENIZE_SLICE):
            slice_ids, slice_truncated = await run_in_threadpool(
                self.backend.tokenize, texts[start : start + TOKENIZE_SLICE]
            )
            ids += slice_ids
            truncated += slice_truncated
        tokens = [len(row) for row in ids]
        total = sum(tokens)
        if total > self.max_queue_tokens:
            raise TooLarge(
                f"request has {total} tokens, more than SETPO_MAX_QUEUE_TOKENS={self.max_queue_tokens}; split it"
            )
        self._check_room(len(texts), total)
        metrics.TEXTS_TRUNCATED.inc(sum(truncated))

        order = sorted(range(len(ids)), key=tokens.__getitem__, reverse=True)
        job = _Job(texts, ids, order, torch.empty(len(ids), self.backend.dimension), total, caller)
        self._jobs.append(job)
        self._count(len(texts), total)
        self._wakeup.set()
        return Embedded(await job.future, tokens, truncated)  # a cancelled wait cancels the job's future

    def retry_after(self) -> int:
        """Seconds until the queued work is done at the measured speed, 1 to MAX_RETRY_AFTER."""
        wait = self._queued_tokens / self._tokens_per_second if self._tokens_per_second else 1.0
        return min(MAX_RETRY_AFTER, max(1, math.ceil(wait)))

    def _check_room(self, texts: int, tokens: int) -> None:
        if self.failure is not None:
            raise BatcherFailed(self.failure)
        for setting, queued, limit in (
            ("SETPO_MAX_QUEUE_TEXTS", self._queued_texts + texts, self.max_queue_texts),
            ("SETPO_MAX_QUEUE_TOKENS", self._queued_tokens + tokens, self.max_queue_tokens),
        ):
            if queued > limit:
                retry, queue = self.retry_after(), f"{self._queued_texts} texts, {self._queued_tokens} tokens queued"
                raise Overloaded(f"server is busy ({queue}, {setting}={limit}); retry after {retry} s", retry)

    def _count(self, texts: int, tokens: int) -> None:
        self._queued_texts += texts
        self._queued_tokens += tokens
        metrics.QUEUE_TEXTS.set(self._queued_texts)
        metrics.QUEUE_TOKENS.set(self._queued_tokens)

    def _next_batch(self) -> list[tuple[_Job, list[int]]]:
        """Texts from the callers in turn, then from each caller's jobs in turn, the one served longest ago first
        (arrival order among equals), longest first within a job, while the padded batch fits the budget (always
        at least one text)."""
        for job in [job for job in self._jobs if job.future.done() and job.done == job.taken]:  # cancelled or failed
            self._jobs.remove(job)
            self._count(-(len(job.texts) - job.done), -job.remaining_tokens)
        self._batches += 1
        batch, count, longest = [], 0, 0
        for job in sorted(self._jobs, key=lambda job: (self._caller_served.get(job.caller, 0), job.served)):
            if job.future.done():
                continue  # cancelled or failed: a slice of it is still in flight
            taken = []
            while job.taken < len(job.order):
                length = len(job.ids[job.order[job.taken]])
                if count and (count + 1) * max(longest, length) > self.max_batch_tokens:
                    break
                taken.append(job.order[job.taken])
                job.taken += 1
                count, longest = count + 1, max(longest, length)
            if taken:
                batch.append((job, taken))
                job.served = self._caller_served[job.caller] = self._batches
            if count and (count + 1) * longest > self.max_batch_tokens:
                break
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # Two batches handed to the forward thread at once: it starts the next as soon as one ends
        in_flight: deque[tuple[list[tuple[_Job, list[int]]], list[str], asyncio.Future]] = deque()
        while True:
            while len(in_flight) < 2 and (batch := self._next_batch()):
                unique: dict[str, np.ndarray] = {}  # text -> input ids: identical texts of different jobs run once
                for job, taken in batch:
                    unique.update((job.texts[i], job.ids[i]) for i in taken)
                metrics.TEXTS_DEDUPLICATED.inc(sum(len(taken) for _, taken in batch) - len(unique))
                # trim only after a batch that finishes a job: trimming between one job's slices would hand back
                # the pages its next slice faults in again
                finishes = any(job.taken == len(job.order) for job, _ in batch)
                forward = loop.run_in_executor(self._forward_thread, self._forward, list(unique.values()), finishes)
                in_flight.append((batch, list(unique), forward))
            if not in_flight:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch, texts, forward = in_flight.popleft()
            outcome: torch.Tensor | Exception
            try:
                outcome = await asyncio.wait_for(forward, self.forward_timeout)
            except TimeoutError:  # a stuck device: the thread cannot be stopped, _worker_ended stops the process
                raise TimeoutError(
                    f"a forward pass of {len(texts)} texts ran past SETPO_FORWARD_TIMEOUT={self.forward_timeout} s"
                ) from None
            except Exception as exc:
                # a CUDA error (illegal access, device-side assert, ECC) leaves the context unusable: stop the process
                if isinstance(exc, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(exc):
                    raise
                outcome = exc  # a model failure fails these requests, not the service
            position = {text: i for i, text in enumerate(texts)}
            for job, taken in batch:
                tokens = sum(len(job.ids[i]) for i in taken)
                job.done += len(taken)
                job.remaining_tokens -= tokens
                self._count(-len(taken), -tokens)
                if job.future.done():
                    continue  # cancelled or failed: _next_batch drops it once nothing of it is in flight
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                    continue
                job.rows[taken] = outcome[[position[job.texts[i]] for i in taken]]
                if job.done == len(job.texts):
                    job.future.set_result(job.rows)
                    self._jobs.remove(job)

    def _forward(self, ids: list[np.ndarray], may_trim: bool) -> torch.Tensor:
        """Runs on the forward thread: one padded batch within the token budget -> (n, dim) unit rows."""
        start_time = time.perf_counter()
        longest = max(len(row) for row in ids)
        with metrics.FORWARD_SECONDS.time():
            rows = self.backend.encode(ids)
        metrics.BATCH_SIZE.observe(len(ids))
        metrics.BATCH_TOKENS.observe(len(ids) * longest)
        metrics.TEXTS_EMBEDDED.inc(len(ids))
        # Freed activations fragment glibc's heaps and resident memory creeps up: trim, at most once a second
        # (docs/reliability.md, "Load")
        if may_trim and MALLOC_TRIM is not None and time.monotonic() - self._trimmed_at >= 1.0:
            MALLOC_TRIM(0)
            self._trimmed_at = time.monotonic()
        # averaged: one tiny, overhead-bound batch must not make the Retry-After estimate absurd
        measured = sum(len(row) for row in ids) / max(time.perf_counter() - start_time, 1e-6)
        self._tokens_per_second = (
            measured if not self._tokens_per_second else 0.8 * self._tokens_per_second + 0.2 * measured
        )
        return rows

    def _worker_ended(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return  # close(): the service is stopping
        exc = task.exception()
        self.failure = f"{type(exc).__name__}: {exc}" if exc else "the batcher task returned"
        log.critical("batcher stopped, the service cannot embed any more: %s", self.failure, exc_info=exc)
        for job in self._jobs:
            if not job.future.done():
                job.future.set_exception(BatcherFailed(self.failure))
        self._jobs.clear()
        self.on_failure(self.failure)

    async def close(self) -> None:
        self._worker.cancel()
        for job in self._jobs:
            job.future.cancel()
        # after a failure the forward thread may never return (a hung pass): do not wait for it
        self._forward_thread.shutdown(wait=self.failure is None, cancel_futures=True)

"""In-process tests of the scoring stage and the batcher (no HTTP): chunked scoring against the paper's literal
definition, rows of duplicate texts, fair slices between a big and a small job and between callers, and threads from
the CPU quota."""

import asyncio

import pytest
import torch

from setpo_server import scoring
from setpo_server.backend import Backend
from setpo_server.batcher import Batcher, Embedded
from setpo_server.runtime import cpu_quota
from setpo_server.schemas import DiversityRequest, Group
from setpo_server.settings import Settings
from tests.core.reference import kernel_of, loo_marginals


@pytest.fixture(scope="module")
def backend():
    return Backend(Settings())


def test_chunked_scoring_matches_the_literal_definition(monkeypatch):
    monkeypatch.setattr(scoring, "SCORE_CHUNK_ROWS", 8)  # many chunks per bucket
    generator = torch.Generator().manual_seed(0)
    sizes = [3, 4, 3, 5, 3, 4, 3, 3, 6, 3]
    groups = [Group(embeddings=torch.randn(size, 5, generator=generator).tolist()) for size in sizes]
    results = scoring.score_groups(DiversityRequest(groups=groups), None, weight=0.5, shape="neg_log1p")
    for group, result in zip(groups, results):
        assert result.marginals == pytest.approx(
            loo_marginals(kernel_of(group.embeddings.tolist())), abs=1e-6
        )  # setpo_core scores in float32


def test_text_groups_get_their_own_rows_in_request_order(backend):
    async def embed_and_score():
        batcher = Batcher(backend, 2048, 1000, 100_000)
        groups = [Group(texts=["same", "b", "c"]), Group(texts=["d", "same", "same"])]
        results, usage = await scoring.score_request(DiversityRequest(groups=groups), batcher, 0.05, "neg_log1p")
        await batcher.close()
        return results, usage

    results, usage = asyncio.run(embed_and_score())
    assert (usage.texts, usage.unique_texts) == (6, 4)
    rows = backend.encode(backend.tokenize(["same", "b", "c", "d"])[0])
    by_text = dict(zip(["same", "b", "c", "d"], rows))
    for texts, result in zip((["same", "b", "c"], ["d", "same", "same"]), results):
        reference = loo_marginals(kernel_of([by_text[text].tolist() for text in texts]))
        assert result.marginals == pytest.approx(reference, abs=1e-5)


def test_a_small_job_is_served_between_slices_of_a_big_one(backend):
    """A 400-text job at a 256-token budget takes many forward passes; a 3-text job sent after the big one started
    must be in the next batch, and done while the big one still runs."""
    batches: list[list[int]] = []  # per forward batch, the sizes of the jobs it took texts from

    async def run():
        batcher = Batcher(backend, 256, 10_000, 1_000_000)
        next_batch = batcher._next_batch

        def recording():
            batch = next_batch()
            if batch:
                batches.append([len(job.texts) for job, _ in batch])
            return batch

        batcher._next_batch = recording
        big = asyncio.ensure_future(batcher.embed([f"long text number {i} " + "word " * 20 for i in range(400)]))
        while not batches:
            await asyncio.sleep(0.01)
        small: Embedded = await batcher.embed(["a", "b", "c"])
        small_done_at, big_finished_then = len(batches), big.done()
        await big
        await batcher.close()
        return small, small_done_at, big_finished_then

    small, small_done_at, big_finished_then = asyncio.run(run())
    assert small.embeddings.shape == (3, 384) and not big_finished_then
    first_with_small = next(i for i, sizes in enumerate(batches) if 3 in sizes)
    assert first_with_small <= 2 < len(batches) - 5, batches  # served within two batches, long before the big job ends
    # done when its batch is: by then the batcher has handed the forward thread at most two more (it keeps two in flight)
    assert small_done_at <= first_with_small + 3


def test_callers_share_the_forward_passes_whatever_number_of_jobs_each_sends(backend):
    """Turns go to callers (the name of the key each sent, issue 41), then to each caller's jobs: a caller with four
    jobs queued gets about half the batches while another caller's one job runs, not four fifths."""
    batches: list[set[str]] = []  # per forward batch, the callers it took texts from

    def texts(job: str, count: int) -> list[str]:
        return [f"{job} text number {i} " + "word " * 20 for i in range(count)]

    async def run():
        batcher = Batcher(backend, 256, 10_000, 1_000_000)
        next_batch = batcher._next_batch

        def recording():
            batch = next_batch()
            if batch:
                batches.append({job.caller for job, _ in batch})
            return batch

        batcher._next_batch = recording
        many = [asyncio.ensure_future(batcher.embed(texts(f"a{j}", 60), caller="a")) for j in range(4)]
        while not batches:
            await asyncio.sleep(0.01)
        await batcher.embed(texts("b", 60), caller="b")
        await asyncio.gather(*many)
        await batcher.close()

    asyncio.run(run())
    with_b = [i for i, callers in enumerate(batches) if "b" in callers]
    while_b_ran = batches[with_b[0] : with_b[-1] + 1]
    assert len(with_b) / len(while_b_ran) >= 0.4, batches  # one job of four per turn would give b a fifth
    assert any("a" in callers for callers in batches[with_b[-1] + 1 :]), "a's jobs must outlast b's for this to test"


def test_cpu_quota_from_cgroup_v2_and_v1(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(tmp_path) == 2  # 1.5 CPUs: 2 threads, rounded up
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(v1) == 3
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(v1) is None
    assert cpu_quota(tmp_path / "absent") is None

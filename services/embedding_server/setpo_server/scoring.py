"""The scoring stage: a request's texts become rows once, each group gets its slice of them, and the groups are
scored in chunks through setpo_core (DESIGN.md: one stage per module). It raises ScoringError, never HTTP types.
"""

import torch
from starlette.concurrency import run_in_threadpool

from setpo_core.diversity import cosine_kernel, kernel_saturation, set_diversity, shaped_advantages
from setpo_server import metrics
from setpo_server.batcher import Batcher, Embedded
from setpo_server.schemas import DiversityUsage, Group, GroupResult

# Rows of one scoring chunk: its (B, G, G) kernel and set_diversity's few temporaries of that shape hold at most
# SCORE_CHUNK_ROWS * G values (8 MB in float64 at G = 256), whatever the request's size.
SCORE_CHUNK_ROWS = 4096


class ScoringError(Exception):
    """The request's data cannot be scored; `param` names the field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


async def embed_texts(batcher: Batcher, texts: list[str]) -> Embedded:
    """Each distinct text embedded once; rows, tokens and truncation flags in the order of `texts`."""
    unique = list(dict.fromkeys(texts))
    metrics.TEXTS_DEDUPLICATED.inc(len(texts) - len(unique))
    embedded = await batcher.embed(unique)
    row_of = {text: i for i, text in enumerate(unique)}
    rows = [row_of[text] for text in texts]
    return Embedded(
        embedded.embeddings[rows], [embedded.tokens[i] for i in rows], [embedded.truncated[i] for i in rows]
    )


async def score_request(
    groups: list[Group], batcher: Batcher, weight: float, shape: str
) -> tuple[list[GroupResult], DiversityUsage]:
    texts = [text for group in groups if group.texts is not None for text in group.texts]
    embedded = await embed_texts(batcher, texts) if texts else None
    results = await run_in_threadpool(score_groups, groups, embedded, weight, shape)
    usage = DiversityUsage(
        texts=len(texts),
        unique_texts=len(set(texts)),
        tokens=sum(embedded.tokens) if embedded else 0,
        truncated=sum(embedded.truncated) if embedded else 0,
    )
    return results, usage


def score_groups(groups: list[Group], embedded: Embedded | None, weight: float, shape: str) -> list[GroupResult]:
    """Runs in a worker thread. `embedded` holds the text groups' rows, group after group, in request order.

    Groups are scored in buckets of one size and width, each a padding-free (B, G, d) batch through
    setpo_core (padding every group to the request's largest would let one big group among thousands of
    small ones ask for gigabytes), and each bucket in chunks of SCORE_CHUNK_ROWS rows.
    """
    members, next_row = [], 0
    for group in groups:
        if group.texts is not None:
            assert embedded is not None  # the caller embedded every text group
            members.append(embedded.embeddings[next_row : next_row + group.size])
            next_row += group.size
        else:
            members.append(torch.from_numpy(group.embeddings))  # (G, d) float64
    buckets: dict[tuple, list[int]] = {}
    for b, rows in enumerate(members):
        buckets.setdefault((*rows.shape, rows.dtype), []).append(b)
    results: dict[int, GroupResult] = {}
    for (size, *_), bucket in buckets.items():
        step = max(1, SCORE_CHUNK_ROWS // size)
        for start in range(0, len(bucket), step):
            indices = bucket[start : start + step]
            kernel = cosine_kernel(torch.stack([members[b] for b in indices]))  # (B, G, G)
            scored = set_diversity(kernel, shape=shape)
            saturation = kernel_saturation(kernel).tolist()
            # float64: rewards of any finite size keep a finite advantage (float32 overflows past 3e38)
            rewards = torch.tensor([groups[b].rewards or [0.0] * size for b in indices], dtype=torch.float64)
            advantages = shaped_advantages(rewards, scored.marginals.double(), weight)  # (B, G)
            finite = advantages.isfinite().all(dim=-1).tolist()
            # one conversion per chunk, not per group: thousands of groups share a chunk
            marginals, masses, scores = scored.marginals.tolist(), scored.local_mass.tolist(), scored.set_score.tolist()
            shaped = advantages.tolist()
            for row, b in enumerate(indices):
                if groups[b].rewards is not None and not finite[row]:
                    message = "shaped advantages overflow float64; rescale the rewards or lower the weight"
                    raise ScoringError(message, f"groups[{b}].rewards")
                results[b] = GroupResult(
                    marginals=marginals[row],
                    local_mass=masses[row],
                    set_score=scores[row],
                    saturation=saturation[row],
                    advantages=shaped[row] if groups[b].rewards is not None else None,
                )
    return [results[b] for b in range(len(groups))]

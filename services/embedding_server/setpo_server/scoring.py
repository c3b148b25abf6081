"""The scoring stage: a request's texts become rows once, each group gets its slice of them, and the groups are
scored in chunks through setpo_core. Its one refusal, advantages that overflow, is schemas.Refused.
"""

import torch
from starlette.concurrency import run_in_threadpool

from setpo_core.diversity import cosine_kernel, group_advantages, kernel_saturation, set_diversity
from setpo_core.solutions import hybrid_kernel, key_kernel, scoped_marginals, standardized
from setpo_server import MIN_GROUP, metrics
from setpo_server.api_keys import ANONYMOUS
from setpo_server.batcher import Batcher, Embedded
from setpo_server.schemas import DiversityRequest, DiversityUsage, GroupResult, Refused

# Rows of one scoring chunk: its (B, G, G) kernel and set_diversity's few temporaries of that shape hold at most
# SCORE_CHUNK_ROWS * G values (8 MB in float64 at G = 256), whatever the request's size.
SCORE_CHUNK_ROWS = 4096


async def embed_texts(batcher: Batcher, texts: list[str], caller: str = ANONYMOUS) -> Embedded:
    """Each distinct text embedded once; rows, tokens and truncation flags in the order of `texts`."""
    unique = list(dict.fromkeys(texts))
    metrics.TEXTS_DEDUPLICATED.inc(len(texts) - len(unique))
    embedded = await batcher.embed(unique, caller)
    row_of = {text: i for i, text in enumerate(unique)}
    rows = [row_of[text] for text in texts]
    return Embedded(
        embedded.embeddings[rows], [embedded.tokens[i] for i in rows], [embedded.truncated[i] for i in rows]
    )


async def score_request(
    request: DiversityRequest, batcher: Batcher, weight: float, shape: str, caller: str = ANONYMOUS
) -> tuple[list[GroupResult], DiversityUsage]:
    groups = request.groups
    embeds = request.kernel != "key"  # the key kernel needs no model call
    texts = [text for group in groups if group.texts is not None and embeds for text in group.texts]
    embedded = await embed_texts(batcher, texts, caller) if texts else None
    results = await run_in_threadpool(score_groups, request, embedded, weight, shape)
    usage = DiversityUsage(
        texts=len(texts),
        unique_texts=len(set(texts)),
        tokens=sum(embedded.tokens) if embedded else 0,
        truncated=sum(embedded.truncated) if embedded else 0,
    )
    return results, usage


def key_ids(keys: list[str | None] | None, size: int) -> list[int]:
    """A group's keys as integer ids, -1 for none (setpo_core compares ids; only equality matters)."""
    seen: dict[str, int] = {}
    return [-1 if key is None else seen.setdefault(key, len(seen)) for key in (keys or [None] * size)]


def score_groups(request: DiversityRequest, embedded: Embedded | None, weight: float, shape: str) -> list[GroupResult]:
    """Runs in a worker thread. `embedded` holds the text groups' rows, group after group, in request order.
    Groups are scored in buckets of one size and width, each a (B, G, d) batch without padding (one big group among
    thousands of small ones must not pad them all), and each bucket in chunks of SCORE_CHUNK_ROWS rows."""
    groups, v1 = request.groups, request.is_v1
    members: list[torch.Tensor | None] = []
    next_row = 0
    for group in groups:
        if request.kernel == "key":
            members.append(None)  # the kernel comes from the keys alone
        elif group.texts is not None:
            assert embedded is not None  # the caller embedded every text group
            members.append(embedded.embeddings[next_row : next_row + group.size])
            next_row += group.size
        else:
            members.append(torch.from_numpy(group.embeddings))  # (G, d) float64
    buckets: dict[tuple, list[int]] = {}
    for b, member_rows in enumerate(members):
        shape_of = (groups[b].size,) if member_rows is None else (*member_rows.shape, member_rows.dtype)
        buckets.setdefault(shape_of, []).append(b)
    results: dict[int, GroupResult] = {}
    for (size, *_), bucket in buckets.items():
        step = max(1, SCORE_CHUNK_ROWS // size)
        for start in range(0, len(bucket), step):
            indices = bucket[start : start + step]
            keys = torch.tensor([key_ids(groups[b].keys, size) for b in indices])  # (B, G)
            if request.kernel == "key":
                kernel = key_kernel(keys)  # (B, G, G)
            else:
                stacked = torch.stack([rows for b in indices if (rows := members[b]) is not None])  # (B, G, d)
                kernel = cosine_kernel(stacked)  # (B, G, G)
                if request.kernel == "hybrid":
                    kernel = hybrid_kernel(kernel, keys)
            whole = set_diversity(kernel, shape=shape)  # the whole group: local masses, set score
            saturation = kernel_saturation(kernel).tolist()
            # float64: rewards of any finite size keep a finite advantage (float32 overflows past 3e38)
            rewards = torch.tensor([groups[b].rewards or [0.0] * size for b in indices], dtype=torch.float64)
            if request.min_reward is None:
                in_scope = torch.ones(rewards.shape, dtype=torch.bool)  # (B, G)
                marginals = whole.marginals
            else:
                in_scope = rewards >= request.min_reward  # (B, G)
                marginals = scoped_marginals(kernel, in_scope, shape)
            normalised = standardized(marginals, in_scope) if request.normalize == "zscore" else marginals
            bonus = weight * normalised.double()  # (B, G)
            advantages = group_advantages(rewards) + bonus  # (B, G)
            finite = advantages.isfinite().all(dim=-1).tolist()
            # one conversion per chunk, not per group: thousands of groups share a chunk
            scored_counts = in_scope.sum(dim=-1)
            scored = torch.where(scored_counts >= MIN_GROUP, scored_counts, 0).tolist()
            marginal_rows, masses, scores = marginals.tolist(), whole.local_mass.tolist(), whole.set_score.tolist()
            shaped, bonuses = advantages.tolist(), bonus.tolist()
            for row, b in enumerate(indices):
                if groups[b].rewards is not None and not finite[row]:
                    message = "shaped advantages overflow float64; rescale the rewards or lower the weight"
                    raise Refused(message, f"groups[{b}].rewards")
                results[b] = GroupResult(
                    marginals=marginal_rows[row],
                    local_mass=masses[row],
                    set_score=scores[row],
                    saturation=saturation[row],
                    advantages=shaped[row] if groups[b].rewards is not None else None,
                    scored=None if v1 else scored[row],
                    bonus=None if v1 else bonuses[row],
                )
    return [results[b] for b in range(len(groups))]

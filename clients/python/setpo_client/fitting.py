"""A step's requests, as SetpoShaper sends them: each group checked and encoded once, fitted within the service's
limits (learned from /info), and packed into chunks of about equal bytes, never splitting a group (docs/service.md,
"Trainer integrations": fitting the step, fanning it out).
"""

import logging
import math
from dataclasses import dataclass

from setpo_client.client import json_body
from setpo_client.types import Info, Limits

log = logging.getLogger("setpo_client")

MIN_GROUP = 3  # leave-one-out marginals need pairs left after removing one member
# A text's tokens, bounded from above without its tokenizer: at most max_tokens, and at most one a UTF-8 byte plus
# what a tokenizer adds (special tokens, a leading '▁'); docs/service.md, "Trainer integrations".
ADDED_TOKENS = 4


@dataclass
class Chunk:
    """One request of a step: the step's group indices it carries, each group's members sent, and its JSON body."""

    indices: list[int]
    sizes: list[int]
    body: bytes


def largest_group(limits: Limits) -> int:
    """The most members a group may have for the service to score it: its group size and request rows limits (the
    service folds its answer-size bound into max_request_rows: docs/service.md, SETPO_MAX_REQUEST_ROWS)."""
    return min(limits.max_group_size, limits.max_request_rows or limits.max_group_size)


def text_chars(info: Info, max_chars: int | None = None) -> int:
    """Characters of a text the plug-ins send: what the server keeps (/info's truncate_chars; 8 a model token from
    a server too old to say), or the caller's max_chars, within the service's max_text_chars."""
    return min(info.limits.max_text_chars, max_chars or info.truncate_chars or 8 * info.max_tokens)


def fit_group(payload: dict, size: int, limits: Limits, chars: int, budget: int) -> tuple[bytes, list[str]] | None:
    """(the group's JSON, its texts as sent) within the limits, or None when it cannot be sent whole: too few or too many
    members or texts, a key too long (cutting a key would change which solution it names), or over the budget (the
    most one group's JSON may take of a body) even with its texts cut to their share of it. Encoded once; twice when
    its texts must be cut by bytes. ValueError saying why the group's own members cannot be sent: a text that is not
    text, a vector that is not a flat list of numbers of the group's length, a key neither text nor None, rewards whose
    squares overflow (the service's advantages would), or NaN, infinity and lone surrogates (found as it is encoded)."""
    texts, rows, keys, rewards = (payload.get(name) for name in ("texts", "embeddings", "keys", "rewards"))
    if texts is not None and not all(isinstance(text, str) for text in texts):
        raise ValueError("a member is not text")
    if rows is not None:
        flat = all(isinstance(row, list | tuple) and row and all(type(x) in (int, float) for x in row) for row in rows)
        if not flat or len({len(row) for row in rows}) > 1:
            raise ValueError("a member is not a vector of numbers of the group's length")
    if keys is not None and not all(key is None or isinstance(key, str) for key in keys):
        raise ValueError("a solution key is neither text nor None")
    if rewards is not None and not math.isfinite(sum(r * r for r in rewards)):
        raise ValueError("rewards too large: their squares overflow, and so would the group's advantages")
    keys = keys or []
    if not MIN_GROUP <= size <= largest_group(limits) or any(
        key is not None and len(key) > limits.max_text_chars for key in keys
    ):
        return None
    if texts is not None and size > limits.max_queue_texts:  # one request's texts must fit the service's queue
        return None
    sent = payload if texts is None else {**payload, "texts": [text[:chars] for text in texts]}
    body = json_body(sent)  # ValueError for NaN, infinity, a lone surrogate
    if len(body) > budget and texts is not None:  # share the body among the texts, by UTF-8 bytes of their JSON
        share = (budget - len(json_body({**sent, "texts": [""] * size}))) // size
        sent["texts"] = [cut_to_json_bytes(text, share) for text in sent["texts"]]
        body = json_body(sent)
    return (body, sent.get("texts", [])) if len(body) <= budget else None


def fit_step(
    payloads: list[tuple[int, dict, int]],
    info: Info,
    envelope: dict,
    max_chars: int | None,
    chunks: int,
    counts: dict[str, int],
) -> list[Chunk]:
    """The step as requests the service accepts, at least `chunks` of them where there are groups enough: payloads are
    (group index, v1.1 group payload, members); envelope, the request's other fields. Counts the groups left unscored
    (counts["unscored"]), those whose own members cannot be sent (counts["bad"], logged) and the texts cut."""
    limits, chars = info.limits, text_chars(info, max_chars)
    head, tail = b'{"groups":[', b"]," + json_body(envelope)[1:]  # the body around its groups
    largest = largest_group(limits)
    oversized = sorted({size for _, _, size in payloads if size > largest})
    if oversized:  # start() checked the configured group size; a group can still outgrow it (multi-output loops)
        log.warning(
            "SetPO: %d group(s) of %s members; the service takes at most %d: their bonus is 0. Raise "
            "SETPO_MAX_GROUP_SIZE (and SETPO_MAX_REQUEST_ROWS, SETPO_MAX_RESPONSE_BYTES) on the service, or make the groups smaller",
            sum(size > largest for _, _, size in payloads),
            ", ".join(map(str, oversized)),
            largest,
        )
    fitted = []
    for index, payload, size in payloads:
        try:
            group = fit_group(payload, size, limits, chars, limits.max_body_bytes - len(head) - len(tail))
        except ValueError as exc:
            counts["bad"] += 1
            log.warning("SetPO: group %d of the step cannot be sent (%s); its bonus is 0", index, exc)
            continue
        if group is None:
            counts["unscored"] += 1
            continue
        body, texts = group
        tokens = sum(min(info.max_tokens, len(text.encode("utf-8")) + ADDED_TOKENS) for text in texts)
        fitted.append((index, body, size, len(texts), tokens))
        counts["cut"] += sum(len(a) < len(b) for a, b in zip(texts, payload.get("texts", [])))
    return [
        Chunk(indices, sizes, head + b",".join(bodies) + tail)
        for indices, sizes, bodies in pack(fitted, limits, len(head) + len(tail), chunks)
    ]


def pack(
    fitted: list[tuple[int, bytes, int, int, int]], limits: Limits, envelope_size: int, chunks: int
) -> list[tuple[list[int], list[int], list[bytes]]]:
    """Fitted groups (index, JSON, members, texts, tokens at most) into requests, in order: `chunks` parts of about
    equal bytes (a group goes to the part its middle byte falls in), each cut further into as few requests as
    max_groups, max_request_rows (which bounds the answer's size too), max_body_bytes, max_queue_texts and
    max_queue_tokens (what one request may queue) allow. Each request: (indices, members, JSONs)."""
    total = max(1, sum(len(body) for _, body, _, _, _ in fitted))
    requests: list[tuple[list[int], list[int], list[bytes]]] = []
    rows_in = bytes_in = texts_in = tokens_in = done = part_in = 0
    for index, body, rows, texts, tokens in fitted:
        part = min(chunks - 1, (2 * done + len(body)) * chunks // (2 * total))
        done += len(body)
        grouped = len(requests[-1][0]) if requests else 0
        if not requests or (
            part != part_in
            or grouped + 1 > limits.max_groups
            or (limits.max_request_rows and rows_in + rows > limits.max_request_rows)
            or bytes_in + 1 + len(body) > limits.max_body_bytes
            or texts_in + texts > limits.max_queue_texts
            or (limits.max_queue_tokens and tokens_in + tokens > limits.max_queue_tokens)
        ):
            requests.append(([], [], []))
            rows_in, bytes_in, texts_in, tokens_in = 0, envelope_size - 1, 0, 0  # -1: the first group has no comma
        indices, sizes, bodies = requests[-1]
        indices.append(index)
        sizes.append(rows)
        bodies.append(body)
        rows_in += rows
        bytes_in += 1 + len(body)
        texts_in += texts
        tokens_in += tokens
        part_in = part
    return requests


def cut_to_json_bytes(text: str, budget: int) -> str:
    """The longest beginning of text whose JSON string (quotes and escapes included) takes <= budget UTF-8 bytes."""
    if budget <= 2:
        return ""
    text = text.encode("utf-8")[: budget - 2].decode("utf-8", errors="ignore")  # never half a character
    while len(json_body(text)) > budget:  # escapes (quotes, backslashes, control characters) take more
        text = text[: len(text) - max(1, (len(json_body(text)) - budget) // 6)]
    return text

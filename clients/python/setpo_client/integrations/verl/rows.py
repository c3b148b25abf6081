"""veRL's rows as SetPO's groups, and back: each row's text, its member of its prompt's group (veRL's `uid`), its
reward and advantage. Plain tensors and lists in, so the same functions serve the advantage step and DAPO's filter.
What a member is under each estimator: docs/trl-and-verl.md#verl."""

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch

from setpo_client.shaping import largest_group


def policy_texts(tokenizer, responses, masks) -> list[str | None]:
    """What the policy wrote in each row: its turns (runs of its own tokens; tool and environment output between
    them left out) decoded one by one and joined a line apart, as a chat shows them, not run together. masks:
    response_mask as the rollout made it, read before veRL's advantage step, whose rollout correction zeroes single
    rejected tokens that must not punch holes in the text. None for a row with no token of the policy."""
    texts: list[str | None] = []
    for ids, mask in zip(responses, masks):
        edges = torch.nn.functional.pad(mask.bool().int(), (1, 1)).diff()  # (T+1,) +1: a turn starts, -1: ends
        starts, ends = (edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()
        turns = [tokenizer.decode(ids[start:end], skip_special_tokens=True) for start, end in zip(starts, ends)]
        texts.append("\n".join(turn for turn in turns if turn) if starts else None)
    return texts


def row_sessions(keys: Sequence[str], tags: Sequence[dict], estimator: str) -> list[tuple | None]:
    """Each row's (member, output index), the member being what veRL's estimator counts as one sample: under "grpo"
    veRL's v1 step folds a multi-output session into its final output, reading the agent loop's key
    {uid}_{session}_{index} (start.check_sessions holds veRL to this), so a session is one member; every other
    estimator (rloo, grpo_vectorized, ...) compares every output, so each row is. None for veRL's padding rows."""
    sessions: list[tuple | None] = []
    for key, tag in zip(keys, tags):
        if tag.get("is_padding", False):
            sessions.append(None)
        elif estimator == "grpo":
            uid, session, index = key.rsplit("_", 2)
            sessions.append((f"{uid}_{session}", int(index)))
        else:
            sessions.append((key, 0))
    return sessions


def session_groups(uids: Sequence, sessions: Sequence[tuple | None]) -> tuple[dict, list[list[int]]]:
    """(member -> its final row (highest output index), the groups: per uid, its members' final rows in order of
    first appearance)."""
    finals: dict = {}
    for row, session in enumerate(sessions):
        if session is not None and (session[0] not in finals or sessions[finals[session[0]]][1] < session[1]):
            finals[session[0]] = row
    groups: dict = {}
    for row in finals.values():
        groups.setdefault(uids[row], []).append(row)
    return finals, list(groups.values())


def fitted_sessions(keys: Sequence[str], tags, uids: Sequence, estimator: str, n: int, limits: Callable):
    """Each row's member (row_sessions) and how many groups were fitted: a group of more outputs than the service
    takes (a loop's multi-output sessions under a per-output estimator) is fitted as veRL's GRPO takes it, one
    member a session (n = rollout.n of them: the start proved those fit). limits() gives the service's limits (None:
    not known), asked only for a group of more than n outputs, so a step of groups the start proved fit asks none."""
    tags = tags or [{}] * len(keys)
    sessions = row_sessions(keys, tags, estimator)
    outputs = Counter(uid for uid, session in zip(uids, sessions) if session is not None)
    over = {uid for uid, count in outputs.items() if count > n}
    known = limits() if over else None
    fitted = {uid for uid in over if known is not None and outputs[uid] > largest_group(known)}
    if fitted:
        as_grpo = row_sessions(keys, tags, "grpo")
        sessions = [
            as_grpo[row] if uid in fitted else session for row, (uid, session) in enumerate(zip(uids, sessions))
        ]
    return sessions, len(fitted)


def member_lists(members: list[list[int]], texts: Sequence, rewards: Sequence[float]) -> tuple[list, list]:
    """The groups' texts and rewards, as SetpoShaper takes them: members are the groups' rows (session_groups)."""
    return [[texts[row] for row in group] for group in members], [
        [float(rewards[row]) for row in group] for group in members
    ]


def listed(values) -> list:
    """A TransferQueue field of strings (uid) as a list."""
    return np.array(values.tolist() if hasattr(values, "tolist") else list(values), dtype=object).tolist()

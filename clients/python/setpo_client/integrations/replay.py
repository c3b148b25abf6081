"""Replay of verified distinct solutions (docs/diversity.md, "Replay"): a bank per prompt of the correct answers the
policy has found that differ from each other, replayed beside the RL loss as a length-normalised likelihood term with
equal weight per banked answer (Re:Max's recipe, with the embedder in place of a solution key). Trainer-side state: it
lives with the trainer and its checkpoints, never in the service.

    bank = ReplayBank(capacity=16, threshold=0.9)            # threshold: cosine; None: exact-text dedup only
    bank.admit(step_candidates, embed=lambda texts: ...)    # after each step's rewards: the correct answers
    loss = loss + alpha * replay_loss(model, prompt_ids, prompt_mask, bank)
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

Key = tuple[int, ...]  # a prompt, as its token ids (padding removed)


@dataclass
class Banked:
    ids: list[int]  # the answer's completion tokens (what the loss trained on, its end-of-sequence token included)
    text: str
    vector: list[float] | None  # unit-length embedding, None when admitted without one


@dataclass
class ReplayBank:
    capacity: int = 16
    threshold: float | None = None
    prompts: dict[Key, list[Banked]] = field(default_factory=dict)

    def admit(
        self, candidates: Sequence[tuple[Key, list[int], str]], embed: Callable[[list[str]], list[list[float]]] | None
    ) -> int:
        """Admits the candidates (prompt, completion ids, text) that differ from their prompt's bank and from those
        admitted before them (the same text, or given embeddings a cosine at or above the threshold); the number
        admitted. A full bank admits nothing more (answers are never replaced). embed: texts -> vectors (the service's
        embeddings), or None (the service failed) for exact-text dedup."""
        fresh = [
            (key, ids, text)
            for key, ids, text in candidates
            if len(self.prompts.get(key, ())) < self.capacity
            and text not in {b.text for b in self.prompts.get(key, ())}
        ]
        vectors: list[list[float] | None] = [None] * len(fresh)
        if fresh and embed is not None and self.threshold is not None:
            found = torch.tensor(embed([text for _, _, text in fresh]), dtype=torch.float64)  # (N, D)
            vectors = torch.nn.functional.normalize(found, dim=-1).tolist()  # unit length; a zero vector stays 0
        admitted = 0
        for (key, ids, text), vector in zip(fresh, vectors):
            bank = self.prompts.setdefault(key, [])
            if len(bank) >= self.capacity or any(
                b.text == text or similar(b.vector, vector, self.threshold) for b in bank
            ):
                continue
            bank.append(Banked(list(ids), text, vector))
            admitted += 1
        return admitted

    def size(self) -> int:
        return sum(len(bank) for bank in self.prompts.values())

    def state_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "threshold": self.threshold,
            "prompts": [[list(key), [vars(b) for b in bank]] for key, bank in self.prompts.items()],
        }

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.threshold = state["capacity"], state["threshold"]
        self.prompts = {tuple(key): [Banked(**b) for b in bank] for key, bank in state["prompts"]}


def similar(a: list[float] | None, b: list[float] | None, threshold: float | None) -> bool:
    """Whether two banked answers are one solution to the embedder: cosine at or above the threshold."""
    if a is None or b is None or threshold is None:
        return False
    return sum(x * y for x, y in zip(a, b)) >= threshold


def prompt_keys(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[Key]:
    """(B, P) left-padded prompts and their mask -> each row's prompt as a key."""
    return [tuple(row[mask.bool()].tolist()) for row, mask in zip(prompt_ids, prompt_mask)]


def replay_loss(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    bank: ReplayBank,
    pad_id: int,
    distributed: bool = False,
) -> tuple[torch.Tensor, int]:
    """The replay term for one micro-batch and the number of prompts it covered: for each prompt of the batch with a
    bank, the mean over its banked answers of each answer's mean token negative log-likelihood given the prompt
    (length-normalised; equal weight per answer), averaged over those prompts (each weighing its rows in the batch).
    distributed: the model waits for every process at each forward (DDP's buffer broadcast, ZeRO-3's and FSDP's
    gathers), so a batch with nothing to replay still runs one, on one of its tokens, at weight 0."""
    keys = prompt_keys(prompt_ids, prompt_mask)
    rows = {key: keys.count(key) for key in keys if bank.prompts.get(key)}
    if not rows and distributed:
        return model(input_ids=prompt_ids[:1, -1:]).logits.float().sum() * 0.0, 0
    if not rows:
        return prompt_ids.new_zeros((), dtype=torch.float32), 0
    sequences = [(key, list(key) + b.ids, len(b.ids)) for key in rows for b in bank.prompts[key]]
    width = max(len(ids) for _, ids, _ in sequences)
    ids = torch.full((len(sequences), width), pad_id, device=prompt_ids.device)  # (S, T) right-padded
    attention = torch.zeros_like(ids)
    for s, (_, row, _) in enumerate(sequences):
        ids[s, : len(row)], attention[s, : len(row)] = torch.tensor(row), 1
    logps = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), dim=-1)
    token = logps.gather(-1, ids[:, 1:, None])[..., 0]  # (S, T-1): token t+1 given the tokens before it
    per_answer: dict[Key, list[torch.Tensor]] = {}
    for s, (key, row, answer) in enumerate(sequences):
        start = len(row) - answer - 1  # the answer's first token is predicted at this position
        per_answer.setdefault(key, []).append(-token[s, start : len(row) - 1].mean())
    total = sum(rows.values())
    weighted = (torch.stack(answers).mean() * rows[key] / total for key, answers in per_answer.items())
    return sum(weighted, start=token.new_zeros(())), len(rows)

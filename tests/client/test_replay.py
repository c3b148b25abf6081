"""Replay's bank and loss (setpo_client.integrations.replay): admission by text and by the embedder's cosine, the
cap, the state a checkpoint keeps, and the loss against a literal computation, one answer at a time."""

import math

import pytest
import torch

from setpo_client.integrations.replay import ReplayBank, prompt_keys, replay_loss


def vectors(table: dict[str, list[float]]):
    """An embedder for the test: each text's vector from a table; records the texts it was asked."""
    asked: list[list[str]] = []

    def embed(texts: list[str]) -> list[list[float]]:
        asked.append(list(texts))
        return [table[text] for text in texts]

    return embed, asked


def test_an_answer_is_admitted_only_when_it_differs_from_its_prompts_bank():
    bank = ReplayBank(capacity=16, threshold=0.9)
    embed, asked = vectors({"a": [1, 0], "a'": [0.95, 0.05], "b": [0, 1], "c": [0.6, 0.8], "b2": [0.05, 1]})
    p, q = (1, 2), (3,)
    admitted = bank.admit([(p, [10], "a"), (p, [11], "a'"), (p, [12], "b"), (q, [13], "a"), (p, [10], "a")], embed)
    assert admitted == 3  # a' is a to the embedder (cos 0.9986); the second "a" of p is the same text
    assert [b.text for b in bank.prompts[p]] == ["a", "b"] and [b.text for b in bank.prompts[q]] == ["a"]
    assert bank.admit([(p, [14], "c"), (p, [15], "b2"), (p, [12], "b")], embed) == 1  # c (0.8 from b) is new
    assert asked[-1] == ["c", "b2"]  # a banked text is not embedded again
    assert [b.text for b in bank.prompts[p]] == ["a", "b", "c"]
    assert bank.prompts[p][2].vector == pytest.approx([0.6, 0.8])


def test_without_an_embedder_or_a_threshold_answers_are_told_apart_by_text_and_a_full_bank_takes_none():
    bank = ReplayBank(capacity=2, threshold=None)
    embed, asked = vectors({})
    assert bank.admit([((1,), [1], "x"), ((1,), [2], "x"), ((1,), [3], "y"), ((1,), [4], "z")], embed) == 2
    assert [b.text for b in bank.prompts[(1,)]] == ["x", "y"] and not asked  # capped at 2; nothing embedded
    assert ReplayBank(threshold=0.9).admit([((1,), [1], "x"), ((1,), [2], "y")], None) == 2  # the service failed


def test_the_state_a_checkpoint_keeps_gives_the_same_bank_back():
    bank = ReplayBank(capacity=4, threshold=0.8)
    bank.admit([((5, 6), [7, 8], "u"), ((5, 6), [9], "v")], lambda texts: [[1.0, 0.0], [0.0, 1.0]])
    again = ReplayBank()
    again.load_state_dict(bank.state_dict())
    assert again == bank and again.size() == 2


def test_prompt_keys_drop_the_left_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_keys(ids, mask) == [(5, 6), (7, 8, 9, 4)]


class Bigram(torch.nn.Module):
    """A real (tiny) causal LM: each position's logits depend on its own token only."""

    def __init__(self, vocab: int = 12):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": self.table(input_ids)})()


def literal_nll(model: Bigram, prompt: list[int], answer: list[int]) -> float:
    """Mean negative log-likelihood of the answer's tokens given the prompt, token by token."""
    sequence = prompt + answer
    logits = model.table.weight.double()
    total = math.fsum(
        -torch.log_softmax(logits[sequence[t - 1]], dim=-1)[sequence[t]].item()
        for t in range(len(prompt), len(sequence))
    )
    return total / len(answer)


def test_replay_loss_is_the_mean_over_banked_answers_of_their_mean_token_nll_weighted_by_rows():
    model = Bigram()
    bank = ReplayBank(threshold=None)
    bank.admit([((1, 2), [3, 4, 5], "a"), ((1, 2), [6], "b"), ((7,), [8, 9], "c")], None)
    # a batch of three rows: prompt (1, 2) twice, prompt (7,) once, and a prompt with no bank (ignored)
    ids = torch.tensor([[1, 2], [1, 2], [0, 7], [10, 11]])
    mask = torch.tensor([[1, 1], [1, 1], [0, 1], [1, 1]])
    loss, prompts = replay_loss(model, ids, mask, bank, pad_id=0)
    first = (literal_nll(model, [1, 2], [3, 4, 5]) + literal_nll(model, [1, 2], [6])) / 2  # equal weight per answer
    second = literal_nll(model, [7], [8, 9])
    assert prompts == 2
    assert loss.item() == pytest.approx((2 * first + second) / 3, rel=1e-6)
    loss.backward()
    assert model.table.weight.grad.abs().sum() > 0  # it trains the policy


def test_replay_loss_is_zero_without_a_bank_for_the_batch():
    loss, prompts = replay_loss(Bigram(), torch.tensor([[1, 2]]), torch.tensor([[1, 1]]), ReplayBank(), pad_id=0)
    assert loss.item() == 0 and prompts == 0

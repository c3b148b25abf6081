"""Experiment v3's identity study (experiments/countdown_lm/identity.py): its pieces on groups whose answers are
known, so that each measure is seen to say what the docs read from it."""

import numpy as np
import pytest

from experiments.countdown_lm import identity
from setpo_client.keys import countdown_expression


def group(answers: list[str], cos: np.ndarray) -> dict:
    texts = [f"plan {i} : <answer> {a} </answer>" for i, a in enumerate(answers)]
    return {"puzzle": "p", "texts": texts, "truth": [countdown_expression(t) for t in texts], "cos_whole": cos}


def test_views_split_a_response_into_its_answer_span_and_its_reasoning():
    views = identity.views("plan : add 3 and 5 . <answer> ( 3 + 5 ) * 2 </answer>")
    assert views["answer"] == "<answer> ( 3 + 5 ) * 2 </answer>" and views["reasoning"] == "plan : add 3 and 5 ."


def test_pairs_leave_out_exact_copies_and_label_respellings_as_the_same_solution():
    g = group(["(3+5)*2", "2*(5+3)", "2*8", "2*8"], np.eye(4))
    g["texts"][3] = g["texts"][2]  # an exact copy
    sims, same, _ = identity.pairs([g], [np.full((4, 4), 0.5)])
    assert len(sims) == 5  # 6 pairs less the copy
    assert same.tolist() == [True, False, False, False, False]  # only the respelling is the same solution


def test_alignment_favours_the_solution_alone_in_its_group_under_the_key_and_not_under_a_blind_kernel():
    g = group(["(3+5)*2", "2*(5+3)", "(5+3)*2", "2*8"], np.eye(4))  # three spellings of one solution, one other
    truth = (np.array(g["truth"])[:, None] == np.array(g["truth"])[None, :]).astype(float)
    assert identity.alignment([g], [truth]) > 1.0  # the lone solution's z well above the shared ones'
    assert identity.alignment([g], [np.full((4, 4), 0.5)]) == pytest.approx(0.0)  # all alike: no signal


def test_youden_finds_the_threshold_that_separates():
    sims = np.array([0.99, 0.97, 0.96, 0.90, 0.85, 0.81])
    same = np.array([True, True, True, False, False, False])
    threshold, j = identity.youden(sims, same)
    assert 0.90 < threshold <= 0.96 and j == pytest.approx(1.0)

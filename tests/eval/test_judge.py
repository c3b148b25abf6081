"""The LLM-judge client against a local stand-in server that speaks the OpenAI chat API."""

import pytest

from setpo_trainer.eval.judge import JudgeError, judge_diversity


def test_score_and_reason_from_the_papers_prompt(judge_server):
    url, state = judge_server
    score, reason = judge_diversity(
        "What is 6 * 7?", ["6 * 7 = 42", "7 + 7 + 7 + 7 + 7 + 7 = 42"], url, "k3y", "judge-model"
    )
    assert (score, reason) == (4, "Three distinct strategies.")
    sent = state["requests"][0]
    assert (
        sent["path"] == "/v1/chat/completions"
        and sent["auth"] == "Bearer k3y"
        and sent["body"]["model"] == "judge-model"
    )
    prompt = sent["body"]["messages"][0]["content"]
    assert "What is 6 * 7?" in prompt and "--- Attempt 2 ---\n7 + 7" in prompt and "2 SOLUTION ATTEMPTS" in prompt
    assert "Output the score FIRST inside double brackets" in prompt


@pytest.mark.parametrize(
    "reply,status,match",
    [
        ("I would say 4.", 200, "no \\[\\[1-5\\]\\] score"),
        ("[[9]]", 200, "no \\[\\[1-5\\]\\]"),
        ("{}", 500, "answered 500"),
    ],
)
def test_bad_judge_answers_are_clear_errors(judge_server, reply, status, match):
    url, state = judge_server
    state["reply"], state["status"] = reply, status
    with pytest.raises(JudgeError, match=match):
        judge_diversity("p", ["a", "b"], url, None, "m")


def test_no_judge_configured_says_what_to_pass():
    with pytest.raises(JudgeError, match="--judge-url"):
        judge_diversity("p", ["a"], None, None, "m")


def test_unreachable_judge_is_a_clear_error():
    with pytest.raises(JudgeError, match="cannot reach"):
        judge_diversity("p", ["a"], "http://127.0.0.1:9/v1", None, "m", timeout=2)

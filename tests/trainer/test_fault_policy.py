"""--setpo.on_error: the service goes down in the middle of training and comes back."""

import copy

import pytest
import torch

from setpo_client import SetpoClient, SetpoError
from setpo_server.local import LocalServer, free_port
from tests.trainer.rollouts import SETTINGS, makers, rollout


def step(openrlhf, setpo, problems, strategy, tokenizer):
    """One advantage step of each maker on the same rollout: (OpenRLHF's experiences, ours)."""
    experiences = rollout(problems, strategy, tokenizer, setpo, kl_scale=0.0)
    return openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences)), setpo.compute_advantages_and_returns(
        experiences
    )


def shaped(base, ours) -> bool:
    return not all(torch.equal(a.advantages, b.advantages) for a, b in zip(base, ours))


def logged(experiences, name: str) -> float:
    return experiences[0].info[name][0].item()


def test_skip_trains_on_with_weight_zero_counts_the_steps_and_resumes(tiny_model, problems):
    service = LocalServer().start()
    try:
        openrlhf, setpo, strategy, tokenizer = makers(
            tiny_model, service.url, *SETTINGS["rloo"], "--setpo.on_error", "skip", "--setpo.max_retries", "1"
        )
        base, ours = step(openrlhf, setpo, problems, strategy, tokenizer)
        assert (
            shaped(base, ours)
            and logged(ours, "setpo/fallback_steps") == 0
            and logged(ours, "setpo/weight") == pytest.approx(0.1)
        )
        assert logged(ours, "setpo/active") == 1  # from the path that shaped the step

        service.stop()
        for fallbacks in (1, 2):  # down: OpenRLHF's advantages exactly, the step counted
            base, ours = step(openrlhf, setpo, problems, strategy, tokenizer)
            assert all(torch.equal(a.advantages, b.advantages) for a, b in zip(base, ours))
            assert (
                logged(ours, "setpo/fallback_steps") == fallbacks
                and logged(ours, "setpo/weight") == 0
                and logged(ours, "setpo/active") == 0
            )
            assert "setpo/set_score_mean" not in ours[0].info

        service = LocalServer(port=service.port).start()  # back on the same address
        base, ours = step(openrlhf, setpo, problems, strategy, tokenizer)
        assert (
            shaped(base, ours)
            and logged(ours, "setpo/fallback_steps") == 2
            and logged(ours, "setpo/weight") == pytest.approx(0.1)
        )
    finally:
        service.stop()


def test_fail_stops_with_a_clear_error(tiny_model, server, problems):
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["rloo"], "--setpo.on_error", "fail")
    down = f"http://127.0.0.1:{free_port()}"
    setpo.setpo.client = SetpoClient(down, max_retries=0)  # the service went away after training started
    with pytest.raises(SetpoError, match=f"on_error='fail'.*{down}"):
        step(openrlhf, setpo, problems, strategy, tokenizer)

"""The veRL command that docs/trl-and-verl.md shows for the diversity policy composes in veRL's own Hydra config and
passes the plug-in's start checks as written: a renamed setting on either side breaks this test, not a user's run."""

import re
import shlex
from pathlib import Path

import verl
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.v1 import get_trainer_cls

from setpo_client.integrations.verl.settings import setpo_settings, shaper_for
from setpo_client.integrations.verl.start import check_start

PAGE = Path(__file__).resolve().parents[3] / "docs" / "trl-and-verl.md"


def documented_overrides() -> list[str]:
    """The Hydra overrides of the page's veRL diversity command, in order."""
    section = PAGE.read_text().split("### Diversity among correct solutions (veRL)", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    command = next(line for line in block.replace("\\\n", " ").splitlines() if "verl.trainer.main_ppo" in line)
    words = shlex.split(command)
    return words[words.index("verl.trainer.main_ppo") + 1 :]


def test_the_documented_diversity_command_starts_with_the_policy_it_shows(server):
    overrides = [
        f"+algorithm.setpo.url={server.url}" if o.startswith("+algorithm.setpo.url=") else o
        for o in documented_overrides()
    ]
    assert "+algorithm.setpo.target_ratio=0.5" in overrides and "+algorithm.setpo.kernel=hybrid" in overrides
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    check_start(config, get_trainer_cls(config.trainer.v1.trainer_mode))
    shaper = shaper_for(setpo_settings(config.algorithm))
    assert (shaper.min_reward, shaper.kernel, shaper.normalize, shaper.weight) == (1.0, "hybrid", "zscore", 0.1)
    assert shaper.key("<answer>(3+5)*2</answer>") == "countdown:mul(2,add(3,5))"
    controller = shaper.controller
    assert (controller.target_ratio, controller.warmup_steps, controller.freeze_after) == (0.5, 20, None)

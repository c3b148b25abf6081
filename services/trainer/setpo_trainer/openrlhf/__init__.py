"""SetPO inside OpenRLHF's own Ray trainer (`setpo-train`). Needs the `openrlhf` extra and its environment.

    cli.py               setpo-train: OpenRLHF's train_ppo_ray, every flag unchanged, plus --setpo.*
    flags.py             how setpo-train spells SetPO's settings in messages (cli.py and the trainer actor)
    ray_hook.py          how the trainer actor OpenRLHF builds gets the SetPO experience maker
    experience_maker.py  SetpoExperienceMaker: the scoring asked before OpenRLHF's forward passes; OpenRLHF's
                         advantages, then + lambda * s_i per response token
    data.py              the paper's training sets as OpenRLHF prompt files (GSM8K, MATH-hard, Countdown)
    rewards/             reward functions for --reward.remote_url (GSM8K/MATH boxed answer, Countdown)

Importing this package imports nothing from OpenRLHF: the reward files also run in rollout workers.
"""

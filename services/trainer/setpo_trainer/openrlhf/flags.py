"""How setpo-train spells SetPO's settings, for the messages that name one: shared by the command line (cli.py,
which must import nothing of OpenRLHF) and the experience maker in the trainer actor."""


def spell(name: str) -> str:
    """A SetPO setting as setpo-train's flag, for refusals (setpo_client.policy, SetpoShaper.start)."""
    own = {"group_size": "--rollout.n_samples_per_prompt", "estimator": "--algo.advantage.estimator"}
    return own.get(name, f"--setpo.{name}")


# The diversity policy and the base, as setpo_client.policy.diversity_policy takes them (besides the weight and the
# controller's): the --setpo.* flags of those names
POLICY = ("min_reward", "key", "kernel", "normalize", "embed_span", "advantage", "positive_weight", "combine")

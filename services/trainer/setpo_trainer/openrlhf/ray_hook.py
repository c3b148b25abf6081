"""How the trainer actor that OpenRLHF itself builds gets SetPO's experience maker, with no copy of OpenRLHF.

OpenRLHF's trainer (`PPOTrainer`, or `TrainingActor` with --train.async_enable) is a Ray actor; its
`BasePPOTrainer.__init__` builds the experience maker by the module-global name
`openrlhf.trainer.ppo_trainer.RemoteExperienceMaker`. The actor runs in a Ray worker process, possibly on
another node, so rebinding the name in the driver does nothing: it must be rebound in every worker before
the actor is built. Ray has a hook for exactly that, the runtime env's `worker_process_setup_hook`.

setpo-train sets RAY_RUNTIME_ENV_HOOK=`setpo_trainer.openrlhf.ray_hook.add_worker_setup`; Ray calls it on
the runtime env of OpenRLHF's own `ray.init(...)` (after merging a RayJob's runtime env), and it adds
`use_setpo_experience_maker` as the job's worker setup hook.
"""

import os

SETUP_HOOK = "setpo_trainer.openrlhf.ray_hook.use_setpo_experience_maker"
RUNTIME_ENV_HOOK = "setpo_trainer.openrlhf.ray_hook.add_worker_setup"


def add_worker_setup(runtime_env: dict | None) -> dict:
    """RAY_RUNTIME_ENV_HOOK: the job's runtime env plus SetPO's worker setup hook (and the service's key)."""
    runtime_env = dict(runtime_env or {})
    existing = runtime_env.get("worker_process_setup_hook")
    if existing not in (None, SETUP_HOOK):
        raise RuntimeError(
            f"the Ray job already has a worker_process_setup_hook ({existing!r}); SetPO needs its own "
            f"({SETUP_HOOK}). Call both from one function and pass that instead."
        )
    runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    # Workers on other nodes do not inherit the driver's environment; a key set in the job's own env wins.
    if os.environ.get("SETPO_API_KEY"):
        runtime_env["env_vars"] = {"SETPO_API_KEY": os.environ["SETPO_API_KEY"], **(runtime_env.get("env_vars") or {})}
    return runtime_env


def use_setpo_experience_maker() -> None:
    """Ray worker setup hook: OpenRLHF's trainer actors built in this process use SetpoExperienceMaker."""
    from openrlhf.trainer import ppo_trainer

    from setpo_trainer.openrlhf.experience_maker import SetpoExperienceMaker

    ppo_trainer.RemoteExperienceMaker = SetpoExperienceMaker

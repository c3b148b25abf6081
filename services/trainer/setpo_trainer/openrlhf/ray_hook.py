"""How the trainer actor that OpenRLHF itself builds gets SetPO's experience maker, with no copy of OpenRLHF.

OpenRLHF's trainer (`PPOTrainer`, or `TrainingActor` with --train.async_enable) is a Ray actor; its
`BasePPOTrainer.__init__` builds the experience maker by the module-global name
`openrlhf.trainer.ppo_trainer.RemoteExperienceMaker`. The actor runs in a Ray worker process, possibly on
another node, so rebinding the name in the driver does nothing: it must be rebound in the worker before
the actor is built. Ray has a hook for exactly that, the runtime env's `worker_process_setup_hook`.

setpo-train sets RAY_RUNTIME_ENV_HOOK=`setpo_trainer.openrlhf.ray_hook.add_worker_setup` (after a hook that
was already set, which ours then calls first: SETPO_CHAINED_RUNTIME_ENV_HOOK). Ray calls it on the runtime env
of OpenRLHF's own `ray.init(...)` (after merging a RayJob's runtime env), and it adds
`use_setpo_experience_maker` as the job's worker setup hook. Under `uv run` Ray skips RAY_RUNTIME_ENV_HOOK for
its own uv hook (RAY_ENABLE_UV_RUN_RUNTIME_ENV): setpo-train turns that off and chains Ray's uv hook instead.

That hook runs in EVERY worker process, vLLM engine actors included, before Ray sets their
CUDA_VISIBLE_DEVICES: it imports nothing. It arranges for the rebind to happen when, and only when, the
process itself imports `openrlhf.trainer.ppo_trainer` (the trainer actors do; vLLM engines never do, and
OpenRLHF keeps deepspeed out of them on purpose). The rebind checks that BasePPOTrainer.__init__ still builds
the maker by that name, so an OpenRLHF that moved it fails the trainer actor instead of training plain GRPO.

No secret is put in the runtime env (Ray logs it and `ray list runtime-envs` shows it): workers read
SETPO_API_KEY from their own environment (in Kubernetes, both pod templates get it from the Secret; elsewhere the
environment `ray start` had, not the driver's: SetpoExperienceMaker checks it as the trainer actor starts).
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

SETUP_HOOK = "setpo_trainer.openrlhf.ray_hook.use_setpo_experience_maker"
RUNTIME_ENV_HOOK = "setpo_trainer.openrlhf.ray_hook.add_worker_setup"
CHAINED_HOOK_VARIABLE = "SETPO_CHAINED_RUNTIME_ENV_HOOK"  # a RAY_RUNTIME_ENV_HOOK that was set before setpo-train's
UV_RUN_HOOK = "ray._private.runtime_env.uv_runtime_env_hook.hook"  # what Ray calls instead under `uv run`
TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"


def add_worker_setup(runtime_env: dict | None) -> dict:
    """RAY_RUNTIME_ENV_HOOK: the job's runtime env (after the hook that was set before ours) plus SetPO's worker setup hook."""
    chained = os.environ.get(CHAINED_HOOK_VARIABLE)
    if chained:
        module, _, name = chained.rpartition(".")
        runtime_env = getattr(importlib.import_module(module), name)(runtime_env)
    runtime_env = dict(runtime_env or {})
    existing = runtime_env.get("worker_process_setup_hook")
    if existing not in (None, SETUP_HOOK):
        raise RuntimeError(
            f"the Ray job already has a worker_process_setup_hook ({existing!r}); SetPO needs its own "
            f"({SETUP_HOOK}). Call both from one function and pass that instead."
        )
    runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    return runtime_env


def rebind(ppo_trainer) -> None:
    """OpenRLHF's trainer module, just imported: its trainers build SetpoExperienceMaker from now on."""
    names = ppo_trainer.BasePPOTrainer.__init__.__code__.co_names
    if not hasattr(ppo_trainer, "RemoteExperienceMaker") or "RemoteExperienceMaker" not in names:
        raise RuntimeError(
            f"{TRAINER_MODULE}.BasePPOTrainer no longer builds RemoteExperienceMaker by that name: this OpenRLHF "
            "would train without SetPO. setpo-train is tested with openrlhf==0.11.2."
        )
    from setpo_trainer.openrlhf.experience_maker import SetpoExperienceMaker

    ppo_trainer.RemoteExperienceMaker = SetpoExperienceMaker


class _RebindOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds OpenRLHF's trainer module with the normal finders, executes it, then rebinds."""

    def find_spec(self, name, path=None, target=None):
        if name != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)  # the real spec, found by everyone else
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec  # not installed: the import fails as it would without us
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        sys.meta_path.remove(self)
        rebind(module)


def use_setpo_experience_maker() -> None:
    """Ray worker setup hook, in every worker process: imports nothing; rebinds when the process imports
    OpenRLHF's trainer module (or now, if it already has)."""
    if TRAINER_MODULE in sys.modules:
        rebind(sys.modules[TRAINER_MODULE])
    elif not any(isinstance(finder, _RebindOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RebindOnImport())

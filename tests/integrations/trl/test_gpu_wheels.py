"""benchmarks.gpu.prepare --trl carries TRL and datasets to the GPU machine for benchmarks.trl_wait: every
requirement of the versions this .venv-trl pins must be carried or in the GPU image, or the call dies there on an
import after minutes of device time (read from the installed metadata: no download in a test)."""

import importlib.metadata

from benchmarks.gpu import prepare


def test_the_trl_wheels_need_nothing_else() -> None:
    names = prepare.WHEELS + prepare.TRL_WHEELS
    requirements = [line for name in names for line in importlib.metadata.requires(name) or []]
    assert prepare.unmet(requirements, names, prepare.IMAGE_HAS | prepare.TRL_IMAGE_HAS) == set()


def test_a_requirement_of_trl_outside_the_carried_set_is_named() -> None:
    requirements = importlib.metadata.requires("trl") or []
    assert "datasets" in prepare.unmet(requirements, prepare.WHEELS, prepare.IMAGE_HAS | prepare.TRL_IMAGE_HAS)

"""SetPO for veRL 0.9: the advantages of veRL's v1 trainer combined with the SetPO service's bonus, lambda * s_i.

An entry-point plug-in (group "verl.plugins"): `import verl` loads this package in every process, which hooks veRL
(install.py); SetPO stays off until the run's Hydra config says +algorithm.setpo.enable=true. How to use it, what
it hooks, what is checked at start: docs/trl-and-verl.md#verl. Layers: settings (the config block), rows (veRL's
rows as SetPO's groups), v1 (the trainer's passes: SetpoShaper's submit and shape), dapo (DAPO's filter),
metrics (veRL's aggregator), start (start checks), install (the hooks).
"""

import logging
import sys

log = logging.getLogger("setpo_client.verl")

try:  # loaded by veRL's plug-in discovery, which hides import errors at debug level: say it ourselves
    from .install import install

    install()
except Exception as exc:
    if any(arg.lstrip("+").lower() in ("algorithm.setpo.enable=true", "algorithm.setpo.enable=1") for arg in sys.argv):
        # SetPO is on for this run: SystemExit passes veRL's `except Exception` and stops it here
        log.error("setpo veRL plug-in could not install itself", exc_info=True)
        raise SystemExit(
            f"SetPO is enabled (+algorithm.setpo.enable=true) but its veRL plug-in could not install itself: {exc!r}. "
            "Fix the installation (setpo-client[verl] with veRL 0.9.x) or disable SetPO."
        ) from exc
    log.warning(
        "setpo veRL plug-in could not install itself; SetPO is unavailable in this process (%r)", exc, exc_info=True
    )

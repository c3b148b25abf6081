"""setpo-server: SetPO's diversity service (route -> batcher -> backend, one stage per module)."""

__version__ = "0.1.0"

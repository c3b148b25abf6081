"""setpo-server: SetPO's diversity service (route -> batcher -> backend, one stage per module)."""

__version__ = "0.1.0"
# The HTTP contract of /v1/diversity (DESIGN.md): 1.1 adds keys, min_reward, kernel and normalize, compatibly.
CONTRACT_VERSION = "1.1"

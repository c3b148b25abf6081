"""setpo-server: SetPO's diversity service (route -> scoring -> batcher -> backend, one stage per module:
docs/development.md, "A request's path through the service")."""

__version__ = "0.1.0"
# The HTTP contract of /v1/diversity (docs/service.md, "HTTP API"): 1.1 adds keys, min_reward, kernel and
# normalize, compatibly.
CONTRACT_VERSION = "1.1"
# The least members a group may have: leave-one-out marginals need pairs left once a member is removed.
MIN_GROUP = 3

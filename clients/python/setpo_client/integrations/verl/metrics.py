"""setpo/* under veRL's MetricsAggregator: a v1 training step runs its advantage step parameter_sync_step (k) times
and the aggregator reduces each metric of the k passes by a rule its name picks (a weighted mean unless "sum",
"total", "min", "max"... is in it). Which rule each metric takes and why: docs/trl-and-verl.md#verl."""

# per-pass counts and time: the step's are their sum
SUMMED_METRICS = (
    "setpo/unscored_groups",
    "setpo/small_scope_groups",
    "setpo/bad_groups",
    "setpo/scored_groups",
    "setpo/cut_texts",
    "setpo/requests",
    "setpo/chunk_retries",
    "setpo/span_missing",
    "setpo/time_s",
    "setpo/wait_s",
    "setpo/kept_by_bonus",
    "setpo/fitted_groups",
)
# running totals and lambda: where the step ended
LAST_METRICS = ("setpo/fallback_steps", "setpo/dropped_steps", "setpo/unscored_groups_total", "setpo/weight")


def aggregation_rules(original, aggregator) -> dict[str, list[str]]:
    """veRL's MetricsAggregator._init_aggregation_rules (`original`), with SetPO's metrics in its sum and last rules."""
    rules = original(aggregator)
    return {
        **rules,
        "sum": [*rules.get("sum", []), *SUMMED_METRICS],
        "last": [*rules.get("last", []), *LAST_METRICS],
    }

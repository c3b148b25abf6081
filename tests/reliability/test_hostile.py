"""Quick form of the hostile-client suite (the full one is `make soak`): amplification bodies, wrong-key 60 MB
bodies, slowloris, a huge job with small callers, NaN/inf floods, disconnect storms, endless headers, leftover
bodies and answers nobody reads against one real server.
No 5xx, the process never restarts, memory stays under the CPU overlay's limit; latencies are recorded, not
asserted (docs/reliability.md has them)."""

from tests.reliability.hostile import HELD_AFTER_MB, OVERLAY_MEMORY_LIMIT_MB, run_hostile

EXPECTED = {  # what each scenario's answers must be, and nothing else
    "amplification": {"200", "400", "422"},  # 400: the /v1/embeddings one, as OpenAI answers an invalid request
    "wrong_key_bodies": {"401"},
    "slowloris": {"408", "503"},
    "huge_job_and_small_callers": {"200"},
    "nan_flood": {"422"},
    "disconnect_storm": {"hung up", "200"},
    "endless_headers": {"431", "408"},  # 408: a caller whose deadline came before its next byte
    "leftover_bodies": {"closed"},
    "unread_answers": {"dropped"},
}


def test_hostile_clients_get_4xx_never_5xx_and_the_service_survives_within_its_memory():
    outcomes, alive, log = run_hostile(full=False)
    assert alive, log[-3000:]
    for outcome in outcomes:
        summary = outcome.summary()
        assert set(outcome.statuses) <= EXPECTED[outcome.name], summary
        assert outcome.rss_peak_mb < OVERLAY_MEMORY_LIMIT_MB, summary
        assert outcome.health_ms, summary  # /health answered throughout
    by_name = {outcome.name: outcome for outcome in outcomes}
    assert by_name["amplification"].statuses == {"400": 1, "422": 2, "200": 2}
    assert by_name["wrong_key_bodies"].statuses["401"] == 8
    assert by_name["slowloris"].statuses["408"] >= 25, "a header sender was not cut off by SETPO_HEADER_TIMEOUT"
    assert by_name["huge_job_and_small_callers"].small_callers_ms, "no small caller ran while the big job did"
    endless = by_name["endless_headers"]
    assert endless.statuses["431"] > 0 and endless.rss_peak_mb - endless.rss_before_mb < 64
    assert by_name["unread_answers"].rss_after_mb - by_name["unread_answers"].rss_before_mb < HELD_AFTER_MB
    assert "Traceback" not in log

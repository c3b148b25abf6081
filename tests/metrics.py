"""A running server's /metrics in tests, read with prometheus_client's own parser."""

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(server) -> dict[str, float]:
    """Every sample of the server's /metrics by name and labels as written there: 'name{route="...",status="..."}'.
    `server`: a LocalServer (its url), or an in-process service (tests/inprocess.py; its registry is the process's)."""
    if hasattr(server, "http"):
        with server.http() as http:
            text = http.get("/metrics").text
    else:
        text = httpx.get(server.url + "/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sample.labels.items())
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def metric(server, name: str) -> float:
    """One sample by name (with its labels, if any); 0 when absent, as a counter not yet incremented is."""
    return scrape(server).get(name, 0.0)

"""A running server's /metrics in tests, read with prometheus_client's own parser."""

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(server) -> dict[str, float]:
    """Every sample of the server's /metrics by name and labels as written there: 'name{route="...",status="..."}'.
    `server`: a LocalServer (its url), or an in-process service (tests/inprocess.py; its registry is the process's)."""
    if hasattr(server, "http"):
        with server.http() as http:
            text = http.get("/metrics").text
    else:
        text = httpx.get(server.url + "/metrics", timeout=30).text  # a read, not a bound on latency (httpx: 5 s)
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sample.labels.items())
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def metric(server, name: str) -> float:
    """The samples of that name whose labels include the ones given, summed, as PromQL selects them:
    'setpo_requests_total{route="/info",status="200"}' counts every caller's. 0 when none, as a counter not yet
    incremented is."""
    wanted_name, _, wanted = name.partition("{")
    wanted_labels = set(LABEL.findall(wanted))
    total = 0.0
    for sample, value in scrape(server).items():
        sample_name, _, labels = sample.partition("{")
        if sample_name == wanted_name and wanted_labels <= set(LABEL.findall(labels)):
            total += value
    return total

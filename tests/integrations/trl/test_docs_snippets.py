"""The TRL code a user copies from the README and docs/trl-and-verl.md runs as written on a CPU machine (issue 27,
item 2): each python block of those TRL sections is executed in a fresh process against the real service, with
only its model swapped for a tiny local one (no hub here)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integrations.trl.test_trl_plugin import tiny_model  # noqa: F401  (the fixture)
from tests.metrics import metric

ROOT = Path(__file__).parents[3]
MODEL_LINE = re.compile(r'^model_path = "[^"]+"', re.MULTILINE)


def python_blocks(page: Path, heading: str) -> list[str]:
    """The ```python blocks under `heading`, up to the next heading of the same level."""
    text = page.read_text()
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    end = text.find("\n" + level + " ", start + len(heading))
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


SNIPPETS = [
    *(("README.md", block) for block in python_blocks(ROOT / "README.md", "### TRL")),
    *(("docs/trl-and-verl.md", block) for block in python_blocks(ROOT / "docs/trl-and-verl.md", "## TRL")),
]


def test_every_trl_section_has_a_snippet_to_run():
    assert {page for page, _ in SNIPPETS} == {"README.md", "docs/trl-and-verl.md"}


@pytest.mark.parametrize(("page", "code"), SNIPPETS, ids=[page for page, _ in SNIPPETS])
def test_the_snippet_trains_with_setpo_as_written(page, code, tiny_model, server, tmp_path):  # noqa: F811
    assert MODEL_LINE.search(code), f"{page}: the snippet must name its model on one line, `model_path = ...`"
    runnable = MODEL_LINE.sub(f"model_path = {tiny_model!r}", code)
    before = metric(server, 'setpo_requests_total{route="/v1/diversity",status="200"}')
    run = subprocess.run(
        [sys.executable, "-c", runnable],
        cwd=tmp_path,
        env={**os.environ, "SETPO_URL": server.url},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{page}:\n{run.stderr[-3000:]}"
    assert metric(server, 'setpo_requests_total{route="/v1/diversity",status="200"}') >= before + 2  # shaped steps

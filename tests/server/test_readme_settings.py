"""The settings table of docs/service.md (the README links to it) lists every SETPO_* setting with its real
default, and nothing else."""

import os
import re
from pathlib import Path

from setpo_server.settings import Settings

SERVICE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next heading of the same or a higher level."""
    start = re.search(rf"^## {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert start, f"no '## {heading}' in {SERVICE_PAGE.name}"
    end = re.compile(r"^#{1,2} ", re.MULTILINE).search(text, start.end())
    return text[start.end() : end.start() if end else len(text)]


def test_service_page_lists_every_setting_with_its_default():
    settings = section(SERVICE_PAGE.read_text(), "Settings")  # the service's own table, not the deployment one
    rows = dict(re.findall(r"^\| `SETPO_([A-Z0-9_]+)` \| ([^|]+) \|", settings, re.MULTILINE))
    documented = {name.lower(): default.strip() for name, default in rows.items()}
    assert set(documented) == set(Settings.model_fields)
    for name, field in Settings.model_fields.items():
        default = field.default
        if name == "dtype_probe_cache":  # under the home folder: documented as a user reads it
            assert (
                default == Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "setpo/dtype-probe.json"
            )
            default = "~/.cache/setpo/dtype-probe.json"
        expected = "*(unset)*" if default is None else "*(empty)*" if default == "" else f"`{default}`"
        assert documented[name] == expected, name

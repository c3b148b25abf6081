"""The README's settings table lists every SETPO_* setting with its real default, and nothing else."""

import re
from pathlib import Path

from setpo_server.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_every_setting_with_its_default():
    text = README.read_text()
    section = text[text.index("### Settings") : text.index("### HTTP API")]  # the service's own table
    rows = dict(re.findall(r"^\| `SETPO_([A-Z_]+)` \| ([^|]+) \|", section, re.MULTILINE))
    documented = {name.lower(): default.strip() for name, default in rows.items()}
    assert set(documented) == set(Settings.model_fields)
    for name, field in Settings.model_fields.items():
        default = field.default
        expected = "*(unset)*" if default is None else "*(empty)*" if default == "" else f"`{default}`"
        assert documented[name] == expected, name

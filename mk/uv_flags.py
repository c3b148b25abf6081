"""Print `uv pip install` flags that install from where this machine's pip installs from.

uv reads no pip.conf and no PIP_* variable, so the Makefile hands it pip's own index settings, as `pip config list`
shows them (pip's config files, then PIP_* variables, the later overriding the earlier, as pip reads them):
index-url, extra-index-url, find-links and constraint. uv considers every index as pip does (unsafe-best-match:
the best version over all of them, not the first index that has the name). Nothing here names this machine's paths.
"""

import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}  # fmt: skip

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
ORDER = {"global": 0, "install": 1, ":env:": 2}  # pip's precedence: [install] over [global], PIP_* over both
found: list[tuple[int, str, str]] = []
for line in listed.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.rpartition(".")
    if name in FLAGS and section in ORDER:
        found.append((ORDER[section], name, value.strip().strip("'\"")))
settings = {name: value for _, name, value in sorted(found, key=lambda f: f[0])}
flags = ["--index-strategy", "unsafe-best-match"]
for name, flag in FLAGS.items():
    for value in settings.get(name, "").split():
        flags += [flag, value]
print(shlex.join(flags))

"""The callers' keys: SETPO_API_KEY (its caller is named "default") and SETPO_API_KEY_FILE, one key a line, `name=key`
or a bare key (named "key-<line number>"), blank lines and `#` comments skipped.

The file is looked at every RELOAD_SECONDS, so keys rotate without a restart (docs/service.md, "Keys and callers"): a
change is taken once two looks agree, and one that reads empty, unreadable or unparseable keeps the keys in force.
"""

import asyncio
import hmac
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("setpo_server")

DEFAULT_CALLER = "default"  # SETPO_API_KEY's caller
ANONYMOUS = "anonymous"  # a request no key names: no key is set, the route is open, or the key was refused
RELOAD_SECONDS = 1.0
# A file key shorter than this is taken for a line cut mid-write, or a bare key's '=' padding read as name=key.
MIN_KEY_CHARS = 16
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # it becomes a log field and a metric label


def parse_keys(text: str) -> dict[str, str]:
    """key -> caller name, from a key file's text. A ValueError names the line at fault, never what is on it."""
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, key = (part.strip() for part in line.partition("="))
        if not equals:
            name, key = f"key-{number}", line
        if not NAME.fullmatch(name):
            raise ValueError(f"line {number}: a name is 1-64 letters, digits, '_', '.' or '-' (name=key)")
        if len(key) < MIN_KEY_CHARS or not (key.isascii() and key.isprintable()) or " " in key:
            raise ValueError(
                f"line {number}: a key is at least {MIN_KEY_CHARS} printable ASCII characters without spaces "
                "(a bare key with '=' in it needs a name: name=key)"
            )
        if key in keys:
            raise ValueError(f"line {number}: a key given on an earlier line too")
        keys[key] = name
    if not keys:
        raise ValueError("no key in it (one a line: name=key, or a bare key)")
    return keys


def read_key_file(path: Path) -> str:
    # keys are ASCII: any other byte becomes U+FFFD, which parse_keys refuses with its line number
    return path.read_text(encoding="ascii", errors="replace")


@dataclass
class CallerKeys:
    """The keys accepted now and whose they are. Built at start: a configured key file must give keys then."""

    api_key: str | None  # SETPO_API_KEY
    path: Path | None  # SETPO_API_KEY_FILE
    text: str = ""  # the file's content in force
    from_file: dict[str, str] = field(default_factory=dict)  # key -> caller name, parsed from `text`
    seen: str | None = None  # the content of the last look; None: the file could not be read
    refused: str | None = None  # the last content refused, warned about once

    def __post_init__(self) -> None:
        if self.path is not None:
            self.text = self.seen = read_key_file(self.path)
            self.from_file = parse_keys(self.text)

    @property
    def required(self) -> bool:
        return self.api_key is not None or self.path is not None

    @property
    def callers(self) -> int:
        """How many callers the keys in force name."""
        return len(set(self.from_file.values()) | ({DEFAULT_CALLER} if self.api_key is not None else set()))

    def caller(self, token: str) -> str | None:
        """The name of the caller whose key this is, or None. Every key is compared, each in constant time."""
        candidates = list(self.from_file.items())
        if self.api_key is not None:
            candidates.append((self.api_key, DEFAULT_CALLER))
        presented, found = token.encode(), None
        for key, name in candidates:
            if hmac.compare_digest(presented, key.encode()) and found is None:
                found = name
        return found

    def reread(self) -> None:
        """One look at the key file (from a worker thread: a file read is I/O)."""
        assert self.path is not None
        try:
            text = read_key_file(self.path)
        except OSError as exc:
            if self.seen is not None:  # said once, when it goes
                log.warning(
                    "SETPO_API_KEY_FILE %s cannot be read (%s): the keys in force stay", self.path, exc.strerror
                )
            self.seen = None
            return
        previous, self.seen = self.seen, text
        if text != previous or text in (self.text, self.refused):
            return  # changed since the last look (taken if the next look agrees), or already judged
        try:
            keys = parse_keys(text)
        except ValueError as exc:
            self.refused = text
            log.warning("SETPO_API_KEY_FILE %s not taken, %s: the keys in force stay", self.path, exc)
            return
        self.text, self.from_file, self.refused = text, keys, None
        log.info(
            "SETPO_API_KEY_FILE %s taken: %d keys, callers %s",
            self.path,
            len(keys),
            ", ".join(sorted(set(keys.values()))),
        )


async def watch_key_file(keys: CallerKeys) -> None:
    """Runs for the service's life (app.py's lifespan) when SETPO_API_KEY_FILE is set."""
    while True:
        await asyncio.sleep(RELOAD_SECONDS)
        try:
            await asyncio.to_thread(keys.reread)
        except Exception:  # a dead watcher would leave the keys unrotatable without a word
            log.exception("SETPO_API_KEY_FILE %s: looking at it failed", keys.path)

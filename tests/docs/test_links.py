"""No dead relative link in README.md or docs/*.md: every linked file exists, and every `#anchor` names a heading
of its target page under GitHub's rules (lowercase, spaces to '-', punctuation dropped, repeats get -1, -2...).
Links and headings inside fenced code blocks and code spans are not links or headings, and are ignored."""

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold code spans (already blanked)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            continue
        if fence is not None:
            if line.lstrip().startswith(fence):
                fence = None
            continue
        yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered, lowercased; letters, digits, '_', '-' and spaces
    kept, everything else dropped; spaces become '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = re.sub(r"<[^>]+>", "", text)
    kept = "".join(c for c in text.lower() if c in " -" or unicodedata.category(c)[0] in "LMN" or c == "_")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(page.read_text()):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of every link that is not to another site."""
    for number, line in prose_lines(page.read_text()):
        line = CODE_SPAN.sub(lambda m: "code", line)
        definition = REFERENCE_DEFINITION.match(line)
        targets = [definition.group(1)] if definition else INLINE_LINK.findall(line)
        for target in targets:
            if not EXTERNAL.match(target):
                yield number, target


def dead_links(page: Path, root: Path = ROOT) -> list[str]:
    dead: list[str] = []
    for number, target in relative_links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / unquote(path)).resolve() if path else page
        if not where.exists():
            dead.append(f"{page.relative_to(root)}:{number}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and unquote(anchor) not in anchors(where):
            dead.append(f"{page.relative_to(root)}:{number}: {target} (no heading #{anchor} in {where.name})")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_dead_relative_link(page: Path) -> None:
    assert dead_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in relative_links(ROOT / "README.md")}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert unlinked == []


def test_slugs_follow_githubs_rules() -> None:
    assert slug("The diversity service") == "the-diversity-service"
    assert slug("HTTP API (contract v1)") == "http-api-contract-v1"
    assert slug("Evaluate a model: `setpo-eval`") == "evaluate-a-model-setpo-eval"
    assert slug("3\u20136. Peer, collapsed group, concurrency") == "36-peer-collapsed-group-concurrency"
    assert slug("9. bfloat16 on a CPU (2026-11-23, evening)") == "9-bfloat16-on-a-cpu-2026-11-23-evening"
    assert slug("`SETPO_COMPILE`, and the whole bench") == "setpo_compile-and-the-whole-bench"


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A page\n\n## Its section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#its-section) [ok](#here) [web](https://example.com/x.md)\n"
        "## Here\n```\n[in code](gone.md)\n```\n`[in a span](gone.md)`\n"
        "[missing](gone.md) [bad anchor](there.md#nowhere) [bad local](#nowhere)\n"
    )
    assert dead_links(page, root=tmp_path) == [
        "page.md:7: gone.md (no such file)",
        "page.md:7: there.md#nowhere (no heading #nowhere in there.md)",
        "page.md:7: #nowhere (no heading #nowhere in page.md)",
    ]

"""The README is the front page of docs/: every relative link in the README and docs/ resolves,
and every docs/ page is linked from the README."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t.split("#")[0] for t in LINK.findall(text) if not re.match(r"\w+:|#", t)]


def test_every_relative_link_resolves():
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in [README, *DOCS]
        for target in relative_links(page)
        if target and not (page.parent / target).exists()
    ]
    assert not broken


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t).resolve() for t in relative_links(README)}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_the_readme_is_a_front_page():
    """Issue 39: what it is, set-up, quick start, writing an env, the commands, links; the rest
    lives in docs/."""
    assert len(README.read_text().splitlines()) <= 250

"""Every link of the README and of every documentation page leads somewhere (issue 70): a
relative link to a file that exists, an anchor to a heading of its page, read as GitHub renders
them (the site's own build checks the pages again, tests/cluster/test_site.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"(?ms)^```.*?^```")
CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub (and Python-Markdown's toc) makes it."""
    text = re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", heading.strip()).lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(h) for h in re.findall(r"(?m)^#{1,6} (.+?)\s*#*$", text)}


def links(page: Path) -> list[str]:
    return LINK.findall(CODE.sub("", FENCE.sub("", page.read_text())))


def broken(page: Path) -> list[str]:
    found = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not followed offline
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            found.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            found.append(f"{target}: no heading #{anchor} in {where.name}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_page_leads_somewhere(page):
    assert not broken(page)


def test_the_check_can_fail(tmp_path):
    (tmp_path / "a.md").write_text("# A title\n\n## From `fit`: a script\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#a-title) [ok](a.md#from-fit-a-script) [gone](c.md)\n"
                    "[no](a.md#elsewhere) [web](https://example.org) `[code](x.md)`\n"
                    "```\n[fenced](y.md)\n```\n")
    assert broken(page) == ["c.md: no such file",
                            "a.md#elsewhere: no heading #elsewhere in a.md"]


def test_the_readme_is_a_front_door():
    """Under 250 lines, the two set-up commands in its first 40."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250
    head = "\n".join(lines[:40])
    assert "pip install -e . && hpctrain run" in head and \
        "pip install -e '.[test]' && pytest" in head

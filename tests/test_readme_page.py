"""The README as a user's page (issue 38): at most 300 lines, a table of contents whose links land on its headings,
every link to docs/ landing on a page and heading that exist, every docs page one link away, and every output it
shows an excerpt of an output the docs show in full (which tests/test_readme_live.py and others check against
real runs)."""

from __future__ import annotations

import re
from pathlib import Path

from .docs_text import README, ROOT, doc_pages, fenced_blocks

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _outside_fences(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to hyphens, -1, -2, ...
    after a repeated one."""
    seen: dict[str, int] = {}
    for line in _outside_fences(page.read_text()):
        heading = re.match(r"^#{1,6} (.+?)\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def _links(page: Path) -> list[str]:
    return [m.group(1) for line in _outside_fences(page.read_text()) for m in _LINK.finditer(line)]


def test_the_readme_is_one_page_with_a_table_of_contents():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move a section to docs/ and link it"
    start = next(i for i, line in enumerate(lines) if line.startswith("**Contents:**"))
    toc = " ".join(lines[start : lines.index("", start)])  # the paragraph
    targets = re.findall(r"\]\(#([^)]+)\)", toc)
    headings = anchors(README)
    assert len(targets) >= 10
    assert not set(targets) - headings, sorted(set(targets) - headings)
    # every `## ` section of the README is in the table of contents (a section added later is listed too)
    sections = {a for line in _outside_fences(README.read_text()) if line.startswith("## ") for a in anchors_of(line)}
    assert sections == set(targets), sorted(sections ^ set(targets))


def anchors_of(heading: str) -> set[str]:
    return {re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")}


def test_every_link_of_the_docs_lands_on_a_page_and_heading():
    broken = []
    for page in doc_pages():
        for link in _links(page):
            if re.match(r"^[a-z]+:", link):  # https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, broken


def test_every_docs_page_is_one_link_from_the_readme():
    """No document lost: the README's sections moved to docs/ whole, and each page is linked from the README."""
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links(README)}
    unlinked = [p.name for p in doc_pages()[1:] if p.resolve() not in linked]
    assert not unlinked, unlinked


def _plain_blocks(text: str) -> list[list[str]]:
    """The fenced blocks opened with a bare ``` (outputs), not those in a language (```bash, ```python)."""
    return fenced_blocks(text)


def test_every_output_the_readme_shows_is_an_excerpt_of_one_the_docs_show_in_full():
    """The README's examples are cut from the docs' full outputs (checked there against real runs): each of its
    lines is a line of one full output, in order, `...` eliding lines. The Python API's output is the README's
    own (tests/test_readme_live.py runs it)."""
    readme = README.read_text()
    own = readme.split("\n## Python API", 1)
    shown = _plain_blocks(own[0]) + _plain_blocks(own[1].split("\n## ", 1)[1] if "\n## " in own[1] else "")
    full = [block for page in doc_pages()[1:] for block in _plain_blocks(page.read_text())]
    assert len(shown) >= 6
    for excerpt in shown:
        wanted = [line for line in excerpt if line != "..."]

        def contains(block: list[str], wanted: list[str] = wanted) -> bool:
            at = 0
            for line in block:
                if at < len(wanted) and line.rstrip() == wanted[at].rstrip():
                    at += 1
            return at == len(wanted)

        assert any(contains(block) for block in full), "README output not in the docs:\n" + "\n".join(excerpt)

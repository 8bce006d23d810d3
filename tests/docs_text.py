"""The user's documentation as the tests read it: README.md (a page of at most 300 lines that links to the rest)
and the pages of docs/, where the README's long sections moved whole, headings kept (issue 38)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def doc_pages() -> list[Path]:
    """README.md first, then docs/*.md in name order."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def user_docs() -> str:
    """README.md and every docs/*.md page, one text (each page starts on a line of its own)."""
    return "".join("\n" + page.read_text() for page in doc_pages())


def section(title: str) -> str:
    """The `## title` section of the user's documentation (wherever it lives), up to the next `## ` heading or the
    end of its page; the heading must name exactly one section, so a moved section cannot be shadowed by a stale
    copy."""
    found = []
    for page in doc_pages():
        text = "\n" + page.read_text()
        for match in re.finditer(rf"(?m)^## {re.escape(title)}$", text):
            start = match.start() - 1
            end = text.find("\n## ", start + 1)
            found.append(text[start : end if end >= 0 else len(text)])
    assert len(found) == 1, f"the user's docs have {len(found)} sections headed '## {title}'"
    return found[0]


def fenced_blocks(text: str, lang: str = "") -> list[list[str]]:
    """The lines of each fenced block of `text` opened with exactly ```lang (fences paired in order; "": outputs)."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
                blocks.append((line[3:], current))
            else:
                current = None
        elif current is not None:
            current.append(line)
    return [body for opened, body in blocks if opened == lang]

"""Azure facts carry the date they were read, so that the next change of Azure's mind is found by
reading a list rather than by a failed deployment. The rule, checked in four places:

- docs/fake-readings.md: every row of the table holds ``read YYYY-MM-DD`` (or, where no source
  was found, ``as of YYYY-MM-DD``);
- docs/internals.md: every paragraph (lines between blank lines; a bullet list without blank
  lines is one) that cites an Azure source holds such a date;
- infra/sizes.py, infra/prices.py, trainer/launch/node_sizes.py: every comment block (consecutive
  ``#`` lines) that cites an Azure source holds one;
- infra/prices.py: every price (each ``VM_PER_HOUR`` entry and each float constant with
  ``_PER_`` in its name) has an entry in ``SOURCES`` naming where it was read and
  ``read YYYY-MM`` (a day may follow), and ``SOURCES`` names no price that is gone.

"Cites an Azure source" is ``AZURE_SOURCE``: an azure-docs path (``articles/``), a Microsoft Learn
address, an ``Azure/<repo>`` or azhpc-images reference, SupportArticles-docs, the azure-docs
repository, a Batch REST reference, or the Azure pricing pages. Dates must be real calendar dates.
"""

from __future__ import annotations

import datetime
import io
import re
import tokenize
from pathlib import Path

import pytest

from infra import prices

REPO = Path(__file__).resolve().parents[2]
AZURE_SOURCE = re.compile(
    r"articles/|learn\.microsoft\.com|\bAzure/[\w.-]+|azhpc-images|SupportArticles-docs"
    r"|azure-docs|Batch REST|Azure pricing|pricing/details|prices\.azure\.com",
    re.IGNORECASE,
)
DATED = re.compile(r"\b(?:read|as of)\s+(\d{4}-\d{2}-\d{2})\b", re.IGNORECASE)
# "unconfirmed as of": a figure kept from memory or an earlier table that no source could be
# found for on that date; the wording keeps it apart from one read then.
MONTH_READ = re.compile(r"\b(?:read|unconfirmed as of) (\d{4}-\d{2})(?:-\d{2})?\b")
CODE_FILES = ("infra/sizes.py", "infra/prices.py", "trainer/launch/node_sizes.py")


def has_date(text: str) -> bool:
    """Whether ``text`` holds ``read``/``as of`` followed by a real YYYY-MM-DD date."""
    for match in DATED.finditer(text):
        try:
            datetime.date.fromisoformat(match.group(1))
        except ValueError:
            continue
        return True
    return False


def undated_rows(markdown: str) -> list[str]:
    """The table rows (after the header's ``|---|`` line) without a date."""
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    return [row.split("|")[1].strip() for row in rows[2:] if not has_date(row)]


def undated_paragraphs(markdown: str) -> list[str]:
    """Paragraphs that cite an Azure source and hold no date, each named by its section and its
    first words."""
    found = []
    for section in re.split(r"\n(?=## )", markdown):
        heading = section.splitlines()[0]
        for paragraph in re.split(r"\n\s*\n", section):
            if AZURE_SOURCE.search(paragraph) and not has_date(paragraph):
                found.append(f"{heading}: {' '.join(paragraph.split()[:8])}")
    return found


def comment_blocks(source: str) -> list[tuple[int, str]]:
    """Each run of comments on consecutive lines: (first line, their text joined, ``#`` dropped)."""
    blocks: list[tuple[int, str]] = []
    last_line = -2
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line, text = token.start[0], token.string.lstrip("#").strip()
        if line == last_line + 1 and blocks:
            blocks[-1] = (blocks[-1][0], f"{blocks[-1][1]} {text}")
        else:
            blocks.append((line, text))
        last_line = line
    return blocks


def undated_comments(source: str) -> list[str]:
    return [
        f"line {line}: {text[:60]}"
        for line, text in comment_blocks(source)
        if AZURE_SOURCE.search(text) and not has_date(text)
    ]


def price_names() -> set[str]:
    constants = {
        name
        for name, value in vars(prices).items()
        if name.isupper() and "_PER_" in name and isinstance(value, float)
    }
    return {*prices.VM_PER_HOUR, *constants}


def test_every_reading_of_the_fakes_is_dated():
    text = (REPO / "docs" / "fake-readings.md").read_text(encoding="utf-8")
    assert undated_rows(text) == []


def test_every_paragraph_of_internals_citing_azure_is_dated():
    text = (REPO / "docs" / "internals.md").read_text(encoding="utf-8")
    assert undated_paragraphs(text) == []


@pytest.mark.parametrize("path", CODE_FILES)
def test_every_comment_citing_azure_in_the_size_and_price_tables_is_dated(path):
    assert undated_comments((REPO / path).read_text(encoding="utf-8")) == []


def test_every_price_names_its_source_and_when_it_was_read():
    sources = getattr(prices, "SOURCES", {})
    missing = sorted(price_names() - set(sources))
    stale = sorted(set(sources) - price_names())
    undated = sorted(name for name, text in sources.items() if not MONTH_READ.search(text))
    assert (missing, stale, undated) == ([], [], [])


def test_the_checks_catch_an_undated_fact():
    table = "| a | b |\n|---|---|\n| x | y (read 2026-11-28) |\n| z | `articles/x.md` |\n"
    assert undated_rows(table) == ["z"]
    assert has_date("(read 2026-11-28)") and not has_date("read 2026-13-40")
    doc = "## `m.py`\n\nAzure/Batch #1 says so.\n\nNo source.\n\narticles/x.md, read 2026-11-28\n"
    assert undated_paragraphs(doc) == ["## `m.py`: Azure/Batch #1 says so."]
    code = "# Azure/Batch #1 says\n# so.\nX = 1\n\n# articles/y.md,\n# read 2026-11-28\nY = 2\n"
    assert undated_comments(code) == ["line 1: Azure/Batch #1 says so."]

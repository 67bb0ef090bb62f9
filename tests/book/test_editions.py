"""The Portuguese and Chinese editions keep up with the English text, and keep the glossary.

* Every English message of every page (Sphinx's gettext builder, run on the current chapters)
  has a translation in both editions that is neither empty nor fuzzy; a failure names the file
  and the message. The statistics per page and language are printed at the end of the run.
* Every translated message keeps the glossary (``locales/glossary.csv``): an English message
  whose prose holds a checked term has the edition's rendering of it in its translation, and
  no edition uses a rendering that ``locales/avoid.csv`` rules out.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "_ext"))
import editions  # noqa: E402

STATS = ROOT / "_build" / "editions-stats.txt"


def test_the_glossary_is_the_editions():
    rows = editions.glossary()
    assert len(rows) == 120
    for row in rows:
        assert row["english"] and row["pt_BR"] and row["zh_CN"], row
    checked = [row for row in rows if row["check_english"]]
    assert len(checked) >= 40
    for row in checked:
        for column in ("check_english", "check_pt_BR", "check_zh_CN"):
            re.compile(row[column])  # each a valid pattern


@pytest.mark.parametrize("language", list(editions.EDITIONS))
def test_each_term_is_rendered_one_way(language):
    problems = [
        problem
        for path in sorted((ROOT / "locales" / language / "LC_MESSAGES").rglob("*.po"))
        for problem in editions.glossary_problems(path, language)
    ]
    assert not problems, f"{len(problems)} glossary problems:\n" + "\n".join(problems[:60])


@pytest.mark.parametrize("language", list(editions.EDITIONS))
def test_the_same_heading_is_translated_the_same_way(language):
    problems = editions.different_renderings(language)
    assert not problems, "\n".join(problems[:40])


def test_translations_keep_roles_code_math_and_links():
    problems = editions.lint_all()
    assert not problems, f"{len(problems)} messages lost something:\n" + "\n".join(problems[:60])


@pytest.mark.slow(seconds=40)
def test_every_english_message_is_translated(build):
    """The messages of the English build of this run (tests/book/conftest.py), the chapters as
    they are now, extracted from its parsed pages as Sphinx's gettext builder does."""
    assert build.ok, build.report()
    counts, problems = editions.compare(
        editions.messages_of_build(build.html_dir.parent / ".doctrees")
    )
    STATS.parent.mkdir(parents=True, exist_ok=True)
    STATS.write_text(editions.stats_table(counts) + "\n", encoding="utf8")
    assert counts, "the build holds no messages"
    assert not problems, (
        f"{len(problems)} messages untranslated or fuzzy (make translations, then translate "
        "them; locales/README.md):\n" + "\n".join(problems[:80])
    )


@pytest.mark.parametrize("language", list(editions.EDITIONS))
def test_the_strings_code_writes_have_translations(language):
    """The notes of the reader and practice copies, the practice buttons, the API page's note
    and myst-nb's folded cell label, in each edition's table (locales/strings/<lang>.json);
    the panels' strings are checked in the page (tests/book/test_browser_editions.py)."""
    import mhbook_sphinx
    import practice_notebooks
    import reader_notebooks

    used = [
        reader_notebooks.NOTE,
        practice_notebooks.NOTE_HEAD,
        practice_notebooks.NOTE_LISTED,
        practice_notebooks.NOTE_TODO,
        practice_notebooks.NOTE_NONE,
        practice_notebooks.NOTE_NUMBERS,
        mhbook_sphinx.PRACTICE_TEXT,
        mhbook_sphinx.PRACTICE_TIP,
        mhbook_sphinx.PRACTICE_DOWNLOAD_TIP,
        mhbook_sphinx.API_IN_ENGLISH,
        "Show code cell {type}",
        "Hide code cell {type}",
    ]
    table = editions.strings(language)
    missing = [text for text in used if not table.get(text)]
    assert not missing, missing

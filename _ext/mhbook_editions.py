"""Sphinx extension of the mhbook book: the language switcher of the English, Portuguese and
Chinese editions (``_ext/editions.py`` builds them; ``locales/README.md``).

Every page starts with a switcher, English / Português / 中文, whose links lead to the same page
in the other editions: English at the root of the HTML folder, each edition in a folder of its
own (``pt-BR/``, ``zh-CN/``). A translated page also says which English commit its text follows
(the last commit that changed the page's English source: ``make test`` fails while any message
of that source is untranslated or fuzzy, so the translation is of that text), and the page's
``<head>`` names its other editions (``<link rel="alternate" hreflang>``).
"""

from __future__ import annotations

import functools
import html
import subprocess
from pathlib import Path

from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[1]
#: Sphinx's language code: (the edition's folder and BCP 47 tag, its name in its own language).
#: English is the root; the order is the switcher's.
EDITIONS = {"en": ("", "English"), "pt_BR": ("pt-BR", "Português"), "zh_CN": ("zh-CN", "中文")}
LABEL = {"en": "Language", "pt_BR": "Idioma", "zh_CN": "语言"}
FOLLOWS = {
    "pt_BR": "Tradução do texto em inglês do commit {commit} ({date}).",
    "zh_CN": "本页译自英文版提交 {commit}（{date}）。",
}


@functools.cache
def english_commit(source: str) -> tuple[str, str] | None:
    """(short hash, date) of the last commit that changed ``source``, or None without git."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%h %cs", "--", source],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out[0], out[1]) if len(out) == 2 else None


def edition_links(language: str, pagename: str) -> dict[str, str]:
    """{language: the relative address of ``pagename`` in that edition}, from a page of the
    edition of ``language``."""
    up = "../" * pagename.count("/")
    if EDITIONS[language][0]:  # an edition lives one folder below the English root
        up += "../"
    return {
        lang: f"{up}{folder + '/' if folder else ''}{pagename}.html"
        for lang, (folder, _) in EDITIONS.items()
    }


def _switcher(app: Sphinx, pagename, templatename, context, doctree) -> None:
    language = app.config.language if app.config.language in EDITIONS else "en"
    if doctree is None or "body" not in context:
        return
    links = edition_links(language, pagename)
    items = []
    for lang, (folder, name) in EDITIONS.items():
        tag = folder or "en"
        if lang == language:
            items.append(f'<li><span aria-current="page" lang="{tag}">{name}</span></li>')
        else:
            items.append(
                f'<li><a href="{links[lang]}" hreflang="{tag}" lang="{tag}">{name}</a></li>'
            )
    note = ""
    if language in FOLLOWS:
        source = app.env.doc2path(pagename, False)
        found = english_commit(str(source))
        if found:
            text = FOLLOWS[language].format(commit=found[0], date=found[1])
            note = f'<p class="mhbook-edition-source">{html.escape(text)}</p>'
    nav = (
        f'<nav class="mhbook-languages" aria-label="{LABEL[language]}"><ul>'
        + "".join(items)
        + f"</ul>{note}</nav>\n"
    )
    context["body"] = nav + context["body"]
    alternates = "".join(
        f'<link rel="alternate" hreflang="{EDITIONS[lang][0] or "en"}" href="{href}" />\n'
        for lang, href in links.items()
        if lang != language
    )
    context["metatags"] = context.get("metatags", "") + alternates


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", _switcher)
    app.add_css_file("mhbook-editions.css")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

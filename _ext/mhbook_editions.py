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
import json
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


_PAGE: list = []  # the environment while Sphinx's Locale transform translates a page


def _translations_see_their_page() -> None:
    """Sphinx parses each translated message as a small document of its own (its Locale
    transform). Two things of the page are then out of its sight, and are given back here:

    * the page's glue data: myst-nb's ``{glue:text}`` roles look it up in the document being
      parsed, which holds no notebook, so a glued number in a translation is read from what
      myst-nb saved when it parsed the page (``retrieve_glue_data``, which the roles call);
    * the page's MyST heading slugs (``env.metadata[page]["myst_slugs"]``), which parsing a
      message replaces: links to the page's sections from other pages would break.
    """
    from myst_nb.ext.glue import directives, roles, utils
    from sphinx.transforms import i18n

    if getattr(i18n.Locale.apply, "mhbook", False):
        return
    locale_apply, retrieve = i18n.Locale.apply, utils.retrieve_glue_data

    def apply(self, **kwargs):
        metadata = self.env.metadata[self.env.docname]
        slugs = metadata.get("myst_slugs")
        _PAGE.append(self.env)
        try:
            return locale_apply(self, **kwargs)
        finally:
            _PAGE.pop()
            if slugs is not None:
                self.env.metadata[self.env.docname]["myst_slugs"] = slugs

    def retrieve_glue_data(document, key):
        try:
            return retrieve(document, key)
        except utils.RetrievalError:
            if not _PAGE:
                raise
            env = _PAGE[-1]
            # what myst-nb wrote when it parsed the page (sphinx_.py: "<page>.glue.json")
            path = Path(env.app.outdir).parent / "jupyter_execute" / f"{env.docname}.glue.json"
            glued = json.loads(path.read_text(encoding="utf8")) if path.is_file() else {}
            if key not in glued:
                raise
            return utils.VariableOutput(
                data=glued[key]["data"],
                metadata=glued[key].get("metadata", {}),
                nb_renderer=None,
                vtype="glue",
            )

    apply.mhbook = True
    i18n.Locale.apply = apply
    for module in (utils, roles, directives):
        if hasattr(module, "retrieve_glue_data"):
            module.retrieve_glue_data = retrieve_glue_data


def _translated_captions(app: Sphinx, doctree) -> None:
    """The parts' captions of the table of contents in the edition's language.

    sphinx-external-toc inserts the toctrees of ``_toc.yml`` after Sphinx's Locale transform
    has run, so their captions (in the root page's messages) are translated here."""
    from sphinx import addnodes
    from sphinx.locale import init as init_locale
    from sphinx.util.i18n import docname_to_domain

    if app.config.language not in EDITIONS or app.config.language == "en":
        return
    toctrees = [node for node in doctree.findall(addnodes.toctree) if node.get("caption")]
    if not toctrees:
        return
    dirs = [str(Path(app.srcdir) / d) for d in app.config.locale_dirs]
    domain = docname_to_domain(app.env.docname, app.config.gettext_compact)
    catalog, found = init_locale(dirs, app.config.language, domain)
    if found:
        for node in toctrees:
            node["caption"] = catalog.gettext(node["caption"])


def _strings_for_the_page(app: Sphinx, config) -> None:
    """On an edition's pages, its string table (``locales/strings/<lang>.json``) for
    ``mhbook-i18n.js``, which translates what the panels' scripts write."""
    path = ROOT / "locales" / "strings" / f"{config.language}.json"
    if config.language in EDITIONS and path.is_file():
        table = json.loads(path.read_text(encoding="utf8"))
        body = "window.mhbookStrings = " + json.dumps(table, ensure_ascii=False) + ";"
        app.add_js_file(None, body=body, priority=200)
    app.add_js_file("mhbook-i18n.js", priority=210)


def setup(app: Sphinx) -> dict:
    _translations_see_their_page()
    app.connect("config-inited", _strings_for_the_page)
    app.connect("doctree-read", _translated_captions)
    app.connect("html-page-context", _switcher)
    app.add_css_file("mhbook-editions.css")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

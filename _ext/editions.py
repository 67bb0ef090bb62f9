"""The Portuguese (pt-BR) and Chinese (zh-CN) editions: the English chapters, their prose
translated through Sphinx's gettext (``locales/README.md``).

    python _ext/editions.py update        # extract the English messages; update every .po
    python _ext/editions.py build [DIR]   # build each edition into DIR/<lang> (DIR: _build/html)
    python _ext/editions.py stats         # translated, fuzzy and empty messages per page
    python _ext/editions.py lint [PO]     # translations that lost a role, code, math or link
    python _ext/editions.py todo PO       # the messages of PO left to translate, numbered
    python _ext/editions.py show PO       # every message of PO and its translation, numbered
    python _ext/editions.py fill PO JSON  # write {n: translation} into PO, then lint it

An edition is built from the same notebooks as the English book, with the English build's
outputs: ``make book`` reuses the English build's Jupyter cache, the browser test builds from the
committed outputs as its English build does. Nothing is executed again.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mhbook_editions import EDITIONS as ALL_EDITIONS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCALES = ROOT / "locales"
#: Sphinx's language code: (the edition's folder and BCP 47 tag, its name in its own language).
EDITIONS = {language: edition for language, edition in ALL_EDITIONS.items() if language != "en"}
ENGLISH_CACHE = ROOT / "_build" / ".jupyter_cache"  # where `jupyter-book build .` executes


def edition_config(language: str, out_dir: Path, execute: str, root: Path = ROOT) -> Path:
    """A copy of ``_config.yml`` for one edition, written into ``out_dir``: ``language`` set,
    the local extensions' paths made absolute (the copy lives elsewhere), and the notebooks'
    outputs taken from the English build's Jupyter cache (``execute`` = ``"cache"``) or from
    the committed notebooks (``"off"``)."""
    with open(root / "_config.yml", encoding="utf8") as handle:
        config = yaml.safe_load(handle)
    config.setdefault("execute", {})["execute_notebooks"] = execute
    if execute == "cache":
        config["execute"]["cache"] = str(ENGLISH_CACHE)
    sphinx = config.setdefault("sphinx", {})
    for name, path in (sphinx.get("local_extensions") or {}).items():
        sphinx["local_extensions"][name] = str((root / path).resolve())
    sphinx.setdefault("config", {})["language"] = language
    if language in EDITIONS:  # the book's title, as the front page's messages translate it
        path = po_path(language, "intro")
        found = {m.id: m.string for m in catalogue(path) if m.id} if path.is_file() else {}
        config["title"] = found.get(config.get("title")) or config.get("title")
        for name in ("show", "hide"):  # myst-nb's label of a folded code cell
            english = f"{name.title()} code cell {{type}}"
            sphinx["config"][f"nb_code_prompt_{name}"] = translate(english, language)
    sphinx["config"]["locale_dirs"] = [str(root / "locales")]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"_config.{language}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf8")
    return path


def jupyter_book() -> str:
    found = Path(sys.executable).with_name("jupyter-book")
    return str(found) if found.exists() else "jupyter-book"


def build_edition(
    language: str,
    html_root: Path,
    execute: str = "cache",
    root: Path = ROOT,
    strict=True,
) -> subprocess.CompletedProcess:
    """Build the edition of ``language`` into ``html_root/<folder>`` (``pt-BR``, ``zh-CN``).
    Its API page links to the English one: the reference is the package's docstrings."""
    folder, _ = EDITIONS[language]
    work = Path(tempfile.mkdtemp(prefix=f"mhbook-{folder}-"))
    try:
        config = edition_config(language, work, execute, root)
        command = [jupyter_book(), "build", str(root), "--path-output", str(work)]
        command += ["--config", str(config)] + (["-W", "-n", "--keep-going"] if strict else [])
        proc = subprocess.run(
            command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if proc.returncode == 0 and "Executed notebook in" in proc.stdout:
            # an edition shows the English build's outputs: a notebook missing from its cache
            proc.returncode = 1  # was executed again, and its outputs may differ
            proc.stdout += (
                f"\n{language}: a notebook was executed again, not found in {ENGLISH_CACHE}"
            )
        if proc.returncode == 0:
            target = Path(html_root) / folder
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(work / "_build" / "html"), str(target))
        return proc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extract(out_dir: Path, root: Path = ROOT) -> subprocess.CompletedProcess:
    """The English messages of every page, as ``.pot`` files in ``out_dir`` (Sphinx's gettext
    builder; one file per page, ``gettext_compact`` is off)."""
    work = Path(tempfile.mkdtemp(prefix="mhbook-gettext-"))
    try:
        config = edition_config("en", work, "off", root)
        command = [jupyter_book(), "build", str(root), "--path-output", str(work)]
        command += ["--config", str(config), "--builder", "custom", "--custom-builder", "gettext"]
        proc = subprocess.run(
            command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if proc.returncode == 0:
            shutil.rmtree(out_dir, ignore_errors=True)
            shutil.move(str(work / "_build" / "gettext"), str(out_dir))
        return proc
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class Counts:
    translated: int = 0
    fuzzy: int = 0
    empty: int = 0

    @property
    def total(self) -> int:
        return self.translated + self.fuzzy + self.empty


def catalogue(path: Path):
    from babel.messages.pofile import read_po

    with open(path, "rb") as handle:
        return read_po(handle)


def messages(pot_dir: Path) -> dict[str, list[str]]:
    """{page: its English messages}, from the ``.pot`` files of :func:`extract`."""
    return {
        pot.relative_to(pot_dir).with_suffix("").as_posix(): [
            m.id for m in catalogue(pot) if m.id and isinstance(m.id, str)
        ]
        for pot in sorted(pot_dir.rglob("*.pot"))
    }


#: Pages whose text stays English in every edition: the API reference is the docstrings of
#: the package, which are code (the glossary's rule for code comments).
UNTRANSLATED = {"api"}


def messages_of_build(doctrees: Path) -> dict[str, list[str]]:
    """{page: its English messages}, from an English HTML build's parsed pages (its
    ``.doctrees`` folder), as Sphinx's gettext builder extracts them (``extract_messages``, the
    toctrees' captions first): the same messages as :func:`extract`'s, in seconds instead of a
    build. Images' alt texts are left out, as the gettext build leaves them out."""
    import pickle

    from docutils import nodes
    from sphinx import addnodes
    from sphinx.util.nodes import extract_messages

    env = pickle.loads((doctrees / "environment.pickle").read_bytes())
    found = {}
    for page in sorted(env.found_docs):
        doctree = pickle.loads((doctrees / f"{page}.doctree").read_bytes())
        listed = [
            m for t in env.tocs[page].findall(addnodes.toctree) for _, m in extract_messages(t)
        ]
        listed += [m for n, m in extract_messages(doctree) if not isinstance(n, nodes.image)]
        found[page] = list(dict.fromkeys(listed))
    return found


def po_path(language: str, page: str) -> Path:
    return LOCALES / language / "LC_MESSAGES" / f"{page}.po"


def compare(english: dict[str, list[str]]) -> tuple[dict, list[str]]:
    """({(language, page): Counts}, the problems) of the editions against the English messages
    ``english`` ({page: messages}, from :func:`messages` or :func:`messages_of_build`): an
    English message with no translation, or a fuzzy one, is a problem."""
    counts, problems = {}, []
    for page, ids in english.items():
        if page in UNTRANSLATED:
            continue
        for language in EDITIONS:
            path = po_path(language, page)
            found = {}
            if path.is_file():
                found = {m.id: m for m in catalogue(path) if m.id}
            c = counts[(language, page)] = Counts()
            for msgid in ids:
                m = found.get(msgid)
                short = " ".join(msgid.split())[:90]
                if m is None or not m.string:
                    c.empty += 1
                    problems.append(f"{path.relative_to(ROOT)}: untranslated: {short!r}")
                elif m.fuzzy:
                    c.fuzzy += 1
                    problems.append(f"{path.relative_to(ROOT)}: fuzzy: {short!r}")
                else:
                    c.translated += 1
    return counts, problems


def stats_table(counts: dict) -> str:
    lines = [f"{'page':<48} {'language':<8} {'done':>5} {'fuzzy':>5} {'empty':>5}"]
    for (language, page), c in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"{page:<48} {language:<8} {c.translated:>5} {c.fuzzy:>5} {c.empty:>5}")
    for language in EDITIONS:
        total = Counts()
        for (lang, _), c in counts.items():
            if lang == language:
                total.translated += c.translated
                total.fuzzy += c.fuzzy
                total.empty += c.empty
        lines.append(
            f"{'all pages':<48} {language:<8} {total.translated:>5} {total.fuzzy:>5} "
            f"{total.empty:>5}"
        )
    return "\n".join(lines)


# What a translation keeps exactly as the English message has it: MyST roles (for a role with
# a link text, ``{doc}`text <target>```, only the role and its target), inline code, inline math
# (pt-BR writes decimals with a comma there, ``$0{,}53$``), and links' targets.
ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
CODE = re.compile(r"``.+?``|`[^`]+`")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.S)
LINK = re.compile(r"\]\(([^)\s]*)\)")


def kept(text: str) -> list[str]:
    """The parts of a message that its translation must keep, sorted (see ROLE, CODE...)."""
    found = []
    for name, content in ROLE.findall(text):
        target = re.search(r"<([^>]+)>\s*$", content)
        found.append(f"{{{name}}}<{target.group(1)}>" if target else f"{{{name}}}`{content}`")
    rest = ROLE.sub(" ", text)
    found += CODE.findall(rest)
    rest = CODE.sub(" ", rest)
    found += [m.replace("{,}", ".") for m in MATH.findall(rest) if "\\text" not in m]
    found += [f"]({target})" for target in LINK.findall(MATH.sub(" ", rest))]
    return sorted(found)


def has_prose(msgid: str) -> bool:
    """Whether a message holds words to translate (not a number, code or math alone)."""
    if msgid.startswith("\n"):  # a display equation: only the words of its \text{...}
        return "\\text" in msgid
    rest = MATH.sub(" ", CODE.sub(" ", ROLE.sub(" ", msgid)))
    return re.search(r"[A-Za-z]{2}", rest) is not None


def lint(path: Path) -> list[str]:
    """The translated messages of one ``.po`` file that lose or change what they must keep."""
    problems = []
    for m in catalogue(path):
        if not m.id or not m.string:
            continue
        want, got = kept(m.id), kept(m.string)
        if want != got:
            missing = [x for x in want if x not in got]
            extra = [x for x in got if x not in want]
            problems.append(
                f"{path.relative_to(ROOT)}: {' '.join(m.id.split())[:70]!r}: "
                f"missing {missing}, not in the English {extra}"
            )
    return problems


def lint_all() -> list[str]:
    return [line for path in sorted(LOCALES.rglob("*.po")) for line in lint(path)]


def glossary() -> list[dict[str, str]]:
    """The rows of ``locales/glossary.csv``."""
    with open(LOCALES / "glossary.csv", encoding="utf8", newline="") as handle:
        return list(csv.DictReader(handle))


def prose(text: str) -> str:
    """A message without what is not prose: roles, code, math, links' targets, addresses (of a
    display equation, only the words of its ``\\text{...}``)."""
    if text.startswith("\n"):  # an equation's \text{...} may name an operator: not checked
        return ""
    text = MATH.sub(" ", CODE.sub(" ", ROLE.sub(" ", text)))
    return re.sub(r"<[^>\s]+>", " ", LINK.sub(" ", text))


def glossary_problems(path: Path, language: str) -> list[str]:
    """The translated messages of one ``.po`` file of ``language`` that break the glossary: an
    English message whose prose holds a checked term (``check_english``) must hold the
    edition's rendering (``check_<language>``), and no rendering of ``locales/avoid.csv``."""
    rules = [
        (
            re.compile(r["check_english"], re.I | re.M),
            re.compile(r[f"check_{language}"], re.I | re.M),
            r,
        )
        for r in glossary()
        if r["check_english"]
    ]
    with open(LOCALES / "avoid.csv", encoding="utf8", newline="") as handle:
        avoid = [
            (re.compile(row["pattern"]), row["why"])
            for row in csv.DictReader(handle)
            if row["language"] == language
        ]
    problems = []
    for m in catalogue(path):
        if not m.id or not m.string or m.fuzzy:
            continue
        english, text = prose(m.id), prose(m.string)
        where = f"{path.relative_to(ROOT)}: {' '.join(m.id.split())[:60]!r}"
        for find, want, row in rules:
            if find.search(english) and not want.search(text):
                problems.append(f"{where}: {row['english']!r} is {row[language]!r} here")
        for pattern, why in avoid:
            if pattern.search(text):
                problems.append(f"{where}: {pattern.pattern!r}: {why}")
    return problems


def different_renderings(language: str, longest: int = 80) -> list[str]:
    """The short English messages (headings, admonition titles, labels: at most ``longest``
    characters) that ``language``'s edition translates in more than one way."""
    seen: dict[str, dict[str, list[str]]] = {}
    for path in sorted((LOCALES / language / "LC_MESSAGES").rglob("*.po")):
        for m in catalogue(path):
            if m.id and m.string and not m.fuzzy and len(m.id) <= longest and has_prose(m.id):
                page = path.relative_to(LOCALES / language / "LC_MESSAGES").with_suffix("")
                seen.setdefault(m.id, {}).setdefault(m.string, []).append(page.as_posix())
    return [
        f"{language}: {english!r} is translated {len(ways)} ways: "
        + "; ".join(f"{text!r} ({', '.join(pages[:3])})" for text, pages in ways.items())
        for english, ways in seen.items()
        if len(ways) > 1
    ]


def todo(path: Path) -> list[dict]:
    """The messages of one ``.po`` file still to translate (empty or fuzzy), numbered."""
    return [
        {"n": n, "en": m.id, **({"fuzzy_was": m.string} if m.string else {})}
        for n, m in enumerate(m for m in catalogue(path) if m.id)
        if not m.string or m.fuzzy
    ]


def show(path: Path) -> list[dict]:
    """Every message of one ``.po`` file, numbered as :func:`fill` takes them, with its
    translation: for a reviewer."""
    return [
        {"n": n, "en": m.id, "tr": m.string}
        for n, m in enumerate(m for m in catalogue(path) if m.id)
    ]


def fill(path: Path, translations: dict) -> list[str]:
    """Write ``{n: translation}`` (numbers from :func:`todo`) into one ``.po`` file, fuzzy flags
    cleared; returns what :func:`lint` and :func:`glossary_problems` then find there."""
    from babel.messages.pofile import write_po

    po = catalogue(path)
    ordered = [m for m in po if m.id]
    for n, text in translations.items():
        m = ordered[int(n)]
        m.string = text
        m.flags.discard("fuzzy")
    with open(path, "wb") as handle:
        write_po(handle, po, width=-1)
    language = path.relative_to(LOCALES).parts[0]
    return lint(path) + glossary_problems(path, language)


STRINGS = LOCALES / "strings"


@functools.cache
def strings(language: str) -> dict[str, str]:
    """The edition's table of the strings that code writes (the reader and practice copies'
    notes, the page's JavaScript): ``locales/strings/<language>.json``, English to translation."""
    path = STRINGS / f"{language}.json"
    return json.loads(path.read_text(encoding="utf8")) if path.is_file() else {}


def translate(text: str, language: str | None = None) -> str:
    """``text`` in ``language``'s edition (None: English), from :func:`strings`; the English
    where the table has no translation yet (tests/book/test_editions.py fails then)."""
    return text if language is None else strings(language).get(text) or text


@functools.cache  # more messages than re's own cache holds, each sought in every copy
def _pattern(msgid: str) -> re.Pattern:
    """``msgid`` as it stands in a Markdown cell: the same words, any run of white space."""
    return re.compile(r"\s+".join(re.escape(word) for word in msgid.split()))


def translate_markdown(sources: list[str], language: str, page: str) -> tuple[list[str], list]:
    """The Markdown cells ``sources`` of ``page`` with each message replaced by its translation
    in ``language``, and the messages with words that were not found in them (they come from
    the outputs or from what a directive writes). The messages follow the page's order, so
    each is looked for after the one before it."""
    path = po_path(language, page)
    pairs = [(m.id, m.string) for m in catalogue(path) if m.id and m.string and not m.fuzzy]
    out, cell, at, unmatched = list(sources), 0, 0, []
    for msgid, text in pairs:
        if text == msgid:
            continue
        pattern = _pattern(msgid)
        for index in range(cell, len(out)):
            found = pattern.search(out[index], at if index == cell else 0)
            if found:
                out[index] = out[index][: found.start()] + text + out[index][found.end() :]
                cell, at = index, found.start() + len(text)
                break
        else:
            unmatched.append(msgid)
    return out, unmatched


def translated_notebook(path: Path, language: str):
    """The chapter notebook at ``path`` with its Markdown cells in ``language``; code cells,
    outputs and metadata are the English ones."""
    import copy

    import nbformat

    notebook = nbformat.read(path, as_version=4)
    page = path.relative_to(ROOT).with_suffix("").as_posix()
    markdown = [cell for cell in notebook.cells if cell.cell_type == "markdown"]
    texts, _ = translate_markdown([cell.source for cell in markdown], language, page)
    notebook = copy.deepcopy(notebook)
    for cell, text in zip([c for c in notebook.cells if c.cell_type == "markdown"], texts):
        cell.source = text
    return notebook


def update(pot_dir: Path) -> None:
    """Every edition's ``.po`` files brought up to the English messages (sphinx-intl: new
    messages empty, changed ones fuzzy, with the old translation kept as a starting point).
    A message with nothing to translate (a number, code or an equation without words) is
    filled with its English."""
    from babel.messages.pofile import write_po

    for pot in pot_dir.rglob("*.pot"):  # the API reference is the package's docstrings: code
        if pot.relative_to(pot_dir).with_suffix("").as_posix() in UNTRANSLATED:
            pot.unlink()
    languages = [arg for language in EDITIONS for arg in ("-l", language)]
    subprocess.run(
        [sys.executable, "-m", "sphinx_intl", "update", "-p", str(pot_dir), "-d", str(LOCALES)]
        + languages
        + ["--line-width", "-1"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for language in EDITIONS:
        for path in (LOCALES / language / "LC_MESSAGES").rglob("*.po"):
            po = catalogue(path)
            filled = 0
            for m in po:
                if m.id and not m.string and not has_prose(m.id):
                    m.string, filled = m.id, filled + 1
            if filled:
                with open(path, "wb") as handle:
                    write_po(handle, po, width=-1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=["update", "build", "stats", "lint", "todo", "show", "fill"],
    )
    parser.add_argument("html_root", nargs="?", default=str(ROOT / "_build" / "html"))
    parser.add_argument("translations", nargs="?", help="fill: a JSON file {n: translation}")
    parser.add_argument("--execute", default="cache", choices=["cache", "off"])
    args = parser.parse_args(argv)
    if args.command in ("todo", "show"):  # html_root: a .po file
        listed = (todo if args.command == "todo" else show)(Path(args.html_root).resolve())
        print(json.dumps(listed, ensure_ascii=False, indent=1))
        return 0
    if args.command == "fill":  # html_root: a .po file
        with open(args.translations, encoding="utf8") as handle:
            problems = fill(Path(args.html_root).resolve(), json.load(handle))
        print("\n".join(problems) or "filled; nothing lost, glossary kept")
        return 1 if problems else 0
    if args.command == "lint":  # html_root: a .po file or a folder of them
        target = (
            Path(args.html_root) if args.html_root != parser.get_default("html_root") else LOCALES
        )
        paths = [target] if target.is_file() else sorted(target.rglob("*.po"))
        problems = [line for path in paths for line in lint(path.resolve())]
        print("\n".join(problems) or f"{len(paths)} files: nothing lost")
        return 1 if problems else 0
    if args.command == "build":
        for language in EDITIONS:
            proc = build_edition(language, Path(args.html_root), args.execute)
            print(proc.stdout[-3000:] if proc.returncode else f"built {language}")
            if proc.returncode:
                return proc.returncode
        return 0
    pot_dir = ROOT / "_build" / "gettext"
    proc = extract(pot_dir)
    if proc.returncode:
        print(proc.stdout[-3000:])
        return proc.returncode
    if args.command == "update":
        update(pot_dir)
    counts, _ = compare(messages(pot_dir))
    print(stats_table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

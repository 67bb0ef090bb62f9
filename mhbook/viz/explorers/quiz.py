"""The chapters' quizzes: the one reading of a question's source, and the quiz in Jupyter and
Colab.

A question stands in a chapter's Markdown as a MyST directive (its text is the chapter's, so a
translation of the chapter translates it too)::

    :::{question} 04-split-shape
    :kind: shape
    :key: quiz_split_shape

    `x` has shape `(2, 5, 512)` and the layer 8 heads. What is the shape of `q` after the split?

    `(2, 8, 5, 64)`
    : Right: batch, heads, tokens, d_head = 512 / 8 = 64.

    `(2, 5, 8, 64)`
    : That is the shape after the `view`, before the heads move in front.
    :::

The paragraphs before the first choice are the question; each item of the definition list is
a choice (the term) with the explanation the reader sees on picking it (the definition). A
question's answer is either ``:answer: N`` (the N-th choice), or ``:key: NAME``: the value the
chapter's code glued as ``NAME``, so that the keyed answer cannot drift from the code (the
choice whose text is that value, or the number a reader types). Kinds: ``choice``, ``number``,
``shape``, ``mask`` (choices such as ```100/110/111```, rows of 0/1, 1 = may attend, drawn as
grids), ``bug`` (choices are lines of a snippet). A ``number`` question's terms are ``=`` (the
explanation of the right answer), anticipated wrong numbers, and ``?`` (any other number).

:func:`parse_question` is the one reading of that source: the book's Sphinx extension
(``_ext/mhbook_quiz.py``) parses each piece into the page, and :func:`quiz_html` renders it for
the reader copies (``notebooks/``), where :func:`show_quiz` shows it with the same JavaScript
(``static/quiz.js``) the book uses.
"""

from __future__ import annotations

import ast
import html
import re
import textwrap
from dataclasses import dataclass, field
from importlib import resources

__all__ = [
    "QUESTION_KINDS",
    "QuizError",
    "Choice",
    "Question",
    "parse_question",
    "parse_quiz",
    "glued_text",
    "resolve_answer",
    "quiz_html",
    "show_quiz",
]

QUESTION_KINDS = ("choice", "number", "shape", "mask", "bug")
RIGHT, OTHER = "=", "?"  # a number question's terms: the right answer, any other number
_OPTION = re.compile(r"^:([a-z]+):[ \t]*(.*)$")
_FENCE = re.compile(r"^(:{3,})\{question\}[ \t]*(\S*)[ \t]*$")
_MASK = re.compile(r"^[01]+(/[01]+)*$")


class QuizError(ValueError):
    """A question's source that the book cannot show or check."""


@dataclass
class Choice:
    """One choice: ``label`` (one line of Markdown) and ``feedback`` (Markdown), with the
    line of the label in the question's source."""

    label: str
    feedback: str
    line: int = 0

    @property
    def text(self) -> str:
        """The label as a value: surrounding backticks stripped (what a key is compared to)."""
        return self.label.strip().strip("`").strip()


@dataclass
class Question:
    """A question: its id, kind, prompt (Markdown), choices, and ``answer`` (the 1-based
    choice) or ``key`` (a glue name); ``tolerance`` for a number."""

    id: str
    kind: str = "choice"
    prompt: str = ""
    choices: list[Choice] = field(default_factory=list)
    answer: int | None = None
    key: str | None = None
    tolerance: float = 0.0
    value: float | None = None
    prompt_line: int = 0


def _dedent_definition(lines: list[str]) -> str:
    first, rest = lines[0], lines[1:]
    body = [first[1:].lstrip(" ")] + [line[2:] if line.startswith("  ") else line for line in rest]
    return "\n".join(body).strip("\n")


def parse_question(qid: str, body: str, *, where: str = "") -> Question:
    """A question from its directive's argument ``qid`` and ``body`` (the lines between the
    fences, options first). Raises :class:`QuizError` naming what is wrong and where."""
    at = f"{where}: question {qid!r}" if where else f"question {qid!r}"
    if not re.fullmatch(r"\d\d-[a-z0-9-]+", qid):
        raise QuizError(f"{at}: the id must be NN-words (the chapter's number, lower case)")
    lines = body.split("\n")
    question = Question(id=qid)
    n = 0
    while n < len(lines) and (m := _OPTION.match(lines[n])):
        name, value = m.groups()
        if name == "kind":
            if value not in QUESTION_KINDS:
                raise QuizError(f"{at}: kind must be one of {QUESTION_KINDS}, got {value!r}")
            question.kind = value
        elif name == "answer":
            if not value.isdigit():
                raise QuizError(f"{at}: answer must be a choice's number, got {value!r}")
            question.answer = int(value)
        elif name == "key":
            question.key = value
        elif name == "tolerance":
            question.tolerance = float(value)
        elif name == "value":  # a keyed number written out (the reader copies)
            question.value = float(value)
        else:
            raise QuizError(f"{at}: unknown option {name!r} (kind, answer, key, tolerance, value)")
        n += 1
    # The choices: a definition list, each term a line followed by ': ' definition lines.
    prompt, choices, i = [], [], n
    while i < len(lines):
        line = lines[i]
        if line.strip() and i + 1 < len(lines) and lines[i + 1].startswith(": "):
            j = i + 2
            while j < len(lines) and (lines[j].startswith("  ") or not lines[j].strip()):
                if not lines[j].strip() and not (
                    j + 1 < len(lines) and lines[j + 1].startswith("  ")
                ):
                    break
                j += 1
            choices.append(Choice(line.strip(), _dedent_definition(lines[i + 1 : j]), line=i))
            i = j
            continue
        if choices and line.strip():
            raise QuizError(f"{at}, line {i + 1}: text after the choices: {line.strip()!r}")
        if not choices:
            prompt.append(line)
        i += 1
    question.prompt = "\n".join(prompt).strip("\n")
    question.prompt_line = n + next((k for k, x in enumerate(prompt) if x.strip()), 0)
    question.choices = choices
    _check(question, at)
    return question


def _check(q: Question, at: str) -> None:
    if not q.prompt:
        raise QuizError(f"{at}: no question before the choices")
    if q.kind == "number":
        if q.answer is not None or (q.key is None) == (q.value is None):
            raise QuizError(f"{at}: a number question is keyed (:key:), not typed by hand")
        terms = [c.label for c in q.choices]
        for need in (RIGHT, OTHER):
            if need not in terms:
                raise QuizError(f"{at}: a number question needs the term {need!r}")
        for c in q.choices:
            if c.label not in (RIGHT, OTHER):
                try:
                    float(c.text)
                except ValueError:
                    raise QuizError(f"{at}: {c.label!r} is not a number, '=' or '?'") from None
        return
    if (q.answer is None) == (q.key is None) or q.value is not None:
        raise QuizError(f"{at}: give exactly one of :answer: and :key:")
    if len(q.choices) < 2:
        raise QuizError(f"{at}: a {q.kind} question needs at least 2 choices")
    if q.answer is not None and not 1 <= q.answer <= len(q.choices):
        raise QuizError(f"{at}: answer must be between 1 and {len(q.choices)}, got {q.answer}")
    if q.kind == "mask":
        for c in q.choices:
            if not _MASK.match(c.text):
                raise QuizError(
                    f"{at}: a mask choice is rows of 0/1 joined by '/', got {c.label!r}"
                )
    for c in q.choices:
        if not c.feedback.strip():
            raise QuizError(f"{at}: the choice {c.label!r} has no explanation")


def parse_quiz(markdown: str, *, where: str = "") -> list[Question]:
    """Every question in ``markdown`` (a chapter's Markdown cell), in order."""
    lines, out, i = markdown.split("\n"), [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, qid = m.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise QuizError(f"{where}: question {qid!r} is not closed by {fence}")
        out.append(parse_question(qid, "\n".join(lines[i + 1 : end]), where=where))
        i = end + 1
    return out


def glued_text(text_plain: str) -> str:
    """A glued value as a choice shows it: a glued string without its quotes, else its repr."""
    try:
        value = ast.literal_eval(text_plain)
    except (ValueError, SyntaxError):
        return text_plain
    return value if isinstance(value, str) else text_plain


def resolve_answer(q: Question, glued: dict[str, str]) -> int | float:
    """The right choice's 1-based number, or a number question's value. ``glued`` maps glue
    names to their ``text/plain`` output. Raises :class:`QuizError` when the chapter glued no
    such value, or when it is not exactly one of the choices."""
    if q.key is None:
        return q.value if q.kind == "number" else q.answer
    if q.key not in glued:
        raise QuizError(f"question {q.id!r}: the chapter glued no value named {q.key!r}")
    value = glued_text(glued[q.key])
    if q.kind == "number":
        try:
            return float(value)
        except ValueError:
            raise QuizError(f"question {q.id!r}: {q.key} = {value!r} is not a number") from None
    matches = [n for n, c in enumerate(q.choices, 1) if c.text == value]
    if len(matches) != 1:
        shown = [c.text for c in q.choices]
        raise QuizError(
            f"question {q.id!r}: the chapter's code gives {q.key} = {value!r}, which is "
            f"{'none' if not matches else 'more than one'} of the choices {shown}"
        )
    return matches[0]


# The reader copies: Markdown to HTML with markdown-it (MyST's own parser), math as MathML
# (latex2mathml), so that Jupyter and Colab show it without MathJax or a download.
_MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$", re.S)


def _markdown(text: str) -> str:
    from latex2mathml.converter import convert
    from markdown_it import MarkdownIt

    maths = []

    def stash(m):
        display = m.group(1) is not None
        maths.append(convert(m.group(1) or m.group(2), display="block" if display else "inline"))
        return f"MHBOOKMATH{len(maths) - 1}X"

    rendered = MarkdownIt("commonmark").render(_MATH.sub(stash, text))
    return re.sub(r"MHBOOKMATH(\d+)X", lambda m: maths[int(m.group(1))], rendered)


def _inline(text: str) -> str:
    out = _markdown(text).strip()
    return out.removeprefix("<p>").removesuffix("</p>")


def quiz_html(questions: list[Question], glued: dict[str, str] | None = None) -> str:
    """The questions as the page's markup (``static/quiz.js`` makes them answerable): the same
    elements and classes as the book's (``_ext/mhbook_quiz.py``)."""
    parts = []
    for q in questions:
        answer = resolve_answer(q, glued or {})
        attrs = f'data-quiz-id="{html.escape(q.id)}" data-kind="{q.kind}" data-answer="{answer}"'
        if q.kind == "number":
            attrs += f' data-tolerance="{q.tolerance}"'
        choices = "".join(
            f'<li class="mhbook-quiz-choice" data-value="{html.escape(c.text)}">'
            f'<div class="mhbook-quiz-label">{_inline(c.label)}</div>'
            f'<div class="mhbook-quiz-feedback">{_markdown(c.feedback)}</div></li>'
            for c in q.choices
        )
        parts.append(
            f'<div class="mhbook-quiz" {attrs}><div class="mhbook-quiz-prompt">'
            f'{_markdown(q.prompt)}</div><ol class="mhbook-quiz-choices">{choices}</ol></div>'
        )
    return "\n".join(parts)


def _static(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def show_quiz(source: str):
    """The quiz of a chapter's reader copy, in Jupyter or Colab: ``source`` is the questions'
    MyST text, with each keyed answer written in (``:answer: N`` or a number's ``:value: X``,
    as ``_ext/reader_notebooks.py`` writes them). Returns an ``IPython.display.HTML`` (its
    ``data`` is the HTML string)."""
    from IPython.display import HTML

    body = quiz_html(parse_quiz(textwrap.dedent(source)))
    return HTML(
        f"<div class='mhbook-quiz-set'><style>{_static('quiz.css')}</style>{body}"
        f"<script>{_static('quiz.js')}</script></div>"
    )

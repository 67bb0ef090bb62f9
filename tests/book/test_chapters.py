"""Fast checks of the committed chapters, without running them (nbval runs them).

Each chapter is listed in ``_toc.yml`` and exists; starts with the Colab cell of
``tests/colab_cell.py``, whose version and repository agree with the package and
``_config.yml``; was executed top to bottom in a fresh kernel (counts 1, 2, 3, ...) without an
error or a warning in its outputs; skips nothing in nbval and exempts few cells from the output
comparison; has one ``# Title`` and an Exercises section; and every figure it draws has a title
and alt text.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import nbformat
import pytest
from book_server import ROOT, load_yaml, repository, toc_files, toc_pages

COLAB_CELL = (ROOT / "tests" / "colab_cell.py").read_text(encoding="utf8")
# Of a chapter's code cells after the first, at most this many may be tagged
# nbval-ignore-output; each of them must assert the claim the prose makes of its output.
MAX_IGNORED_FRACTION = 0.5
FIRST_CELL_TAGS = {"nbval-ignore-output", "hide-input"}  # it prints the machine
SKIP_TAGS = {"nbval-skip", "skip-execution", "raises-exception", "nbval-raises-exception"}
SKIP_COMMENTS = ("# NBVAL_SKIP", "# NBVAL_RAISES_EXCEPTION")
IGNORE_TAG, IGNORE_COMMENT = "nbval-ignore-output", "# NBVAL_IGNORE_OUTPUT"
# Text that must not appear in a committed output: warnings, and the author's machine.
UNWANTED_OUTPUT = re.compile(
    r"Traceback \(most recent call last\)|\w*Warning: |/work/main|/root/|site-packages"
)


def _chapters() -> list[Path]:
    """The chapters of _toc.yml, then any chapters/*.ipynb that _toc.yml forgot."""
    listed = []
    try:
        listed = [p.source for p in toc_pages() if p.source.suffix == ".ipynb"]
    except (OSError, ValueError):
        pass  # test_toc_chapters_exist says why
    on_disk = sorted((ROOT / "chapters").glob("*.ipynb"))
    return listed + [p for p in on_disk if p not in listed]


CHAPTERS = _chapters()


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _first_line(cell) -> str:
    return cell.source.lstrip().split("\n", 1)[0].strip()


def _markdown_headings(nb) -> list[tuple[int, str]]:
    """``(level, text)`` of every Markdown heading, code fences skipped."""
    headings = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        fence = None
        for line in cell.source.splitlines():
            marker = re.match(r"\s*(```+|~~~+|:::+)", line)
            if marker:
                token = marker.group(1)[0] * 3
                fence = None if fence == token else (fence or token)
                continue
            match = re.match(r"(#{1,6})\s+(.+?)\s*#*\s*$", line)
            if fence is None and match:
                headings.append((len(match.group(1)), match.group(2)))
    return headings


# --------------------------------------------------------------------------- the book as a whole


def test_toc_chapters_exist():
    try:
        pages = toc_pages()
    except FileNotFoundError as err:
        pytest.fail(str(err), pytrace=False)
    chapters = [p for p in pages if p.file.startswith("chapters/")]
    assert chapters, "_toc.yml lists no chapters/..."
    for page in chapters:
        assert page.source.suffix == ".ipynb", f"{page.file}: a chapter must be a notebook"


def test_every_chapter_is_in_the_toc():
    listed = {str(Path(f).with_suffix("")) for f in toc_files()}
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    orphans = [p.name for p in chapters if f"chapters/{p.stem}" not in listed]
    assert not orphans, f"chapters missing from _toc.yml: {orphans}"


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf8")
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)["project"]["version"]
    return re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.M).group(1)


def test_colab_cell_version_matches_package():
    import mhbook

    match = re.search(r'^MHBOOK_VERSION = "([^"]+)"$', COLAB_CELL, flags=re.M)
    assert match, 'tests/colab_cell.py must set MHBOOK_VERSION = "x.y.z"'
    assert match.group(1) == mhbook.__version__ == _pyproject_version(), (
        f"colab cell {match.group(1)}, mhbook.__version__ {mhbook.__version__}, "
        f"pyproject.toml {_pyproject_version()}"
    )


def test_colab_cell_uses_configured_repository():
    url, _, _ = repository()
    assert url.startswith("https://github.com/"), f"_config.yml repository.url is {url!r}"
    want = f"git+{url}@v{{MHBOOK_VERSION}}"
    assert want in COLAB_CELL, f"tests/colab_cell.py should install {want}"
    launch = (load_yaml(ROOT / "_config.yml").get("launch_buttons") or {}).get("colab_url", "")
    assert launch.rstrip("/") == "https://colab.research.google.com", (
        f"_config.yml launch_buttons.colab_url is {launch!r}"
    )


# --------------------------------------------------------------------------- each chapter

per_chapter = pytest.mark.parametrize(
    "path", CHAPTERS, ids=[p.stem for p in CHAPTERS] if CHAPTERS else None
)


@per_chapter
def test_is_valid_notebook(path):
    nbformat.validate(_read(path))


@per_chapter
def test_first_code_cell_is_colab_cell(path):
    code = _code_cells(_read(path))
    assert code, f"{path.name} has no code cell"
    assert code[0].source.strip("\n") == COLAB_CELL.strip("\n"), (
        f"{path.name}: the first code cell must be exactly tests/colab_cell.py"
    )
    assert FIRST_CELL_TAGS <= _tags(code[0]), (
        f"{path.name}: tag the first code cell {sorted(FIRST_CELL_TAGS)} (it prints the machine, "
        "and the page should open on the chapter's first idea)"
    )


@per_chapter
def test_executed_in_order(path):
    counts = [c.execution_count for c in _code_cells(_read(path)) if not _is_widget_twin(c)]
    if counts != list(range(1, len(counts) + 1)):
        shown = counts if len(counts) <= 12 else [*counts[:12], "..."]
        pytest.fail(
            f"{path.name}: execution counts {shown}, not 1..{len(counts)}; run it top to bottom "
            "in a fresh kernel (jupyter nbconvert --to notebook --execute --inplace ...)",
            pytrace=False,
        )


@per_chapter
def test_no_errors_or_warnings_in_outputs(path):
    problems = []
    for n, cell in enumerate(_code_cells(_read(path)), start=1):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                problems.append(f"cell {n}: {out.ename}: {out.evalue}")
                continue
            texts = [out.get("text", "")] + [
                str(out.get("data", {}).get(kind, "")) for kind in ("text/plain", "text/html")
            ]
            for text in texts:
                found = UNWANTED_OUTPUT.search(text)
                if found:
                    start = max(0, found.start() - 60)
                    problems.append(f"cell {n}: ...{text[start : found.end() + 60]!r}...")
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


# A random tensor drawn on a GPU comes from the GPU's own generator: other numbers than the
# page shows, and the CPU's generator then falls out of step for every later draw.
RANDOM_ON_DEVICE = re.compile(r"torch\.(?:randn|rand|randint|randperm|normal)\([^\n]*\bdevice=")
# .numpy() of a tensor on a GPU raises: chapters write .cpu().numpy().
NUMPY_WITHOUT_CPU = re.compile(r"(?<!\.cpu\(\))\.numpy\(\)")


@per_chapter
def test_chapters_print_the_same_on_a_gpu(path):
    """Random numbers are drawn on the CPU and moved (``torch.randn(...).to(device)``), so a
    GPU prints the page's numbers; tensors reach NumPy through ``.cpu()``."""
    problems = []
    for n, cell in enumerate(_code_cells(_read(path)), start=1):
        for line in cell.source.splitlines():
            if RANDOM_ON_DEVICE.search(line) or NUMPY_WITHOUT_CPU.search(line):
                problems.append(f"cell {n}: {line.strip()}")
    assert not problems, (
        f"{path.name}: draw on the CPU then .to(device), and write .cpu().numpy():\n  "
        + "\n  ".join(problems)
    )


@per_chapter
def test_nbval_checks_every_cell(path):
    nb = _read(path)
    code = _code_cells(nb)
    skipped = [  # only an ipywidgets twin, which readers run (see test_widget_twins_...)
        n
        for n, c in enumerate(code, start=1)
        if (_tags(c) & SKIP_TAGS or _first_line(c).upper().startswith(SKIP_COMMENTS))
        and not _is_widget_twin(c)
    ]
    assert not skipped, f"{path.name}: cells {skipped} are skipped or expected to fail"
    notebook_level = {k: v for k, v in nb.metadata.items() if "nbval" in k or "skip" in k}
    mode = nb.metadata.get("mystnb", {}).get("execution_mode")
    assert not notebook_level and mode != "off", f"{path.name}: notebook-level skip {nb.metadata}"
    ignored = {
        n: c
        for n, c in enumerate(code, start=1)
        if n > 1
        and (IGNORE_TAG in _tags(c) or _first_line(c).upper().startswith(IGNORE_COMMENT))
        and not _glue_only(c)  # glues a quiz's key: shows nothing, claims nothing
    }
    assert len(ignored) <= MAX_IGNORED_FRACTION * (len(code) - 1), (
        f"{path.name}: {len(ignored)} of {len(code) - 1} code cells are nbval-ignore-output "
        f"(cells {list(ignored)}); keep that for training results and timings"
    )
    # A cell whose output nbval does not compare must still check what the prose claims.
    # (A cell tagged remove-output shows the reader nothing, e.g. an ipywidgets twin.)
    unchecked = [
        n
        for n, c in ignored.items()
        if "assert" not in c.source and "remove-output" not in _tags(c)
    ]
    assert not unchecked, (
        f"{path.name}: cells {unchecked} are nbval-ignore-output but assert nothing; assert the "
        "claim the text makes of their output (it still runs under nbval)"
    )


def _glue_only(cell) -> bool:
    """A cell of ``mhbook.glue(...)`` calls (the quizzes' keys), and assignments to names that
    start with ``quiz_``: it prints nothing, and what it glues is checked where the quiz uses it
    (tests/book/test_quiz.py, and the book's build)."""

    def quiet(s):
        if isinstance(s, ast.Assign):
            return all(isinstance(t, ast.Name) and t.id.startswith("quiz_") for t in s.targets)
        return (
            isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)
            and ast.unparse(s.value.func) in ("mhbook.glue", "glue")
        )

    body = ast.parse(cell.source).body
    return bool(body) and all(quiet(s) for s in body)


@per_chapter
def test_title_and_exercises(path):
    headings = _markdown_headings(_read(path))
    assert headings and headings[0][0] == 1, f"{path.name} must open with a '# Title' heading"
    titles = [text for level, text in headings if level == 1]
    assert len(titles) == 1, f"{path.name} has several '# ' titles: {titles}"
    assert any(level > 1 and re.match(r"exercises?\b", t, re.I) for level, t in headings), (
        f"{path.name} has no '## Exercises' section"
    )


# --------------------------------------------------------------------------- figures have titles


def _plot_title_positions() -> dict[str, int]:
    """mhbook.viz.plot functions taking ``title``: name -> its positional index."""
    from mhbook.viz import plot

    found = {}
    for name, func in inspect.getmembers(plot, inspect.isfunction):
        params = list(inspect.signature(func).parameters)
        if "title" in params and not name.startswith("_"):
            found[name] = params.index("title")
    return found


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _sets_title(tree: ast.AST, helpers: set[str], positions: dict[str, int]) -> bool:
    """Whether code sets a figure title, by any call it makes directly."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if name in ("set_title", "suptitle", "title") or name in helpers:
            return True
        for keyword in node.keywords:
            if keyword.arg in ("title", "suptitle") and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value in (None, "")
            ):
                return True
        if name in positions and len(node.args) > positions[name]:
            return True
    return False


def _parse(source: str) -> ast.AST | None:
    # IPython magics and shell escapes are not Python
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


# Chapters whose figures do not have alt text yet (issue 9); each must leave this set soon.
ALT_TEXT_PENDING: set[str] = set()
MIN_ALT_WORDS = 8  # "Heatmap of the weights" says too little: say what the figure shows


@per_chapter
def test_every_figure_has_alt_text(path):
    """Every cell that draws a figure gives its image alt text that says what it shows.

    myst-nb writes a cell's ``metadata.mystnb.image.alt`` into the ``<img alt="...">`` of the
    cell's outputs; without it Sphinx falls back to the image's file name, a hash.
    """
    if path.stem in ALT_TEXT_PENDING:
        pytest.skip(f"{path.name}: alt text pending (ALT_TEXT_PENDING)")
    missing = []
    for n, cell in enumerate(_code_cells(_read(path)), start=1):
        draws = any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt", "")
        if draws and len(str(alt).split()) < MIN_ALT_WORDS:
            missing.append(f"cell {n}: {cell.source[:60]!r} (alt: {alt!r})")
    assert not missing, (
        f"{path.name}: figures without alt text (set the cell's metadata "
        '{"mystnb": {"image": {"alt": "what the figure shows"}}}):\n  ' + "\n  ".join(missing)
    )


@per_chapter
def test_every_figure_has_a_title(path):
    """A weak check: the cell that draws a figure calls something that sets a title.

    Counted as setting one: ``ax.set_title``, ``fig.suptitle``, ``plt.title``, a ``title=``
    argument, an ``mhbook.viz.plot`` function given its title positionally, or a function defined
    earlier in the notebook that does one of these.
    """
    positions = _plot_title_positions()
    helpers: set[str] = set()
    untitled = []
    for n, cell in enumerate(_code_cells(_read(path)), start=1):
        tree = _parse(cell.source)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.FunctionDef) and _sets_title(node, helpers, positions):
                helpers.add(node.name)
        draws = any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))
        if not draws:
            continue
        titled = _sets_title(tree, helpers, positions) if tree else "title" in cell.source
        if not titled:
            untitled.append(f"cell {n}: {cell.source[:80]!r}")
    assert not untitled, f"{path.name}: figures without a title:\n  " + "\n  ".join(untitled)


# --------------------------------------------------------------------------- numbers in the prose

# A decimal number in the text (0.53, 1.2, 10^{-6}) is a claim about a result. It must stand in
# one of the chapter's outputs or in its code (where an assert pins it), or be glued. Exact
# facts that are neither, e.g. a constant of mathematics, are listed here with their reason.
PROSE_DECIMALS_ALLOWED = {
    "02-scaled-dot-product-attention": {"0.125": "1/8", "2.77": "log 16"},
    "03-masking": {"103.3": "log of float32's smallest subnormal, 2^-149"},
    "05-positional-encoding": {"6.3": "2 pi", "0.71": "1/sqrt(2)"},
    "06-transformer": {"0.9": "Adam's beta_1 of the paper", "0.98": "Adam's beta_2 of the paper"},
    "14-a-small-llama": {"0.99": "nanoGPT's beta2 in config/train_shakespeare_char.py"},
    "15-heads-in-a-language-model": {
        "3.0": "ln 20, a uniform guess over 20 characters",
        "3.47": "ln 32, a uniform guess over the Train panel's 32 tokens",
    },
    "10-sharing-keys-and-values": {
        "13.5": "Llama 2 7B's 6.74e9 weights in 16-bit: 13.5 GB",
        "8.0": "CUDA compute capability 8.0 (Ampere), which FlashAttention and cuDNN need",
    },
    "12-sliding-windows": {
        "3.9": "a hint's arithmetic: 32,000 tokens x 128 KiB = 3.9 GiB",
        "0.5": "a hint's arithmetic: 4,096 tokens x 128 KiB = 0.5 GiB",
        "7.2": "Mistral 7B's 7,241,732,096 weights, in billions",
        "13.5": "those weights in 16-bit: 14.5e9 bytes = 13.5 GiB",
    },
}
_FENCE = re.compile(r"^(```|~~~|:::).*?^\1", flags=re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`]*`")  # also {glue:text}`name:.2f` and {cite}`key`
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
_POWER_OF_TEN = re.compile(r"10\^\{?(-?\d+)\}?")


def _prose(cell_source: str) -> str:
    """A Markdown cell's text without code blocks, inline code, roles and link targets.

    The contents of admonitions and dropdowns (``` fences with a directive) are prose: keep
    them, drop only the fence lines.
    """
    directive = re.compile(r"^```\{[^}]+\}.*$|^:[\w-]+:.*$|^```\s*$", flags=re.M)
    text = directive.sub("", cell_source) if "```{" in cell_source else cell_source
    text = _FENCE.sub("", text)
    return _LINK_TARGET.sub("]", _INLINE_CODE.sub("", text))


def _evidence(nb) -> str:
    """Everything a number in the prose may come from: the code and its printed outputs."""
    parts = []
    for cell in _code_cells(nb):
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append(str(out.get("text", "")))
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


@per_chapter
def test_decimals_in_the_prose_come_from_outputs(path):
    """Every decimal number and power of ten quoted in the text stands in an output or in the
    code of the chapter (or is glued, or a listed exact fact).

    Integers are not checked: the prose is full of exact ones (exercise numbers, sizes, hand-set
    examples, configs), and telling a quoted result from a fact needs a reader. CONTRIBUTING.md's
    checklist covers them.
    """
    nb = _read(path)
    evidence = _evidence(nb)
    allowed = PROSE_DECIMALS_ALLOWED.get(path.stem, {})
    unbacked = []
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = _prose(cell.source)
        for number in _DECIMAL.findall(text):
            if number not in allowed and not re.search(rf"(?<![\d.]){re.escape(number)}", evidence):
                unbacked.append(f"cell {n}: {number}")
        for exponent in _POWER_OF_TEN.findall(text):
            e = int(exponent)
            forms = {
                f"1e{e}",
                f"1e{e:+03d}",
                f"1e{e:03d}",
                f"{10.0**e:g}",
                f"{10**e}" if e >= 0 else "",
            }
            if not any(f and f in evidence for f in forms):
                unbacked.append(f"cell {n}: 10^{exponent}")
    assert not unbacked, (
        f"{path.name}: numbers in the text that no output or code of the chapter shows "
        "(glue them, print them, or list an exact fact in PROSE_DECIMALS_ALLOWED):\n  "
        + "\n  ".join(unbacked)
    )


# ------------------------------------------------------------- nbval runs on other CPU kernels


def test_nbval_covers_other_kernels_and_thread_counts():
    """chapters/conftest.py gives the chapters, between them, every kernel set and thread
    count it lists, so each ``pytest --nbval chapters`` proves non-native settings too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "chapters_conftest", ROOT / "chapters" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    settings = [module.setting_for(i) for i in range(len(CHAPTERS))]
    kernels = {s["ATEN_CPU_CAPABILITY"] for s in settings}
    threads = {s["OMP_NUM_THREADS"] for s in settings}
    assert kernels == {None, "default", "avx2"}, kernels
    assert threads == {"1", "2", "4"}, threads
    # Each non-native kernel meets more than one thread count.
    for kernel in ("default", "avx2"):
        assert (
            len({s["OMP_NUM_THREADS"] for s in settings if s["ATEN_CPU_CAPABILITY"] == kernel}) > 1
        )


WIDGET_TWINS = re.compile(
    r"\b(attention_explorer|softmax_explorer|mask_explorer|positional_explorer|attention_viewer)\("
)
TWIN_TAGS = {"skip-execution", "nbval-skip", "remove-output"}


def _is_widget_twin(cell) -> bool:
    """A cell that only opens an explorer's ipywidgets twin, tagged to run for readers only."""
    tags = set(cell.get("metadata", {}).get("tags", []))
    return bool(WIDGET_TWINS.search(cell.source)) and TWIN_TAGS <= tags


@per_chapter
def test_widget_twins_are_not_executed_headless(path):
    """A cell that opens an ipywidgets twin is run by readers only: executing widget cells
    without a frontend can block nbclient (jupyter/nbclient#312), so neither the book build
    (``skip-execution``) nor nbval (``nbval-skip``) runs it, and it holds no outputs."""
    wrong = []
    for cell in _code_cells(_read(path)):
        if WIDGET_TWINS.search(cell.source):
            tags = set(cell.get("metadata", {}).get("tags", []))
            if not TWIN_TAGS <= tags or cell.get("outputs"):
                wrong.append(f"{cell.get('id')}: tags {sorted(tags)}, {len(cell.outputs)} outputs")
    assert not wrong, f"{path.name}: widget cells to tag {sorted(TWIN_TAGS)}: {wrong}"


PART_III_TRAINING = ("09-", "10-", "11-", "12-")  # the chapters of Part III that train


@pytest.mark.parametrize("prefix", PART_III_TRAINING)
def test_part_iii_trains_larger_on_a_gpu(prefix):
    """Issue 8: Part III trains CPU-sized by default and larger on a GPU, through
    ``mhbook.cpu_or_gpu`` (whose GPU sizes a maintainer checks with MHBOOK_GPU_SIZES=1)."""
    path = next(p for p in CHAPTERS if p.name.startswith(prefix))
    code = "\n".join(c.source for c in _code_cells(_read(path)))
    assert "mhbook.cpu_or_gpu(" in code, f"{path.name}: size its training with mhbook.cpu_or_gpu"

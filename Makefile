# Two entry points, both safe on a fresh machine:
#   make book   set up .venv and build the HTML book into _build/html (executes the chapters),
#               then its Portuguese and Chinese editions into _build/html/pt-BR and zh-CN
#   make test   set up .venv and run every test: ruff, pytest, nbval on every chapter,
#               and the browser test of the built book (.ci/run runs exactly this)
#   make quick  ruff and the tests not marked slow, in under 90 s on 2 cores
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup chromium book test quick bench notebooks translations

setup: $(VENV)/.installed

# uv installs the pinned environment in about 30 s where pip takes about 70 s (2 cores, empty
# pip cache); pip is the fallback if uv fails. --compile-bytecode as pip does: without the .pyc
# files every kernel and worker compiles torch & co. again (PYTHONDONTWRITEBYTECODE may be
# set), which made the tests 90 s slower. uv does not read pip's configuration, so pip's
# find-links (where a machine keeps wheels on disk, here the CPU build of torch) are handed on.
# jupyter-events asks for jsonschema's format checkers; one of them, rfc3987-syntax, builds a
# Lark grammar whenever jsonschema is imported: 2 CPU-s in every process that reads a notebook
# (nbformat) or glues a number (myst-nb), some twenty in `make test`. Nothing here checks the
# syntax of IRIs, and jsonschema leaves that checker out when the package is missing.
FIND_LINKS = $(sort $(shell python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$$/\1/p"))

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==0.13.9
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) \
		-r requirements.txt -e . || $(BIN)/python -m pip install --quiet -r requirements.txt -e .
	$(BIN)/python -m pip uninstall --quiet --yes rfc3987-syntax
	touch $@

# Debian's Chromium for the browser test (Playwright drives it; no browser is downloaded).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

# The editions reuse the English build's Jupyter cache: nothing is executed again.
book: setup
	$(BIN)/jupyter-book build . -W -n --keep-going
	$(BIN)/python _ext/editions.py build _build/html

# After changing the English text: extract its messages and bring every edition's .po files up
# to them (new messages empty, changed ones fuzzy), then print what is left to translate
# (locales/README.md). make test fails while any message is empty or fuzzy.
translations: setup
	$(BIN)/python _ext/editions.py update

# Three pytest-xdist workers on two cores, a whole file (a chapter's kernel) on each: the
# browser test's worker mostly waits for Chromium, the other two run chapters, whose training
# runs on one thread (chapters/conftest.py, which also runs each chapter on another CPU kernel
# set and thread count than the native ones). The longest files go first (the `slow` mark:
# a chapter's seconds are those of its committed run, a slow test file states its own;
# tests/conftest.py; --no-loadscope-reorder keeps that order, where xdist would sort the files
# by their number of tests), so that the short unit tests fill the end of the run.
test: setup chromium
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=15 --nbval --nbval-current-env chapters tests

# The fast tests while you work, under 90 s on 2 cores: ruff, then every test file not marked
# `slow` (no chapters, no book build, no browser on the built book, no fresh environments, no
# processes started), on two workers. `make test` runs all of them and more.
quick: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/pytest -m "not slow" -n 2 -q --durations=10 tests

bench: setup
	$(BIN)/python -m benchmarks.bench

# The chapters as Colab and Jupyter show them (glued numbers written out), and their practice
# copies (the cells tagged practice:<function>=<check> as stubs, each followed by its check): run
# after executing or tagging a chapter; tests/book/test_reader_notebooks.py and
# tests/book/test_practice_notebooks.py fail while notebooks/ or practice/ is stale.
notebooks: setup
	$(BIN)/python _ext/reader_notebooks.py
	$(BIN)/python _ext/practice_notebooks.py

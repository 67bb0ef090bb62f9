"""Results measured by the benchmarks that a CPU chapter cannot afford to run, kept in the
package (``measured/*.json``) so that the chapters plot them in the book, in Jupyter and in
Colab alike. Each file holds the command, commit, machine and date that made it.

``benchmarks/head_counts.py`` writes ``head_counts.json`` (chapter 7),
``benchmarks/kv_sharing.py`` ``kv_sharing.json`` (chapter 10),
``benchmarks/llama_ablations.py`` ``llama_ablations.json`` (chapter 14),
``benchmarks/induction_heads.py`` ``induction_heads.json`` (chapter 15) and
``benchmarks/long_context.py`` ``long_context.json`` (chapter 16).
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["load_measured"]


def load_measured(name: str) -> dict:
    """The results file ``measured/{name}.json``, e.g. ``load_measured("llama_ablations")``.

    Raises:
        FileNotFoundError: naming the file and the files there are.
    """
    folder = resources.files(__package__) / "measured"
    path = folder / f"{name}.json"
    if not path.is_file():
        there = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
        raise FileNotFoundError(
            f"no measured results {name!r} (measured/{name}.json); there are {there}"
        )
    return json.loads(path.read_text(encoding="utf8"))

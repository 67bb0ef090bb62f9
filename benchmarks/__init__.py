"""The benchmark and the longer timing scripts of the book's code, outside the installed package.

Run from the repository root: ``python -m benchmarks.bench`` (or ``make bench``) prints the
benchmark's tables; :mod:`benchmarks.bench_d2l` and :mod:`benchmarks.bench_flat` are the
models it times the book's against. Not part of the ``mhbook`` wheel.
"""

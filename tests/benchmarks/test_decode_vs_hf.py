"""``benchmarks/decode_vs_hf.py`` still runs, and its two sides still write the same tokens."""

from __future__ import annotations

from benchmarks import decode_vs_hf


def test_the_decoding_benchmark_runs_and_both_sides_agree(capsys):
    ratios = decode_vs_hf.main(["--rounds", "1", "--new", "6"])
    assert set(ratios) == {1, 8} and all(r > 0 for r in ratios.values())
    assert capsys.readouterr().out.count("(same tokens: True)") == 2

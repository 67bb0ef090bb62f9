"""``python -m mhbook.check``: the list of checks, one check on an importable function, and
the registry every check is found through."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mhbook import check
from mhbook.check.__main__ import main


def test_the_list_names_every_check_with_its_chapter(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name, fn in check.CHECKS.items():
        assert f"  {name} " in out and fn.spec.title in out


def test_every_check_states_its_contract_and_chapter():
    for name, fn in check.CHECKS.items():
        assert fn.__doc__ and "Contract:" in fn.__doc__, f"check.{name} has no contract"
        assert fn.spec.chapter, f"check.{name} names no chapter"
        assert getattr(check, name) is fn
        assert name in check.__all__


def test_a_check_runs_on_a_function_named_module_colon_name(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.py").write_text(
        textwrap.dedent(
            """
            import math, torch

            def good(q, k, v, mask=None):
                s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                if mask is not None:
                    s = s.masked_fill(~mask, float("-inf"))
                w = torch.softmax(s.float() if s.dtype == torch.float16 else s, -1)
                w = w.nan_to_num(0.0).to(v.dtype)
                return w @ v, w

            def unscaled(q, k, v, mask=None):
                s = (q @ k.transpose(-2, -1)).double()
                if mask is not None:
                    s = s.masked_fill(~mask, float("-inf"))
                w = torch.softmax(s, -1).nan_to_num(0.0).to(v.dtype)
                return w @ v, w
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["attention", "mine:good"]) == 0
    assert "passed all" in capsys.readouterr().out
    assert main(["attention", "mine:unscaled"]) == 1
    assert "Likely bug: the scores are not scaled" in capsys.readouterr().out


def test_a_name_alone_prints_the_contract_and_the_bugs_it_names(capsys):
    assert main(["attention"]) == 0
    out = capsys.readouterr().out
    assert "Contract:" in out and "The bugs it names:" in out
    assert all(f"  - {bug.name}" in out for bug in check.attention.spec.bugs)


def test_unknown_names_are_refused_clearly(capsys):
    assert main(["no_such_check", "x:y"]) == 2
    assert "no check named 'no_such_check'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="expected MODULE:NAME"):
        main(["attention", "just_a_name"])
    with pytest.raises(SystemExit, match="cannot import 'no_such_module_xyz'"):
        main(["attention", "no_such_module_xyz:f"])


def test_python_dash_m_lists_the_checks():
    out = subprocess.run(
        [sys.executable, "-m", "mhbook.check"], capture_output=True, text=True, check=True
    ).stdout
    assert "attention" in out and "softmax" in out


def test_a_check_module_that_fails_to_import_fails_loudly(monkeypatch):
    """Issue 38: the registry skipped a module that failed to import, silently."""
    import mhbook.check as package

    with pytest.raises(ImportError, match="the checks of mhbook.check.no_such_group failed"):
        package._collect(("basics", "no_such_group"))
    assert set(package._collect(("basics",))) <= set(check.CHECKS)

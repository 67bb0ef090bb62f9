"""The grader's own tests for ``mhbook/check/grader.py``: how a check runs the reader's code
(fresh inputs, inputs edited in place, a time limit, stubs and a forgotten ``return``), what
its report shows (the difference against the tolerance, digits enough to see it, the worst
case), and what it names (on the outputs the reader returned)."""

from __future__ import annotations

import math
import re
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from grading import assert_named, assert_passes

from mhbook import check
from mhbook.check import grader

# --- every call gets fresh inputs; editing them in place is told --------------------------------


def softmax_in_place(z):
    """Correct, but subtracts the maximum from the caller's tensor."""
    z -= z.max(dim=-1, keepdim=True).values
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def layer_norm_in_place(x, eps=1e-5):
    """Correct, but centres the caller's tensor."""
    x -= x.mean(dim=-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def tiled_in_place(q, k, v, block_size):
    """Correct, but scales the caller's queries (q *= d ** -0.5)."""
    q *= q.size(-1) ** -0.5
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)


def test_a_correct_function_that_edits_its_input_in_place_fails_and_is_told_so():
    result = check.softmax(softmax_in_place)
    assert not result and result.bug is None
    report = result.report()
    assert "edited its input z (changed by up to" in report
    assert "autograd" in report and "not z -= m" in report


def test_bugs_are_still_caught_and_named_after_calls_that_edit_their_inputs():
    """Issue 38: after one in-place call the cached cases were changed for every later call,
    and these three bugs passed."""
    for checker, impl in (
        (check.softmax, softmax_in_place),
        (check.layer_norm, layer_norm_in_place),
        (check.tiled_attention, tiled_in_place),
    ):
        assert not checker(impl)

    def softmax_raw_exp(z):
        return torch.exp(z) / torch.exp(z).sum(dim=-1, keepdim=True)

    def layer_norm_no_mean(x, eps=1e-5):
        return x / torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps)

    def tiled_block_max(q, k, v, block_size):
        dtype, compute = q.dtype, torch.promote_types(q.dtype, torch.float32)
        scale = q.size(-1) ** -0.5
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
        m = l = o = None
        for start in range(0, k.size(-2), block_size):
            s = q @ k[..., start : start + block_size, :].transpose(-2, -1)
            m_new = (s * scale).amax(-1, keepdim=True)  # the block's own maximum
            p = torch.exp(s * scale - m_new)
            pv = p @ v[..., start : start + block_size, :]
            if m is None:
                l, o = p.sum(-1, keepdim=True), pv
            else:
                l = torch.exp(m - m_new) * l + p.sum(-1, keepdim=True)
                o = torch.exp(m - m_new) * o + pv
            m = m_new
        return (o / l).to(dtype)

    for checker, impl, words in (
        (check.softmax, softmax_raw_exp, "exp of the raw scores"),
        (check.layer_norm, layer_norm_no_mean, "the mean is not subtracted"),
        (check.tiled_attention, tiled_block_max, "the block's own maximum"),
    ):
        (bug,) = [b for b in checker.spec.bugs if words in b.name]
        assert_named(checker, impl, bug)


def test_the_cases_are_left_as_they_were():
    before = [(c.name, c.args[0].clone()) for c, _ in check.softmax.spec.prepared()]
    check.softmax(softmax_in_place)
    after = [(c.name, c.args[0]) for c, _ in check.softmax.spec.prepared()]
    for (name, a), (_, b) in zip(before, after):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()), name


# --- the tolerance: float32 inside passes float64 cases, and it is stated -------------------


def test_code_that_computes_in_float32_inside_passes_the_float64_cases():
    """Issue 38: rtol 1e-7 on float64 cases failed Hugging Face's own way of computing."""

    def attention_softmax_in_float32(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = F.softmax(s, dim=-1, dtype=torch.float32).nan_to_num(0.0).to(q.dtype)
        return w @ v, w

    assert_passes(check.attention, attention_softmax_in_float32)


def test_the_contract_shown_by_the_command_line_states_the_tolerance(capsys):
    from mhbook.check.__main__ import main

    assert main(["attention"]) == 0
    out = capsys.readouterr().out
    assert "Tolerance: each value within atol + rtol * abs(expected): rtol 1e-5, atol 1e-7" in out
    assert main(["causal_mask"]) == 0
    assert "Tolerance: none; compared exactly." in capsys.readouterr().out


# --- reports show the difference, digits enough to see it, and the worst case -----------------


def test_a_failure_shows_the_difference_against_the_tolerance_with_digits_to_see_it():
    """Issue 38: "expected 0.663207, got 0.663207" hid a failure (here layer norm with an eps
    of 1e-12 instead of 1e-5)."""

    def eps_too_small(x, eps=1e-5):
        return F.layer_norm(x, (x.size(-1),), eps=1e-12)

    report = check.layer_norm(eps_too_small).report()
    found = re.search(
        r"expected (\S+), got (\S+): \|got - expected\| = (\S+) > allowed (\S+)", report
    )
    assert found, report
    expected, got, diff, allowed = found.groups()
    assert expected != got.rstrip(":")
    assert float(diff) > float(allowed)
    assert "(rtol 1e-5, atol 1e-7)" in report
    assert "got - expected:" in report  # the differences shown beside the values


def test_the_report_shows_the_case_that_fails_by_most_as_well_as_the_smallest():
    def wrong_on_the_large_case(z):
        out = torch.softmax(z, dim=-1)
        if z.numel() == 3:
            return out * (1 + 1e-3)  # a little off on the smallest case
        if z.shape == (2, 3, 5):
            return out.flip(-1)  # far off on a larger one
        return out

    report = check.softmax(wrong_on_the_large_case).report()
    assert 'Smallest failing case: "three scores"' in report
    assert 'Largest difference (relative to the tolerance): "a batch of rows (2, 3, 5)"' in report


def test_the_place_of_a_difference_is_named_by_the_axes():
    def off_in_one_place(z):
        out = torch.softmax(z, dim=-1).clone()
        if out.dim() == 3:
            out[1, 2, 3] += 0.01
        return out

    report = check.softmax(off_in_one_place).report()
    assert "the worst is at batch 1, row 2, position 3:" in report
    assert "dim 0" not in report


# --- naming on the outputs the reader returned --------------------------------------------------


def test_a_bug_is_named_when_the_reader_returns_the_output_alone():
    """Issue 38: the contracts allow the output alone, but naming compared the weights too."""

    def unscaled(q, k, v, mask=None):
        s = (q @ k.transpose(-2, -1)).double()
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return (torch.softmax(s, -1).nan_to_num(0.0) @ v.double()).to(v.dtype)

    (bug,) = [b for b in check.attention.spec.bugs if b.name == "the scores are not scaled"]
    assert_named(check.attention, unscaled, bug)


def test_optional_outputs_are_graded_when_returned():
    def wrong_weights(q, k, v, mask=None):
        out, weights = check.attention.spec.reference(q, k, v, mask)
        return out, weights * 2

    report = check.attention(wrong_weights).report()
    assert "weights is outside the tolerance" in report


# --- stubs, a forgotten return, a call that never returns ----------------------------------


def test_a_stub_is_not_written_yet_whatever_its_empty_body():
    def with_ellipsis(z):
        """Your softmax."""
        ...

    def with_pass(z):
        pass

    def raising(z):
        raise NotImplementedError("write me")

    for stub in (with_ellipsis, with_pass, raising):
        result = check.softmax(stub)
        assert not result and result.report().startswith(
            f"check.softmax({stub.__qualname__}): not written yet"
        )


def test_a_body_that_forgets_return_is_asked_about_it():
    """Issue 38: a function that computed everything and returned nothing was told "not
    written yet"."""

    def forgot(z):
        e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
        e / e.sum(dim=-1, keepdim=True)

    report = check.softmax(forgot).report()
    assert "not written yet" not in report
    assert "returned None: did you forget `return`" in report


def test_a_call_that_never_returns_is_stopped_on_the_main_thread(monkeypatch):
    monkeypatch.setattr(grader, "TIME_LIMIT", 0.3)

    def endless(z):
        while True:
            pass

    start = time.monotonic()
    result = check.softmax(endless)
    assert time.monotonic() - start < 5
    report = result.report()
    assert not result and "did not return within 0.3 s" in report
    assert "not run: an earlier call ran out of time" in report
    assert check.softmax(check.softmax.spec.reference)  # and the next check runs as usual


def test_a_call_that_never_returns_is_left_behind_off_the_main_thread(monkeypatch):
    monkeypatch.setattr(grader, "TIME_LIMIT", 0.3)
    stop = threading.Event()

    def endless(z):
        while not stop.is_set():  # (so that the test can end it)
            time.sleep(0.01)
        return z

    results = []
    worker = threading.Thread(target=lambda: results.append(check.softmax(endless)))
    worker.start()
    worker.join(10)
    stop.set()
    (result,) = results
    assert not result and "did not return within 0.3 s" in result.report()
    assert "may still be running in the background" in result.report()


def test_a_failing_check_keeps_the_readers_print_options():
    before = dict(vars(torch._tensor_str.PRINT_OPTS))
    try:
        torch.set_printoptions(precision=7, sci_mode=True, linewidth=120)
        mine = dict(vars(torch._tensor_str.PRINT_OPTS))
        assert not check.softmax(lambda z: torch.softmax(z, -1) * 2)
        assert dict(vars(torch._tensor_str.PRINT_OPTS)) == mine
    finally:
        for name, value in before.items():
            setattr(torch._tensor_str.PRINT_OPTS, name, value)


@pytest.mark.parametrize("how", ["in place", "forgot return"])
def test_the_grader_is_not_fooled_by_a_class_either(how):
    class Cache:
        def __init__(self, W):
            self.W, self.keys, self.values = W, None, None

        def update(self, k, v):
            keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
            values = v if self.values is None else torch.cat([self.values, v], dim=2)
            self.keys, self.values = keys[:, :, -self.W :], values[:, :, -self.W :]
            if how == "in place":
                k.zero_()
                return keys.clone(), values
            # no return

    report = check.rolling_cache(Cache).report()
    if how == "in place":
        assert "edited its input k" in report
    else:
        assert "returned None: did you forget `return`" in report

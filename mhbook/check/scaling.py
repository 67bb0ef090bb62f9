"""Checks of chapter 16's RoPE scalings for a longer context, written by hand: position
interpolation, NTK-aware scaling and YaRN's frequencies.

What is compared: the frequencies ``theta`` (float64, one per pair), and NTK's new base and
YaRN's attention factor, both required. YaRN's third output in the chapter, ``(low, high,
gamma)``, shows the ramp for the reader and is not graded: every mistake in it shows in
``theta``.

The expected values are computed in float64 by the formulas, and checked on every case
against ``transformers``' ``ROPE_INIT_FUNCTIONS`` (``"linear"``, ``"dynamic"`` at the
length where its factor is the static one, ``"yarn"``), which compute in float32: they
must agree to float32's precision, or the check itself is wrong and raises. The reader's
frequencies are held to the float64 tolerance of the contracts, which ``transformers``' own
float32 frequencies meet.
"""

from __future__ import annotations

import math

import torch

from ..attention.rope import ntk_base
from .grader import Bug, Case, define

__all__ = ["pi_frequencies", "ntk_frequencies", "yarn_frequencies"]

CHAPTER = "16-long-context"
_WHY = (
    "Frequencies computed in float32, as transformers computes them, pass (then returned as "
    "float64); a number returned (the base, the factor) is held to the float64 tolerance."
)
PAIR = {"theta": ("pair",)}

#: (d, base, s): the chapter's heads, odd numbers of pairs, Llama 2's heads.
SHAPES = [
    ("the chapter's heads: d = 32, base 10,000, s = 8", 32, 10000.0, 8.0),
    ("d = 6 (3 pairs), base 500, s = 2.5", 6, 500.0, 2.5),
    ("d = 10 (5 pairs), base 10,000, s = 4", 10, 10000.0, 4.0),
    ("Llama 2's heads: d = 128, base 10,000, s = 16", 128, 10000.0, 16.0),
]


def _hf(d: int, base: float, rope_parameters: dict, max_position_embeddings: int):
    """``transformers``' config of a model with heads of ``d`` features."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=d,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_theta": base, **rope_parameters},
    )


def _agree(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    if not torch.allclose(ours.float(), theirs, rtol=2e-6, atol=0):
        raise RuntimeError(f"the check's expected {what} differ from transformers': {theirs}")


def _plain(d: int, base: float) -> torch.Tensor:
    """``theta_i = base^(-2i/d)`` for the ``d/2`` pairs, in float64."""
    return torch.exp(-torch.arange(0, d, 2, dtype=torch.float64) / d * math.log(base))


# --- position interpolation ----------------------------------------------------------------


def _pi_cases() -> list[Case]:
    return [Case(name, (d, base, s), dims=PAIR) for name, d, base, s in SHAPES]


def _pi_expected(case: Case) -> torch.Tensor:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, base, s = case.args
    theta = _plain(d, base) / s
    config = _hf(d, base, {"rope_type": "linear", "factor": s}, 64)
    _agree(theta, ROPE_INIT_FUNCTIONS["linear"](config)[0], "PI frequencies")
    return theta


def _pi_reference(d, base, s, *, exponent=2.0, per_feature=False, how="interpolate"):
    """Written for teaching (and mutated for the bugs): every ``theta_i`` divided by ``s``."""
    i = torch.arange(d if per_feature else d // 2, dtype=torch.float64)
    if how == "ntk":
        base = base * s ** (d / (d - 2))
    theta = base ** (-exponent * i / d)
    if how == "interpolate":
        return theta / s
    if how == "extrapolate":
        return theta * s
    return theta


@define(
    title="position interpolation's frequencies, theta_i / s",
    cases=_pi_cases,
    expected=_pi_expected,
    reference=_pi_reference,
    outputs=("theta",),
    params=("d", "base", "s"),
    why=_WHY,
    bugs=[
        Bug(
            "the frequencies multiplied by s instead of divided",
            "divide every theta_i by s: position m then gets the angles of position m / s.",
            lambda d, base, s: _pi_reference(d, base, s, how="extrapolate"),
        ),
        Bug(
            "the base raised (NTK-aware scaling) instead of every frequency divided by s",
            "position interpolation keeps the base and divides every theta_i by s; raising "
            "the base to base * s^(d/(d-2)) is NTK-aware scaling.",
            lambda d, base, s: _pi_reference(d, base, s, how="ntk"),
        ),
        Bug(
            "the exponent -i/d instead of -2i/d",
            "pair i has theta_i = base^(-2i/d): i counts pairs, and a pair is two features.",
            lambda d, base, s: _pi_reference(d, base, s, exponent=1.0),
        ),
        Bug(
            "one frequency per feature (d of them) instead of one per pair (d/2)",
            "take i = torch.arange(d // 2): the d features form d/2 rotated pairs.",
            lambda d, base, s: _pi_reference(d, base, s, per_feature=True),
        ),
    ],
    chapter=CHAPTER,
)
def pi_frequencies(impl):
    """Position interpolation (Chen et al., 2023): every RoPE frequency divided by ``s``.

    Contract: ``impl(d, base, s) -> theta``: ``theta_i = base^(-2i/d) / s`` for the pairs
    ``i = 0 .. d/2 - 1`` of a head of ``d`` features, a float64 tensor ``(d/2,)``. Compared
    in float64 with the formula, itself checked against ``transformers``'
    ``ROPE_INIT_FUNCTIONS["linear"]``.
    """


# --- NTK-aware scaling ----------------------------------------------------------------------


def _ntk_cases() -> list[Case]:
    return [
        Case(name, (d, base, s), dims=PAIR)
        for name, d, base, s in SHAPES
        if name.startswith(("the chapter", "d = 6", "Llama"))
    ] + [Case("d = 4 (2 pairs), base 100, s = 3", (4, 100.0, 3.0), dims=PAIR)]


def _ntk_expected(case: Case) -> tuple[torch.Tensor, float]:
    """The base ``base * s^(d/(d-2))`` and its frequencies; ``transformers``' ``"dynamic"``
    NTK uses the base ``base (s n / L - (s - 1))^(d/(d-2))`` at length ``n``, which is this
    one at ``n = L (2 - 1/s)``."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, base, s = case.args
    new_base = ntk_base(d, base, s)
    theta = _plain(d, new_base)
    L = 40 if s == 2.5 else 48  # so that n = L (2 - 1/s) is a whole number of positions
    config = _hf(d, base, {"rope_type": "dynamic", "factor": s}, L)
    _agree(
        theta,
        ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=round(L * (2 - 1 / s)))[0],
        "NTK frequencies",
    )
    return theta, new_base


def _ntk_reference(d, base, s, *, power=None, frequencies="new"):
    """Written for teaching (and mutated for the bugs): the base raised to
    ``base * s^(d/(d-2))``, the frequencies ``new_base^(-2i/d)``."""
    i = torch.arange(d // 2, dtype=torch.float64)
    new_base = base * s ** (d / (d - 2) if power is None else power(d))
    if frequencies == "old":
        return base ** (-2 * i / d), new_base
    if frequencies == "interpolated":
        return base ** (-2 * i / d) / s, new_base
    return new_base ** (-2 * i / d), new_base


@define(
    title="NTK-aware scaling's frequencies, from the base base * s^(d/(d-2))",
    cases=_ntk_cases,
    expected=_ntk_expected,
    reference=_ntk_reference,
    outputs=("theta", "new_base"),
    params=("d", "base", "s"),
    why=_WHY,
    bugs=[
        Bug(
            "the exponent d/(d-2) forgotten: the base multiplied by s",
            "raise s to d/(d-2): new_base = base * s ** (d / (d - 2)), so that the slowest "
            "pair, theta_{d/2-1} = new_base^(-(d-2)/d), is divided by exactly s.",
            lambda d, base, s: _ntk_reference(d, base, s, power=lambda d: 1.0),
        ),
        Bug(
            "the exponent inverted: s^((d-2)/d) instead of s^(d/(d-2))",
            "new_base = base * s ** (d / (d - 2)).",
            lambda d, base, s: _ntk_reference(d, base, s, power=lambda d: (d - 2) / d),
        ),
        Bug(
            "the new base computed, but the frequencies taken from the old one",
            "theta_i = new_base ** (-2 * i / d): the new base is what changes the frequencies.",
            lambda d, base, s: _ntk_reference(d, base, s, frequencies="old"),
        ),
        Bug(
            "every frequency divided by s (position interpolation) instead of a larger base",
            "NTK-aware scaling keeps the fastest pair (theta_0 = 1) and divides only the "
            "slowest by s: theta_i = new_base ** (-2 * i / d).",
            lambda d, base, s: _ntk_reference(d, base, s, frequencies="interpolated"),
        ),
    ],
    chapter=CHAPTER,
)
def ntk_frequencies(impl):
    """NTK-aware scaling (bloc97, 2023): a larger base instead of slower positions.

    Contract: ``impl(d, base, s) -> (theta, new_base)``: ``new_base = base * s^(d/(d-2))``
    (a float) and ``theta_i = new_base^(-2i/d)`` for the pairs ``i = 0 .. d/2 - 1``, a
    float64 tensor ``(d/2,)``. Compared in float64 with the formula, itself checked against
    ``transformers``' ``ROPE_INIT_FUNCTIONS["dynamic"]`` at the length ``L (2 - 1/s)``,
    where its growing factor equals ``s``.
    """


# --- YaRN -----------------------------------------------------------------------------------


def _yarn_cases() -> list[Case]:
    cases = [
        Case("the chapter's: d = 32, base 10,000, s = 8, L = 64", (32, 10000.0, 8.0, 64)),
        Case("d = 32, base 10,000, s = 4, L = 64", (32, 10000.0, 4.0, 64)),
        Case("Llama 2's: d = 128, base 10,000, s = 8, L = 4096", (128, 10000.0, 8.0, 4096)),
        Case("d = 16, base 500, s = 2.5, L = 48", (16, 500.0, 2.5, 48)),
        Case(
            "d = 8, base 100, s = 4, L = 4096: high = 6, above d/2 - 1 = 3",
            (8, 100.0, 4.0, 4096),
        ),
        Case(
            "d = 32, base 10,000, s = 8, L = 512, beta_fast = 16, beta_slow = 2",
            (32, 10000.0, 8.0, 512),
            {"beta_fast": 16.0, "beta_slow": 2.0},
            needs=("beta_fast", "beta_slow"),
        ),
    ]
    for case in cases:
        case.dims = PAIR
    return cases


def _yarn_expected(case: Case) -> tuple[torch.Tensor, float]:
    """In float64, as ``transformers`` computes it: the ramp ``clamp((i - low) / (high -
    low), 0, 1)`` from 0 (keep ``theta_i``) to 1 (``theta_i / s``)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, base, s, L = case.args
    beta_fast, beta_slow = case.kwargs.get("beta_fast", 32.0), case.kwargs.get("beta_slow", 1.0)

    def correction_dim(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = _plain(d, base)
    theta = theta / s * ramp + theta * (1 - ramp)
    factor = 0.1 * math.log(s) + 1.0
    parameters = {
        "rope_type": "yarn",
        "factor": s,
        "original_max_position_embeddings": L,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
    }
    theirs, their_factor = ROPE_INIT_FUNCTIONS["yarn"](_hf(d, base, parameters, round(s * L)))
    _agree(theta, theirs, "YaRN frequencies")
    if not math.isclose(factor, their_factor, rel_tol=1e-12):
        raise RuntimeError(
            f"YaRN's attention factor: {factor} here, {their_factor} in transformers"
        )
    return theta, factor


def _yarn_reference(
    d,
    base,
    s,
    L,
    beta_fast=32.0,
    beta_slow=1.0,
    *,
    reversed_ramp=False,
    rounded=True,
    turn=2 * math.pi,
    top=None,
    factor=lambda s: 0.1 * math.log(s) + 1,
):
    """Written for teaching (and mutated for the bugs): the chapter's ``yarn_by_hand``."""
    i = torch.arange(d // 2, dtype=torch.float64)
    theta = base ** (-2 * i / d)

    def pair_turning(r):  # the fractional pair index that turns r times over L positions
        return d * math.log(L / (turn * r)) / (2 * math.log(base))

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)
    if rounded:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1 if top is None else top(d))
    gamma = ((high - i) / (high - low)).clamp(0, 1)  # 1: keep theta_i, 0: theta_i / s
    if reversed_ramp:
        gamma = 1 - gamma
    return (1 - gamma) * theta / s + gamma * theta, factor(s), (low, high, gamma)


def _yarn_bug(**change):
    def impl(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
        return _yarn_reference(d, base, s, L, beta_fast, beta_slow, **change)

    return impl


@define(
    title="YaRN's frequencies and attention factor",
    cases=_yarn_cases,
    expected=_yarn_expected,
    reference=_yarn_reference,
    outputs=("theta", "attention_factor"),
    params=("d", "base", "s", "L"),
    why=_WHY,
    bugs=[
        Bug(
            "the ramp reversed: the fast pairs interpolated and the slow ones kept",
            "gamma_i = clamp((high - i) / (high - low), 0, 1) is 1 for the fast pairs (i <= "
            "low, kept) and 0 for the slow ones (i >= high, theta_i / s).",
            _yarn_bug(reversed_ramp=True),
        ),
        Bug(
            "the attention factor 0.1 ln s, without the + 1",
            "YaRN multiplies queries and keys by 0.1 * math.log(s) + 1, a little above 1.",
            _yarn_bug(factor=lambda s: 0.1 * math.log(s)),
        ),
        Bug(
            "the attention factor squared (the scores' factor, not that of q and k)",
            "return 0.1 * math.log(s) + 1, what cos and sin (so queries and keys) are "
            "multiplied by; the scores get its square.",
            _yarn_bug(factor=lambda s: (0.1 * math.log(s) + 1) ** 2),
        ),
        Bug(
            "low and high not rounded outwards",
            "round the fractional pair indices outwards: low = floor(...), high = ceil(...), "
            "then clamp them to [0, d - 1].",
            _yarn_bug(rounded=False),
        ),
        Bug(
            "the turns counted in radians: 2 pi left out of r_i = L theta_i / (2 pi)",
            "a pair turns L theta_i / (2 pi) times over L positions: the index that turns r "
            "times is d ln(L / (2 pi r)) / (2 ln base).",
            _yarn_bug(turn=1.0),
        ),
        Bug(
            "high clamped to d/2 - 1, the last pair's index, instead of d - 1",
            "clamp to [0, d - 1] as YaRN's code and transformers do: high may lie beyond the "
            "last pair, and then the ramp never reaches 0 (the slowest pair is not divided by "
            "s in full).",
            _yarn_bug(top=lambda d: d // 2 - 1),
        ),
    ],
    chapter=CHAPTER,
)
def yarn_frequencies(impl):
    """YaRN (Peng et al., 2024): keep the fast pairs, interpolate the slow ones, a linear
    ramp between, and an attention factor.

    Contract: ``impl(d, base, s, L, beta_fast=32.0, beta_slow=1.0) -> (theta,
    attention_factor, ...)``. Pair ``i`` turns ``r_i = L theta_i / (2 pi)`` times over the
    original context ``L``; ``low`` and ``high`` are the pair indices where ``r_i`` is
    ``beta_fast`` and ``beta_slow``, rounded outwards (floor, ceil) and clamped to ``[0, d
    - 1]``; ``gamma_i = clamp((high - i) / (high - low), 0, 1)`` and ``theta'_i = (1 -
    gamma_i) theta_i / s + gamma_i theta_i``, a float64 tensor ``(d/2,)``;
    ``attention_factor = 0.1 ln s + 1`` (a float). Only ``theta`` and the factor are
    graded: a third output, such as the chapter's ``(low, high, gamma)``, is ignored. A
    function without ``beta_fast`` and ``beta_slow`` is checked with the defaults only.
    Compared in float64 with the formula, itself checked against ``transformers``'
    ``ROPE_INIT_FUNCTIONS["yarn"]``.
    """

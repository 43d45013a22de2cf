"""How a benchmark judges a ratio to its floor (``bench.verdict``): never "met" from too few
rounds or from rounds that disagree."""

from __future__ import annotations

from bench.verdict import Ratio


def _ratio(*rounds: float, at_most: bool = True, min_rounds: int = 3) -> Ratio:
    return Ratio("path", "floor", rounds, 1.3, at_most, min_rounds)


def test_rounds_that_agree_give_a_verdict_either_way() -> None:
    assert _ratio(1.1, 1.2, 1.25).verdict == "met"
    assert _ratio(1.5, 1.6, 1.4).verdict == "MISSED"
    assert _ratio(0.7, 0.65, 0.8, at_most=False).verdict == "MISSED"  # ">= 1.3x"
    assert _ratio(1.4, 1.5, 1.35, at_most=False).verdict == "met"


def test_too_few_rounds_or_rounds_that_disagree_are_noisy() -> None:
    assert _ratio(1.0, 1.0).verdict == "noisy"  # one good round short of judging
    assert _ratio().verdict == "noisy"
    # The median meets the target, but one round in three does not: not three in four.
    assert _ratio(1.2, 1.25, 1.6).verdict == "noisy"
    assert _ratio(1.2, 1.2, 1.2, 1.6).verdict == "met"  # three in four agree


def test_the_line_names_the_median_the_target_and_the_spread() -> None:
    line = _ratio(1.1, 1.2, 1.25).line()
    assert line.startswith("ratio: path / floor: 1.20x (target <= 1.3x; 3 rounds")
    assert "1.10-1.25x" in line and line.endswith(": met")

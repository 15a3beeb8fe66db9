"""CTN's adaptive λ (``AdaptiveCtnCoef``) on synthetic clip-fraction streams (numbers made up here)."""

from __future__ import annotations

import pytest

from sorl_monitor.remedy.ctn import AdaptiveCtnCoef


def test_lambda_doubles_above_the_band_halves_below_it_and_holds_inside():
    coef = AdaptiveCtnCoef(value=1.0, target=0.1, low=0.5, high=8.0)
    assert coef.update(0.1) is None and coef.value == 1.0  # on target
    assert coef.update(0.149) is None  # inside (target / 1.5, 1.5 · target)
    assert coef.update(0.0670) is None
    assert coef.update(0.2) == 2.0
    assert coef.update(0.05) == 1.0
    assert coef.update(0.01) == 0.5


def test_lambda_stays_within_its_bounds_and_reports_no_change_at_a_bound():
    coef = AdaptiveCtnCoef(value=1.0, target=0.1, low=1.0, high=4.0)
    changes = [coef.update(0.9) for _ in range(5)]
    assert changes == [2.0, 4.0, None, None, None] and coef.value == 4.0
    changes = [coef.update(0.0) for _ in range(5)]
    assert changes == [2.0, 1.0, None, None, None] and coef.value == 1.0


def test_a_clip_fraction_that_answers_lambda_settles_inside_the_band():
    # a synthetic plant: the clip fraction falls as λ grows, c(λ) = 0.4 / (1 + λ)
    coef = AdaptiveCtnCoef(value=1.0, target=0.1, low=1.0, high=64.0)
    for _ in range(20):
        coef.update(0.4 / (1 + coef.value))
    assert 0.1 / 1.5 <= 0.4 / (1 + coef.value) <= 0.15
    assert coef.value == 2.0  # λ = 1 gives 0.2 (above 0.15): doubled once; λ = 2 gives 0.133, inside


@pytest.mark.parametrize(
    ("target", "low", "high"), [(0.0, 1.0, 2.0), (1.0, 1.0, 2.0), (0.1, 0.0, 2.0), (0.1, 3.0, 2.0)]
)
def test_bad_settings_are_refused_with_a_reason(target, low, high):
    with pytest.raises(ValueError, match="CTN"):
        AdaptiveCtnCoef(value=1.0, target=target, low=low, high=high)


def test_without_leave_to_raise_lambda_only_falls():
    coef = AdaptiveCtnCoef(value=4.0, target=0.1, low=1.0, high=64.0)
    assert (
        coef.update(0.5, may_raise=False) is None and coef.value == 4.0
    )  # above the band: held, not doubled
    assert coef.update(0.01, may_raise=False) == 2.0  # below it: halved as usual
    assert coef.update(0.5) == 4.0

"""The y axis of a dashboard chart: one spike left out of a rate's range, one format for all its labels."""

from __future__ import annotations

from core.units import format_axis
from core.watch.chart_scale import outlier_ceiling


def test_an_isolated_spike_is_left_out_of_the_range():
    steady = [12_000.0 + 50 * (i % 7) for i in range(60)]
    assert outlier_ceiling(steady) is None  # nothing stands out: the real maximum is the top
    assert outlier_ceiling([52_000.0] + steady) == max(steady)
    assert outlier_ceiling([52_000.0, 12_000.0, 12_100.0]) == 12_100.0  # three points: one spike is visible


def test_a_sustained_change_of_rate_is_data_not_noise():
    assert outlier_ceiling([5_000.0] * 30 + [12_000.0] * 20) is None
    assert outlier_ceiling([52_000.0, 12_000.0]) is None  # two points tell nothing apart
    assert outlier_ceiling([0.0, 0.0, 0.0, 9.0]) is None  # no median to measure against


def test_axis_labels_share_one_unit_and_precision():
    assert format_axis([10_400.0, 5_201.0, 0.0]) == ["10.4k", "5.2k", "0"]  # never 10.4k beside 5201
    assert format_axis([12_600.0, 6_300.0, 0.0]) == ["12.6k", "6.3k", "0"]
    assert format_axis([3.019, 1.942, 0.865]) == ["3.019", "1.942", "0.865"]
    assert format_axis([2.341, 1.17, 0.0]) == ["2.341", "1.170", "0"]
    assert format_axis([2e-4, 1e-4, 0.0]) == ["2.0e-04", "1.0e-04", "0"]
    assert format_axis([1.2e6, 6e5]) == ["1.20M", "0.60M"]
    assert format_axis([100.0, 50.0, 0.0]) == ["100", "50", "0"]
    assert format_axis([None, 1.0]) == ["–", "1.000"]
    assert all(len(label) <= 7 for label in format_axis([-123_456.0, 99_999.0, 0.5]))

"""core.units: the one formatter of durations, counts, rates and sizes that the app and the CLI share."""

from __future__ import annotations

import math

from core.units import (
    UNKNOWN,
    format_compact,
    format_cost,
    format_count,
    format_disk,
    format_duration,
    format_memory,
    format_rate,
    json_cost,
    json_hours,
    plural_key,
)


def test_durations_read_like_a_clock_with_days_beyond_24_hours():
    assert format_duration(0) == "0:00"
    assert format_duration(0.4) == "< 0:01" and format_duration(1.0) == "0:01"  # not "0:00" for an epoch
    assert format_duration(27) == "0:27"
    assert format_duration(59) == "0:59"
    assert format_duration(59.9) == "0:59"  # whole seconds, never rounded up to a minute that has not passed
    assert format_duration(60) == "1:00"
    assert format_duration(3599) == "59:59"
    assert format_duration(3600) == "1:00:00"
    assert format_duration(3723) == "1:02:03"
    assert format_duration(86399) == "23:59:59"
    assert format_duration(86400) == "1d 00h"
    assert format_duration(2 * 86400 + 3 * 3600 + 4 * 60 + 5) == "2d 03h"


def test_unknown_values_are_a_dash_everywhere():
    for formatter in (format_duration, format_count, format_rate, format_compact, format_cost, format_memory,
                      format_disk):
        assert formatter(None) == UNKNOWN == "–"
        assert formatter(math.nan) == UNKNOWN
    assert format_duration(-1) == UNKNOWN and format_duration(math.inf) == UNKNOWN


def test_counts_and_rates_carry_thousands_separators():
    assert format_count(0) == "0"
    assert format_count(999) == "999"
    assert format_count(7745) == "7,745"
    assert format_count(7745.6) == "7,746"
    assert format_count(1_234_567) == "1,234,567"
    assert format_rate(8452.4) == "8,452"
    assert format_rate(94815) == "94,815"
    assert format_rate(0) == "0"
    assert format_rate(3.46) == "3.5"  # a slow rate keeps a decimal instead of reading as 3
    assert format_rate(12.4) == "12"


def test_costs_to_the_cent_and_under_a_cent_never_free():
    assert format_cost(0) == "0.00"  # nothing spent yet
    assert format_cost(0.004) == "< 0.01"  # was "0.00": a plan that costs something read as free
    assert format_cost(0.009) == "< 0.01"  # not "0.01", which would be more than it costs
    assert format_cost(0.01) == "0.01"
    assert format_cost(1234.5) == "1,234.50"
    assert format_cost(0.6, "$") == "$0.60" and format_cost(0.004, "$") == "< $0.01"


def test_json_costs_keep_four_significant_digits_and_at_least_the_cent():
    assert json_cost(0.0014634) == 0.001463  # was 0.0 (rounded to the cent): read as free
    assert json_cost(0.00003572) == 3.572e-05
    assert json_cost(1234.5678) == 1234.57  # never fewer decimals than the cent
    assert json_cost(0.1 + 0.2) == 0.3  # no float noise
    assert json_cost(0) == 0 and json_cost(None) is None


def test_compact_counts_for_chart_axes():
    assert format_compact(1234) == "1234"
    assert format_compact(12345) == "12.3k"
    assert format_compact(1.2e6) == "1.20M"


def test_memory_is_binary_and_disk_decimal():
    assert format_memory(81.3 * 2**30) == "81.3 GiB"
    assert format_memory(2**30 - 1) == "1024.0 MiB"  # just under a GiB stays in MiB
    assert format_memory(1.96 * 2**30) == "2.0 GiB"  # one decimal, rounded
    assert format_memory(140 * 2**30) == "140.0 GiB"
    assert format_memory(512) == "512 B"
    assert format_disk(21.5e12) == "21.5 TB"
    assert format_disk(3.24e9) == "3.2 GB"
    assert format_disk(12.1e6) == "12.1 MB"
    assert format_disk(2048) == "2.0 kB"
    assert format_disk(0) == "0 B"


def test_plural_keys():
    assert plural_key("runs_screen.summary", 1) == "runs_screen.summary_one"
    assert plural_key("runs_screen.summary", 0) == "runs_screen.summary_other"
    assert plural_key("runs_screen.summary", 2) == "runs_screen.summary_other"


def test_magnitudes_of_parameter_and_download_counts():
    from core.units import format_magnitude

    assert [format_magnitude(v) for v in (7_615_616_512, 1_234_567, 3_400, 950)] == ["7.6B", "1.2M", "3.4K", "950"]
    assert format_magnitude(None) == "–" and format_magnitude(None, unknown="?") == "?"


def test_json_hours_keep_a_second_and_four_significant_digits():
    assert json_hours(1 / 3600) == 0.0002778  # one second: rounded to 0.001 h it was 0.0
    assert json_hours(12.345678) == 12.3457 and json_hours(None) is None and json_hours(0.0) == 0.0

"""The y range of a rate chart that one spike must not flatten.

Tokens/s is flat by nature: a warm-up step or a mis-timed step that reads twice the steady rate would
otherwise set the top of the axis and squeeze the steady rate into half the chart. ``outlier_ceiling``
says where to cut: a few isolated highs well above the median are left out of the range (the chart clips
and marks them), a sustained change of rate is not (it is the data, not noise).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

OUTLIER_FACTOR = 1.5  # a high this many times the median of the highs is a candidate outlier
OUTLIER_SHARE = 0.05  # … and only while such highs are at most this share of the columns (or just one)


def outlier_ceiling(highs: Sequence[float], factor: float = OUTLIER_FACTOR,
                    share: float = OUTLIER_SHARE) -> float | None:
    """The top of the y range that leaves the outliers of ``highs`` out, or None when none stands out.

    ``highs`` are the highest values of the chart's columns (or buckets), in any order. Values above
    ``factor`` times their median are outliers when there are few of them: at most one, or at most
    ``share`` of all. Fewer than three values tell nothing apart."""
    values = [v for v in highs if v == v]  # NaN never reaches a chart, but never trust a median to it
    if len(values) < 3:
        return None
    median = statistics.median(values)
    if median <= 0:
        return None
    limit = factor * median
    outliers = [v for v in values if v > limit]
    if not outliers or len(outliers) > max(1, int(share * len(values))):
        return None
    return max(v for v in values if v <= limit)

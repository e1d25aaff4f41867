"""Downsampling a growing series to a chart's width: O(n) once, O(1) per new point, O(buckets) per frame.

Points land in fixed-width x buckets (min, max, sum, count, last). When a point falls past the last bucket
allowed, neighbouring buckets merge pairwise and the bucket width doubles, so a million points never hold
more than ``max_buckets`` buckets. Drawing maps buckets onto screen columns, which costs the number of
buckets, not the number of points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAX_BUCKETS = 2048


@dataclass(frozen=True)
class Column:
    """The points one screen column stands for: their extremes, mean and last value."""

    low: float
    high: float
    mean: float
    last: float
    count: int


class BucketedSeries:
    """(x, y) points aggregated into at most ``max_buckets`` buckets of equal x width."""

    __slots__ = ("max_buckets", "span", "origin", "lows", "highs", "sums", "counts", "lasts", "x_max",
                 "points", "y_last", "x_last")

    def __init__(self, max_buckets: int = DEFAULT_MAX_BUCKETS, span: float = 1.0) -> None:
        self.max_buckets = max(2, max_buckets - max_buckets % 2)
        self.span = float(span)
        self.origin: float | None = None
        self.lows: list[float] = []
        self.highs: list[float] = []
        self.sums: list[float] = []
        self.counts: list[int] = []
        self.lasts: list[float] = []
        self.x_max = -math.inf
        self.points = 0
        self.y_last: float | None = None
        self.x_last: float | None = None

    def add(self, x: float, y: float) -> None:
        """One point; ``y`` must be finite (callers skip missing values)."""
        origin = self.origin
        if origin is None:
            origin = self.origin = x
        index = int((x - origin) / self.span) if x > origin else 0
        while index >= self.max_buckets:
            self._halve()
            index = int((x - origin) / self.span)
        counts = self.counts
        if index >= len(counts):
            grow = index + 1 - len(counts)
            self.lows.extend([math.inf] * grow)
            self.highs.extend([-math.inf] * grow)
            self.sums.extend([0.0] * grow)
            counts.extend([0] * grow)
            self.lasts.extend([0.0] * grow)
        if y < self.lows[index]:
            self.lows[index] = y
        if y > self.highs[index]:
            self.highs[index] = y
        self.sums[index] += y
        counts[index] += 1
        self.lasts[index] = y
        if x > self.x_max:
            self.x_max = x
        self.points += 1
        self.y_last = y
        self.x_last = x

    def add_many(self, xs: list[float], ys: list[float]) -> None:
        """Points in order; the same buckets as ``add`` one by one, at a fraction of the cost: runs of
        points that fall in the same bucket are folded in local variables before touching the lists."""
        if not xs:
            return
        if self.origin is None:
            self.origin = xs[0]
        origin, limit, span = self.origin, self.max_buckets, self.span
        lows, highs, sums, counts, lasts = self.lows, self.highs, self.sums, self.counts, self.lasts
        size = len(counts)
        current, low, high, total, count, last = -1, 0.0, 0.0, 0.0, 0, 0.0
        for x, y in zip(xs, ys, strict=True):
            index = int((x - origin) / span) if x > origin else 0
            if index == current:
                if y < low:
                    low = y
                if y > high:
                    high = y
                total += y
                count += 1
                last = y
                continue
            if count:  # fold the finished run into its bucket
                if low < lows[current]:
                    lows[current] = low
                if high > highs[current]:
                    highs[current] = high
                sums[current] += total
                counts[current] += count
                lasts[current] = last
            if index >= size:
                if index >= limit:
                    while index >= limit:
                        self._halve()
                        span = self.span
                        index = int((x - origin) / span)
                    lows, highs, sums, counts, lasts = self.lows, self.highs, self.sums, self.counts, self.lasts
                    size = len(counts)
                if index >= size:
                    grow = index + 1 - size
                    lows.extend([math.inf] * grow)
                    highs.extend([-math.inf] * grow)
                    sums.extend([0.0] * grow)
                    counts.extend([0] * grow)
                    lasts.extend([0.0] * grow)
                    size = index + 1
            current, low, high, total, count, last = index, y, y, y, 1, y
        if count:
            if low < lows[current]:
                lows[current] = low
            if high > highs[current]:
                highs[current] = high
            sums[current] += total
            counts[current] += count
            lasts[current] = last
        self.x_max = max(self.x_max, max(xs))
        self.points += len(xs)
        self.y_last = ys[-1]
        self.x_last = xs[-1]

    def _halve(self) -> None:
        """Merge buckets pairwise: half as many, twice as wide."""
        lows, highs, sums, counts, lasts = self.lows, self.highs, self.sums, self.counts, self.lasts
        n = len(counts)
        new_lows, new_highs, new_sums, new_counts, new_lasts = [], [], [], [], []
        for i in range(0, n, 2):
            j = i + 1
            if j < n:
                new_lows.append(min(lows[i], lows[j]))
                new_highs.append(max(highs[i], highs[j]))
                new_sums.append(sums[i] + sums[j])
                new_counts.append(counts[i] + counts[j])
                new_lasts.append(lasts[j] if counts[j] else lasts[i])
            else:
                new_lows.append(lows[i])
                new_highs.append(highs[i])
                new_sums.append(sums[i])
                new_counts.append(counts[i])
                new_lasts.append(lasts[i])
        self.lows, self.highs, self.sums, self.counts, self.lasts = new_lows, new_highs, new_sums, new_counts, new_lasts
        self.span *= 2.0

    def x_range(self) -> tuple[float, float] | None:
        if self.origin is None or self.points == 0:
            return None
        return self.origin, max(self.origin, self.x_max)

    def y_range(self) -> tuple[float, float] | None:
        lows = [v for v, c in zip(self.lows, self.counts, strict=True) if c]
        if not lows:
            return None
        highs = [v for v, c in zip(self.highs, self.counts, strict=True) if c]
        return min(lows), max(highs)

    def columns(self, width: int, x_min: float, x_max: float) -> list[Column | None]:
        """``width`` columns over [x_min, x_max]; a column with no point is None."""
        if width <= 0 or self.origin is None:
            return [None] * max(0, width)
        lows: list[float] = [math.inf] * width
        highs: list[float] = [-math.inf] * width
        sums = [0.0] * width
        counts = [0] * width
        lasts = [0.0] * width
        scale = (width - 1) / (x_max - x_min) if x_max > x_min else 0.0
        origin, span = self.origin, self.span
        for i, count in enumerate(self.counts):
            if not count:
                continue
            x = origin + i * span
            if x < x_min - span or x > x_max:
                continue
            col = int((x - x_min) * scale + 0.5)
            col = 0 if col < 0 else width - 1 if col >= width else col
            if self.lows[i] < lows[col]:
                lows[col] = self.lows[i]
            if self.highs[i] > highs[col]:
                highs[col] = self.highs[i]
            sums[col] += self.sums[i]
            counts[col] += count
            lasts[col] = self.lasts[i]
        return [
            Column(lows[c], highs[c], sums[c] / counts[c], lasts[c], counts[c]) if counts[c] else None
            for c in range(width)
        ]


def downsample_minmax(xs: list[float], ys: list[float], width: int) -> list[tuple[float, float] | None]:
    """Reference one-shot downsampling of raw points (tests compare the bucketed result against it)."""
    if not xs or width <= 0:
        return [None] * max(0, width)
    x_min, x_max = min(xs), max(xs)
    scale = (width - 1) / (x_max - x_min) if x_max > x_min else 0.0
    out: list[list[float] | None] = [None] * width
    for x, y in zip(xs, ys, strict=True):
        col = int((x - x_min) * scale + 0.5)
        cell = out[col]
        if cell is None:
            out[col] = [y, y]
        else:
            cell[0] = min(cell[0], y)
            cell[1] = max(cell[1], y)
    return [None if c is None else (c[0], c[1]) for c in out]

"""Metric samples as the stages make them: labelled sample names and the histogram type.

Below the worker, so a stage can build its histograms (and its bounds live beside them) without
loading the worker's registry (streamapp.worker.metrics), which serves them.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence

# Seconds: from a fast local join to the default 5 s TTL and beyond (a TTL raised by the user).
JOIN_LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Seconds: from the colour detector on a scaled frame to the slow detectors on large ones (per-frame
# costs: docs/benchmarks.md, Measurements).
INFER_LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def sample_name(family: str, **labels: object) -> str:
    """``family{label="value",...}``: how a labelled sample is keyed in a snapshot."""
    if not labels:
        return family
    escaped = (str(value).replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
               for value in labels.values())
    return family + "{" + ",".join(f'{name}="{value}"' for name, value in zip(labels, escaped, strict=True)) + "}"


def family_of(sample: str) -> str:
    return sample.partition("{")[0]


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_sample(sample: str) -> tuple[str, dict[str, str]]:
    """The family and labels of a snapshot key: the inverse of :func:`sample_name`."""
    family, _, labels = sample.partition("{")
    return family, {name: re.sub(r"\\.", lambda escape: _UNESCAPE.get(escape.group(), escape.group()), value)
                    for name, value in _LABEL.findall(labels)}


class Histogram:
    """Observed values in cumulative buckets, as Prometheus histograms are exposed."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self._bucket_counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._bucket_counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def samples(self, family: str) -> dict[str, float]:
        values: dict[str, float] = {}
        cumulative = 0
        for bound, count in zip((*self.bounds, math.inf), self._bucket_counts, strict=True):
            cumulative += count
            values[sample_name(f"{family}_bucket", le=format_number(bound))] = cumulative
        values[f"{family}_sum"] = round(self.sum, 6)
        values[f"{family}_count"] = self.count
        return values


def format_number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))

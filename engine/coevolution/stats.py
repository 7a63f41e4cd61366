"""Intervals for the figures a run and an ablation report: a mean with its 95% bootstrap interval (scipy)."""

from __future__ import annotations

import math
import statistics

import numpy as np


def finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def interval(values, resamples: int = 2000) -> dict:
    """Mean and 95% percentile-bootstrap interval (scipy.stats.bootstrap, seeded); NaN values left out."""
    kept = finite(values)
    if not kept:
        return {"n": 0, "mean": None, "low": None, "high": None}
    mean = statistics.fmean(kept)
    if len(kept) < 2 or max(kept) == min(kept):
        return {"n": len(kept), "mean": mean, "low": mean, "high": mean}
    # Imported here: scipy.stats takes about a second to import, and every worker process imports this module but
    # only reports call it.
    from scipy.stats import bootstrap

    ci = bootstrap(
        (np.array(kept),),
        np.mean,
        confidence_level=0.95,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(0),
    ).confidence_interval
    return {"n": len(kept), "mean": mean, "low": float(ci.low), "high": float(ci.high)}


def paired_gain(before: list[bool], after: list[bool]) -> dict:
    """After minus before on the same items (item by item), with the 95% bootstrap interval of the mean difference."""
    if len(before) != len(after) or not before:
        raise ValueError(f"a paired gain needs the same items before and after ({len(before)} and {len(after)})")
    return interval([float(a) - float(b) for b, a in zip(before, after)])

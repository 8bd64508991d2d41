"""Correlations of a regression's scores with its labels, as Hugging Face's run_glue reports them for STS-B
(scipy's ``pearsonr`` and ``spearmanr``), in float64 numpy so the eval row needs no scipy. Spearman's rho is
Pearson's r of the ranks, ties taking their average rank."""

from __future__ import annotations

import numpy as np


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r of two (N,) arrays; NaN where either is constant (no correlation defined, as scipy says)."""
    x, y = (np.asarray(a, np.float64) - np.mean(a) for a in (x, y))
    scale = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / scale) if scale > 0 else float("nan")


def ranks(x: np.ndarray) -> np.ndarray:
    """(N,) values -> their ranks from 0, tied values sharing the mean of the ranks they span."""
    order = np.argsort(x, kind="stable")
    _, first, count = np.unique(np.asarray(x)[order], return_index=True, return_counts=True)
    out = np.empty(len(x), np.float64)
    out[order] = np.repeat(first + (count - 1) / 2, count)
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho of two (N,) arrays."""
    return pearson(ranks(x), ranks(y))

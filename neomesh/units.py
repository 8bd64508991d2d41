"""Sizes as people read them, for the lines commands print (no JAX here: data/make_dataset.py prints them too)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest decimal unit it reaches, to 3 significant figures: 35.2 kB, 1.23 MB, 812 B."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"

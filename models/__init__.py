"""Flax NNX model families and their building blocks, written against logical dimension names only."""

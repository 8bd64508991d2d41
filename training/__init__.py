"""Optimizer and schedule, checkpoints, metrics: the mechanics behind train.py."""

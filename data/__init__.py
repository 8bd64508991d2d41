"""Tokenizers, the embedded default corpus and the input pipelines train.py reads through ``make_source``."""

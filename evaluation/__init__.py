"""Evaluation beyond the eval loss: LAMBADA last-word accuracy and perplexity, multiple-choice scoring, and an
lm-evaluation-harness model, all over one scoring path (``evaluation.scorer.Scorer``)."""

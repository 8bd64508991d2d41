"""What predict.py prints for a model that labels rather than generates: an image classifier's likeliest classes
per file, a sequence classifier's per prompt (a regression's score: Hugging Face's num_labels 1; a multi-label
classifier's labels of probability >= 0.5), a token classifier's label per word, a masked LM's likeliest tokens per
[MASK], a question-answering model's answer to each question from its context (Hugging Face's image-classification,
text-classification, token-classification, fill-mask and question-answering pipelines). Batches are the config's
eval_batch_size rows
(the last padded to it) and, for text, n_ctx wide, so one shape is compiled."""

from __future__ import annotations

import sys
from collections.abc import Sequence

TEXT_CLASSIFIERS = ("sequence_classification", "token_classification")  # tasks whose prompts get labels
QUESTION_ANSWERING = "question_answering"  # answers each prompt (a question) from its pair (a context)
FILL_MASK = "masked_lm"  # a masked LM fills its prompts' [MASK] tokens, as Hugging Face's fill-mask pipeline does
DEFAULT_TOP_CLASSES = 5  # classes shown per image or text, as Hugging Face's image-classification pipeline shows


def top_classes(logits, names: Sequence[str], top: int) -> str:
    """``name probability, ...`` of the ``top`` likeliest classes of one row of class logits, likeliest first."""
    import numpy as np

    p = np.exp(logits - logits.max())
    p /= p.sum()
    return ", ".join(f"{names[i]} {p[i]:.4f}" for i in np.argsort(-p, kind="stable")[:top])


def labels_that_apply(logits, names: Sequence[str]) -> str:
    """``name p, ...`` of the labels whose sigmoid probability is >= 0.5 (a multi-label classifier's predicted
    labels, as its eval scores them), likeliest first; where none is, the likeliest with its probability."""
    import numpy as np

    p = 1 / (1 + np.exp(-logits))
    order = np.argsort(-p, kind="stable")
    applies = [i for i in order if logits[i] >= 0]  # p >= 0.5, decided as the objective decides it
    if not applies:
        return f"no label >= 0.5 (likeliest: {names[order[0]]} {p[order[0]]:.4f})"
    return ", ".join(f"{names[i]} {p[i]:.4f}" for i in applies)


def sequence_labels(logits, names: Sequence[str], top: int, cfg) -> str:
    """One row of a sequence classifier's logits in words: a regression's ``score 3.8125`` (its one logit, as
    transformers' pipeline gives it), a multi-label classifier's labels that apply, else the ``top`` likeliest."""
    if cfg.regression:
        return f"score {logits[0]:.4f}"
    return labels_that_apply(logits, names) if cfg.multi_label else top_classes(logits, names, top)


def class_names(model, path: str) -> Sequence[str]:
    """What the model's classes are called: a masked LM's vocabulary tokens (quoted: a token's spaces are part of
    it), a classifier's label names (its run's labels.json or its Hugging Face id2label), else their numbers."""
    from pretrained import label_names_of

    cfg = model.config
    if cfg.task == FILL_MASK:
        return TokenNames(model.tokenizer, cfg.n_vocab)
    return label_names_of(path, cfg.num_labels) or list(map(str, range(cfg.num_labels)))


class TokenNames(Sequence):
    """A vocabulary's tokens as class names, each decoded when it is shown (a few per mask, not every token of a
    50,000-token vocabulary for each command)."""

    def __init__(self, tokenizer, n_vocab: int):
        self.tokenizer, self.n_vocab = tokenizer, n_vocab

    def __len__(self) -> int:
        return self.n_vocab

    def __getitem__(self, i) -> str:
        return repr(self.tokenizer.decode([int(i)]))


def image_lines(model, files: list[str], names: list[str], top: int) -> list[str]:
    """``FILE: name p, ...`` for each image file, printed as each batch is done."""
    import jax
    import numpy as np

    rows = min(model.config.eval_batch_size, len(files))
    lines = []
    for start in range(0, len(files), rows):
        part = files[start:start + rows]
        images = model.read_images(part)["images"]
        images = np.concatenate([images, np.zeros((rows - len(part), *images.shape[1:]), images.dtype)])
        logits = np.asarray(jax.device_get(model({"images": images})), np.float64)[:len(part)]  # (B, C)
        for path, row in zip(part, logits):
            lines.append(f"{path}: {top_classes(row, names, top)}")
            print(lines[-1], flush=True)
    return lines


def text_lines(model, prompts: list[str], pairs: list[str | None], names: list[str], top: int) -> list[str]:
    """``prompt N: ...`` for each prompt (and second text): a sequence classifier's labels (``sequence_labels``),
    a token classifier's ``word/LABEL``s, a masked LM's likeliest tokens at each mask; printed as each batch is
    done, with a note where n_ctx cuts a prompt."""
    import jax
    import numpy as np

    cfg = model.config
    mask_id = None
    if cfg.task == FILL_MASK:
        from data.source import with_mask_token

        mask_id = with_mask_token(cfg, model.tokenizer).mlm_mask_token_id
    describe = {"sequence_classification": lambda row, ids, text, i: sequence_labels(row, names, top, cfg),
                "token_classification": lambda row, ids, text, i: word_labels(row, text, names, model, i),
                FILL_MASK: lambda row, ids, text, i: filled_masks(row, ids, mask_id, names, top, model, i)}[cfg.task]
    rows = min(cfg.eval_batch_size, len(prompts))
    lines = []
    for start in range(0, len(prompts), rows):
        part, pair_part = prompts[start:start + rows], pairs[start:start + rows]
        if cfg.task in ("sequence_classification", FILL_MASK):  # cut as training cut its examples; say so
            for i, (ids, _) in enumerate(model.tokenizer.encode_pairs(part, pair_part), start + 1):
                if len(ids) > cfg.n_ctx:
                    print(f"note: prompt {i}: {len(ids)} tokens, cut to n_ctx {cfg.n_ctx} (the longer text first); "
                          "the rest is not read", file=sys.stderr)
        batch = {key: np.pad(value, ((0, rows - len(part)), (0, cfg.n_ctx - value.shape[1])))
                 for key, value in model.tokenize(part, pair_part).items()}
        logits = np.asarray(jax.device_get(model(batch)), np.float64)[:len(part)]  # (B, C) or (B, T, C)
        for i, (text, row, ids) in enumerate(zip(part, logits, batch["inputs"]), start + 1):
            lines.append(f"prompt {i}: {describe(row, ids, text, i)}")
            print(lines[-1], flush=True)
    return lines


def answer_lines(model, questions: list[str], contexts: list[str]) -> list[str]:
    """``prompt N: 'answer' (score S)`` for each question, its answer the span of its context the model picks over
    every window of it (``Pretrained.answer``), S its start + end logit; printed as each is answered."""
    lines = []
    for i, (question, context) in enumerate(zip(questions, contexts), 1):
        text, score = model.answer(question, context)
        lines.append(f"prompt {i}: {text!r} (score {score:.4f})")
        print(lines[-1], flush=True)
    return lines


def word_labels(logits, text: str, names: list[str], model, prompt: int) -> str:
    """``word/LABEL ...``: each word's label from its first token's (T, C) logits, as training placed the words
    (data/token_labels.py); a note names the words n_ctx leaves out."""
    import numpy as np

    from data.token_labels import word_pieces

    n_ctx, words = model.config.n_ctx, text.split()
    pieces = [len(ids) for ids in word_pieces(model.tokenizer, words)]
    firsts = 1 + np.cumsum([0, *pieces])[:-1]  # each word's first token, after [CLS]
    kept = [(word, names[int(logits[t].argmax())]) for word, t in zip(words, firsts) if t < n_ctx - 1]
    if len(kept) < len(words):
        print(f"note: prompt {prompt}: its first {len(kept)} of {len(words)} words fit n_ctx {n_ctx}; the rest are "
              "not labelled", file=sys.stderr)
    return " ".join(f"{word}/{label}" for word, label in kept)


def filled_masks(logits, ids, mask_id: int, names: Sequence[str], top: int, model, prompt: int) -> str:
    """``mask 1: 'tok' p, ...; mask 2: ...``: the ``top`` likeliest tokens at each ``mask_id`` of one row's (T, V)
    logits."""
    import numpy as np

    from config import ConfigError

    masks = np.flatnonzero(ids == mask_id)
    if not len(masks):
        raise ConfigError(f"prompt {prompt}: no {model.tokenizer.decode([mask_id])} token (id {mask_id}) in its first "
                          f"n_ctx {model.config.n_ctx} tokens; a masked LM fills the masks of a prompt")
    return "; ".join(f"mask {k}: {top_classes(logits[t], names, top)}" for k, t in enumerate(masks, 1))

"""The tokenizer files of an export whose tokenizer is NeoMesh's own: a tokenizer.json (trained here, or written by
train.py) without the tokenizer_config.json Hugging Face saves beside its tokenizers.

Without a tokenizer_config.json, transformers picks the tokenizer class by the model's type (T5Tokenizer,
BertTokenizer), which cannot read a byte-level BPE; and a trained tokenizer.json adds no special tokens, where
NeoMesh's classifiers, encoders and T5 read end-of-text (or [CLS]) around each text. So an export writes a
tokenizer_config.json naming PreTrainedTokenizerFast and the special tokens by role, and gives tokenizer.json the
post-processor that adds what NeoMesh's data adds for that model (each family's ``text_processor``):
``AutoTokenizer.from_pretrained(DIR)(text)["input_ids"]`` are then the ids NeoMesh feeds it. A tokenizer that came
with its own tokenizer_config.json (an import) is copied as it is.
"""

from __future__ import annotations

import json
import os

from config import Config
from data.source import MASK_TOKENS

UNK_TOKENS = ("[UNK]", "<unk>")  # BERT's; RoBERTa's and T5's


def is_own(tokenizer_dir: str) -> bool:
    """Whether ``tokenizer_dir`` holds a tokenizer.json and no tokenizer_config.json."""
    return os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")) and \
        not os.path.exists(os.path.join(tokenizer_dir, "tokenizer_config.json"))


def tokenizer_files(cfg: Config, tokenizer, mapping) -> dict[str, dict]:
    """{file name: JSON content} of the tokenizer files an export of ``cfg`` writes over the copied ones: its
    tokenizer_config.json, and tokenizer.json where the family's ``text_processor`` adds special tokens."""
    files = {"tokenizer_config.json": tokenizer_config(cfg, tokenizer, mapping.TOKEN_ROLES)}
    processor = mapping.text_processor(cfg, tokenizer)
    if processor is not None:
        files["tokenizer.json"] = with_post_processor(tokenizer, processor)
    return files


def tokenizer_config(cfg: Config, tokenizer, roles: tuple[str, ...]) -> dict:
    """The tokenizer_config.json that makes transformers load tokenizer.json as it is, with the special tokens of
    ``roles`` the tokenizer has; token type ids only for a model with a table of them (GPT-Neo would add the
    embedding of type 0 to every token, RoBERTa has one row)."""
    tokens = {f"{role}_token": token for role, token in role_tokens(tokenizer).items() if role in roles and token}
    inputs = ["input_ids", "token_type_ids", "attention_mask"] if cfg.n_token_types > 1 else \
        ["input_ids", "attention_mask"]
    return {"tokenizer_class": "PreTrainedTokenizerFast", **tokens, "model_input_names": inputs,
            "clean_up_tokenization_spaces": False}  # decoding gives the text back as NeoMesh's does


def role_tokens(tokenizer) -> dict[str, str | None]:
    """The token that plays each of transformers' special-token roles in NeoMesh's data: end-of-text ends a text
    and separates two (and is config.json's bos_token_id), [CLS] where the tokenizer has it, else end-of-text,
    starts a classifier's input, the padding id fills rows; None where the tokenizer has no such token."""
    def first(tokens):
        return next((t for t in tokens if tokenizer.token_id(t) is not None), None)

    eos = tokenizer.eos_token
    return {"bos": eos, "eos": eos, "sep": eos, "cls": tokenizer.cls_token or eos,
            "pad": tokenizer.tok.id_to_token(tokenizer.padding_id), "unk": first(UNK_TOKENS),
            "mask": first(MASK_TOKENS)}


def with_post_processor(tokenizer, processor) -> dict:
    """The tokenizer.json content of ``tokenizer`` with ``processor`` as its post-processor."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer.tok.to_str())
    tok.post_processor = processor
    return json.loads(tok.to_str())

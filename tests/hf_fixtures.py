"""Small Hugging Face reference models built locally with random weights (no downloads), saved as directories
with a byte-level BPE tokenizer, as a user's checkpoint would be."""

from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data import corpus

VOCAB = 320


def tokenizer() -> Tokenizer:
    """A byte-level BPE with <|endoftext|> trained on a slice of the embedded corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text for _, text in corpus.documents()[:40]], trainer)
    return tok


def randomize(model) -> None:
    """The default init (std 0.02, LayerNorms at (1, 0), zero biases) makes attention almost uniform and the MLP
    almost linear, which would hide a wrong scale, mask or activation: make every part of the model matter. The
    embeddings keep their small init, so greedy decoding wanders over many tokens instead of repeating one."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif any(s in name for s in ("q_proj", "k_proj", "v_proj", "c_attn", "c_fc")):
                p.normal_(0.0, 0.3)


def gpt_neo(n_embd=64, n_head=2, n_layer=2, n_ctx=64, window=8, attention_types=None, tied=True,
            vocab=VOCAB) -> transformers.GPTNeoForCausalLM:
    cfg = transformers.GPTNeoConfig(
        vocab_size=vocab, max_position_embeddings=n_ctx, hidden_size=n_embd, num_layers=n_layer, num_heads=n_head,
        attention_types=attention_types or [[["global", "local"], n_layer // 2]], window_size=window,
        intermediate_size=4 * n_embd, activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0,
        attention_dropout=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPTNeoForCausalLM(cfg).eval()
    randomize(model)
    return model


def gpt2(n_embd=64, n_head=4, n_layer=2, n_ctx=64, vocab=VOCAB) -> transformers.GPT2LMHeadModel:
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=n_ctx, n_embd=n_embd, n_layer=n_layer,
                                  n_head=n_head, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    randomize(model)
    return model


def save(model, path) -> str:
    """Saves ``model`` (safetensors) and the test tokenizer to ``path``; returns it as a string."""
    model.save_pretrained(str(path))
    tokenizer().save(str(path / "tokenizer.json"))
    return str(path)


ENCODERS = {  # (model_type, head) -> transformers class
    ("bert", None): transformers.BertModel, ("bert", "masked_lm"): transformers.BertForMaskedLM,
    ("bert", "sequence_classification"): transformers.BertForSequenceClassification,
    ("roberta", None): transformers.RobertaModel, ("roberta", "masked_lm"): transformers.RobertaForMaskedLM,
    ("roberta", "sequence_classification"): transformers.RobertaForSequenceClassification,
    ("bert", "token_classification"): transformers.BertForTokenClassification,
    ("roberta", "token_classification"): transformers.RobertaForTokenClassification,
}


def encoder(kind="bert", head="masked_lm", n_embd=48, n_head=4, n_layer=2, n_ctx=40, vocab=VOCAB, d_ff=80,
            num_labels=3, act="gelu"):
    """A randomly initialised BERT or RoBERTa (with ``head``: None, "masked_lm", "sequence_classification" or
    "token_classification")."""
    config_class = transformers.BertConfig if kind == "bert" else transformers.RobertaConfig
    extra = dict(max_position_embeddings=n_ctx + 2, pad_token_id=1, type_vocab_size=1) if kind == "roberta" else \
        dict(max_position_embeddings=n_ctx, type_vocab_size=2)
    cfg = config_class(vocab_size=vocab, hidden_size=n_embd, num_hidden_layers=n_layer, num_attention_heads=n_head,
                       intermediate_size=d_ff, hidden_act=act, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, num_labels=num_labels, **extra)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = ENCODERS[kind, head](cfg).eval()
    torch.manual_seed(1)
    with torch.no_grad():  # every part matters: see randomize
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif any(s in name for s in ("query", "key", "value", "dense")):
                p.normal_(0.0, 0.15)
    return model


def t5_tokenizer() -> Tokenizer:
    """A byte-level BPE laid out like T5's tokenizer.json: <pad> 0, </s> 1, <unk> 2, sentinels <extra_id_N>, and
    a post-processor that ends every encoding with </s>."""
    from tokenizers import processors

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(8)]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text for _, text in corpus.documents()[:40]], trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return tok


def t5(n_embd=48, n_head=4, d_kv=None, n_layer=2, n_decoder_layer=3, d_ff=80, vocab=VOCAB, ffn="relu", tied=True,
       encoder_only=False, buckets=8, max_distance=20):
    """A randomly initialised T5ForConditionalGeneration (or T5EncoderModel), small relative-position buckets so
    short sequences reach the logarithmic ones. Untied models get their own random ``lm_head``."""
    cfg = transformers.T5Config(
        vocab_size=vocab, d_model=n_embd, d_kv=d_kv or n_embd // n_head, d_ff=d_ff, num_layers=n_layer,
        num_decoder_layers=n_decoder_layer, num_heads=n_head, relative_attention_num_buckets=buckets,
        relative_attention_max_distance=max_distance, dropout_rate=0.0, feed_forward_proj=ffn,
        tie_word_embeddings=tied, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = (transformers.T5EncoderModel if encoder_only else transformers.T5ForConditionalGeneration)(cfg).eval()
    torch.manual_seed(1)
    with torch.no_grad():  # every part matters: see randomize
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif "relative_attention_bias" in name:
                p.normal_(0.0, 1.0)
            elif name == "shared.weight":  # small: else a token's own row dominates the residual stream and a
                p.mul_(0.1)  # tied model keeps repeating the decoder's start token
        if not tied and not encoder_only:
            model.lm_head.weight = torch.nn.Parameter(torch.randn(vocab, n_embd) * n_embd ** -0.5)
    return model


def save_t5(model, path, old_config: bool = True) -> str:
    """Saves a T5 (safetensors) with the T5-style test tokenizer. transformers 5 writes an untied model's
    config.json as ``tie_word_embeddings: true, scale_decoder_outputs: false``; ``old_config`` rewrites it as older
    transformers wrote it and T5 v1.1 checkpoints on the Hub say it: ``tie_word_embeddings: false`` alone."""
    import json

    model.save_pretrained(str(path))
    t5_tokenizer().save(str(path / "tokenizer.json"))
    untied = getattr(model, "lm_head", None) is not None and model.lm_head.weight is not model.shared.weight
    if untied and old_config:
        config = json.loads((path / "config.json").read_text())
        config["tie_word_embeddings"] = False
        config.pop("scale_decoder_outputs", None)
        (path / "config.json").write_text(json.dumps(config))
    return str(path)

"""The run configuration: GPT-Neo's JSON keys, typed, defaulted and validated once at load.

Every key has a real default and a one-line doc (``python train.py --help-config`` prints them). Unknown keys
are an error that suggests the closest known key; keys that only meant something to mesh-tensorflow on TPUs are
accepted and explained; GPT-Neo features that NeoMesh does not implement yet are an error only when switched on.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import types
import typing
from typing import Any, Optional

from models import registry

ATTENTION_KINDS = ("global", "local", "linear", "none")
# What a run trains; each task is an objective (training/objectives.py) and the head that serves it.
TASKS = ("causal_lm", "masked_lm", "sequence_classification", "token_classification", "seq2seq",
         "image_classification", "question_answering")
# Tasks whose head gives logits for every token (models/heads.py TokenClassificationHead): question answering's
# two are each token's start and end logits, as Hugging Face's ``qa_outputs``.
TOKEN_HEAD_TASKS = ("token_classification", "question_answering")
# Mixture-of-experts options (``moe_params``) and their defaults; see models/moe.py.
MOE_DEFAULTS = {
    "num_experts": 8,  # experts per MoE layer; a layout 'experts:x' splits them over mesh axis x
    "top_k": 2,  # experts each token is routed to: 1 (Switch) or 2 (GShard)
    "capacity_factor": 1.25,  # expert capacity = ceil(top_k * sequence length * capacity_factor / num_experts)
    "aux_loss_weight": 0.01,  # weight of the load-balancing loss added to the training loss
    "z_loss_weight": 0.001,  # weight of the router z-loss (mean squared logsumexp of router logits)
}
# MLP activations (models/layers.py ACTIVATIONS): NeoMesh's names and GPT-Neo's parameter-free set
# (models/activations.py there). GPT-Neo's activations with learned parameters are refused by name.
ACTIVATIONS = ("gelu", "gelu_exact", "relu", "silu", "swish", "selu", "elu", "softplus", "tanh", "sigmoid",
               "abs", "sin", "cos", "sign", "lrelu001", "lrelu020", "id", "triangle_relax", "square_relax", "spike",
               "spike2", "tanhshrink", "softsign", "softmax", "logsoftmax", "bipolarsigmoid", "rrelu", "elish",
               "arcsinh", "maxsig", "cosid", "minsin", "maxtanh", "mish", "tanhexp", "lisht", "seagull", "snake",
               "roottanh", "softplusmone")
LEARNED_ACTIVATIONS = ("aria", "prelu", "parcsinh", "psoftplus", "proottanh")
# Hugging Face's names of GELU's tanh approximation, NeoMesh's "gelu": the closest spelling, "gelu_exact", is the
# other GELU (Hugging Face's "gelu"), so these get an error naming the right one instead of that suggestion.
HF_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# Parameter-efficient fine-tuning (``peft``, training/peft/): each part's options and their defaults. A part is
# on when the ``peft`` dict names it (``{"lora": {}}`` takes every default).
PEFT_PARTS = {
    "lora": {"targets": ["q", "v"], "rank": 8, "alpha": 16.0, "dropout": 0.0},
    "prefix": {"length": 16, "hidden": 0},
    "adapter": {"size": 32, "activation": "relu", "after": ["attn", "mlp"]},
}
PEFT_KEYS = (*PEFT_PARTS, "bitfit", "trainable", "checkpoint")
# What ``peft.trainable`` may name besides parameter path patterns (``blocks/1/*``): see training/peft/trainable.py.
TRAINABLE_PARTS = ("lora", "prefix", "adapter", "head", "bias", "norm", "embeddings", "all")
# Evaluation tasks run at every evaluation (evaluation/tasks.py): GPT-Neo's lambada, and multiple choice.
EVAL_TASKS = ("lambada", "multiple_choice")
# recompute_grad's policies: what a block keeps for the backward pass (models/block.py REMAT_POLICIES).
REMAT_POLICIES = ("none", "full", "dots_saveable")


class ConfigError(ValueError):
    """Bad user input (a config key, a file, a mesh axis). The command-line tools print it as one line."""


class UnknownKeyError(ConfigError):
    """A key nested in another (``moe_params.num_expert``) that is not known: ``from_dict`` names the file it is
    in, as it names the file of an unknown top-level key."""


def _key(default, doc, choices=None, minimum=None, maximum=None):
    meta = {"doc": doc, "choices": choices, "min": minimum, "max": maximum}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: json.loads(json.dumps(default)), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Config:
    # Model family and task (models/registry.py: a family's defaults fill the keys a config leaves out).
    model: str = _key("gpt_neo", "model family: " + ", ".join(registry.FAMILIES), choices=tuple(registry.FAMILIES))
    task: str = _key("causal_lm", "what is trained: " + ", ".join(TASKS) + "; default: the family's "
                     "(masked_lm when mlm_training)", choices=TASKS)
    num_labels: int = _key(2, "classes of sequence_classification / token_classification / image_classification; "
                           "1: sequence_classification is regression (one float per text, MSE loss), as in Hugging "
                           "Face", minimum=1)
    multi_label: bool = _key(False, "sequence_classification: each text has any number of the num_labels labels "
                             "(Hugging Face's problem_type multi_label_classification): one sigmoid per label, "
                             "binary cross-entropy on a multi-hot target; predicted: the labels of probability >= 0.5")
    head_hidden: list = _key([], "hidden widths of an MLP classification head (SwissArmyTransformer's MLPHeadMixin, "
                                 "activation_function between layers); []: a linear head")
    doc_stride: int = _key(128, "question_answering: tokens two windows of a long context share (run_qa's "
                                "doc_stride); each window holds the question and up to n_ctx tokens", minimum=0)
    max_answer_length: int = _key(30, "question_answering: the longest answer span in tokens an evaluation or "
                                      "predict.py picks (run_qa's max_answer_length)", minimum=1)

    # Model shape.
    n_ctx: int = _key(2048, "context length in tokens (learned positions)", minimum=1)
    n_positions: Optional[int] = _key(None, "rows of the learned position table; null: n_ctx. More than n_ctx keeps "
                                            "a longer table (an imported model's) while training on n_ctx tokens, "
                                            "as transformers' max_seq_length does", minimum=1)
    n_embd: int = _key(768, "model width", minimum=1)
    n_head: int = _key(12, "attention heads; must divide n_embd", minimum=1)
    n_layer: int = _key(12, "transformer blocks", minimum=1)
    n_vocab: int = _key(50257, "embedding rows; at least the tokenizer's vocabulary size", minimum=2)
    d_kv: Optional[int] = _key(None, "features per attention head (T5's d_kv); default n_embd / n_head", minimum=1)
    n_decoder_layer: Optional[int] = _key(None, "encoder-decoder models (t5): decoder blocks; default n_layer (the "
                                                "encoder's); 0: an encoder only", minimum=0)
    n_decoder_ctx: Optional[int] = _key(None, "seq2seq: target tokens per example; default: what span_corruption "
                                              "makes of n_ctx input tokens, else n_ctx", minimum=1)
    decoder_start_token_id: int = _key(0, "seq2seq: the id the decoder starts from (T5: 0, its padding id)",
                                       minimum=0)
    relative_attention_num_buckets: int = _key(32, "t5: relative position buckets per stack", minimum=2)
    relative_attention_max_distance: int = _key(128, "t5: distance from which keys share the last bucket",
                                                minimum=2)
    attention_types: Optional[list] = _key(
        None, 'per-layer attention in GPT-Neo syntax [[["global","local"], 6]]; default: every layer global')
    local_attention_radius: int = _key(
        256, "local window: a token sees itself and the previous window-1 tokens", minimum=1)
    activation_function: str = _key("gelu", "MLP activation ('gelu' is GPT-Neo's tanh approximation; GPT-Neo's "
                                    "key activation_fn is the same key); --help-config lists the rest",
                                    choices=ACTIVATIONS)
    d_ff: Optional[int] = _key(None, "MLP hidden width (of each half with mlp_glu); default 4*n_embd", minimum=1)
    mlp_glu: bool = _key(False, "gated MLP: activation(x W_gate) * (x W_fc), GPT-Neo's mlp_glu (GEGLU/SwiGLU)")
    norm: str = _key("layernorm", "block norm: layernorm, rmsnorm (T5) or scalenorm (GPT-Neo's: normalised x "
                     "times one learned scalar)", choices=("layernorm", "rmsnorm", "scalenorm"))
    scalenorm: bool = _key(False, "GPT-Neo's spelling of norm: scalenorm")
    norm_position: str = _key("pre", "norm before each sub-layer (pre, GPT) or after the residual sum (post, "
                                     "BERT)", choices=("pre", "post"))
    layer_norm_epsilon: float = _key(1e-5, "epsilon of every norm", minimum=0.0)
    rezero: bool = _key(False, "ReZero: no block norms, each residual branch scaled by a learned scalar from 0")
    macaron: bool = _key(False, "macaron blocks: a half-step MLP before attention, and the MLP halved")
    axial_pos_emb: Optional[list] = _key(None, "axial position embedding [A, B] (A*B >= n_ctx): position "
                                               "a*B+b gets (row_a + column_b) / 2")
    attention_scale: str = _key("unscaled", "attention logits q.k 'unscaled' (GPT-Neo, T5: folded into the init) "
                                            "or times 'inverse_sqrt_head_dim' (GPT-2, BERT)",
                                choices=("unscaled", "inverse_sqrt_head_dim"))
    dense_bias: bool = _key(True, "biases on the attention output and MLP projections")
    image_size: int = _key(224, "vit: height and width of the input images in pixels", minimum=1)
    patch_size: int = _key(16, "vit: each image is cut into patch_size x patch_size patches, one token each",
                           minimum=1)
    num_channels: int = _key(3, "vit: colour channels of the input images", minimum=1)
    interpolate_positions: bool = _key(False, "vit: accept images of another size than image_size, resizing the "
                                              "learned position table bicubically to their patch grid (as "
                                              "transformers' interpolate_pos_encoding)")
    image_augmentation: bool = _key(True, "vit: training images shifted by up to one pixel, the shift a function "
                                          "of the seed and the example's place in the data stream (exact resume)")
    image_mean: Optional[list] = _key(None, "vit: per channel, pixels (scaled to [0, 1]) are fed as (x - image_mean) "
                                            "/ image_std, as Hugging Face's image processors do ([0.5, 0.5, 0.5] "
                                            "for Google's ViTs; read from an imported model's "
                                            "preprocessor_config.json); null: fed as they are")
    image_std: Optional[list] = _key(None, "vit: per channel, the divisor of image_mean's normalisation; given with "
                                           "image_mean")
    n_token_types: int = _key(0, "token type (segment A/B) embeddings, BERT's type_vocab_size; 0: none",
                              minimum=0)
    position_offset: int = _key(0, "id of the first position (RoBERTa: 2; its table reserves the rows below)",
                                minimum=0)
    res_dropout: float = _key(0.0, "dropout on each residual branch output", minimum=0.0, maximum=1.0)
    embed_dropout: float = _key(0.0, "dropout on token+position embeddings", minimum=0.0, maximum=1.0)
    attn_dropout: float = _key(0.0, "dropout on attention probabilities", minimum=0.0, maximum=1.0)
    classifier_dropout: Optional[float] = _key(None, "dropout on a classification head's input (transformers' "
                                                     "classifier_dropout); null: res_dropout", minimum=0.0,
                                               maximum=1.0)
    scale_by_depth: bool = _key(True, "scale the init of residual output projections by 1/sqrt(n_layer)")
    scale_by_in: bool = _key(False, "scale the init of MLP projections by 1/sqrt(fan_in)")
    no_weight_tie: bool = _key(False, "use a separate output projection instead of the token embedding")
    qkv_bias: bool = _key(False, "biases on the q/k/v projections (GPT-2 has them, GPT-Neo does not)")
    num_mem_kv: int = _key(0, "learned memory key/value slots every query of a global layer attends to", minimum=0)
    moe_layers: Optional[list] = _key(None, "layer indices whose MLP is a mixture of experts")
    moe_params: Optional[dict] = _key(None, "mixture-of-experts options: " + ", ".join(
        f"{k} (default {v})" for k, v in MOE_DEFAULTS.items()))
    rotary_emb: bool = _key(False, "rotary position embedding (GPT-J's interleaved form) instead of learned "
                                   "positions")
    rotary_emb_fraction: float = _key(1.0, "fraction of each head's dimensions rotated when rotary_emb is on "
                                           "(GPT-J 6B: 0.25)", minimum=0.0, maximum=1.0)
    rotary_style: str = _key("interleaved", "which features rotary pairs: 'interleaved' (GPT-J: 2i with 2i+1) or "
                                            "'halves' (GPT-Neo, GPT-NeoX: i with i + R/2)",
                             choices=("interleaved", "halves"))
    attention_kernel: str = _key("auto", "softmax attention kernel: 'auto' (splash on TPUs, cuDNN on GPUs where "
                                         "they apply, else XLA), 'xla', 'cudnn' or 'splash'",
                                 choices=("auto", "xla", "cudnn", "splash"))
    decode_kernel: str = _key("xla", "attention of cached decoding (prefill and each new token: an explicit mask "
                                     "over the cache): 'xla', or 'cudnn' on a CUDA GPU (cuDNN's flash attention "
                                     "with the mask as a bias, bf16/fp16: one call per layer and token; as fast "
                                     "as 'xla' on an H200, whose plan is the shorter since the heads-first KV "
                                     "cache)", choices=("xla", "cudnn"))
    attention_fn: Optional[str] = _key(
        None, "a custom attention function as 'module:function', with models.attention.softmax_attention's "
        "signature, computing every softmax self-attention layer (or those of attention_fn_layers), e.g. "
        "'training.peft.hooks:alibi_attention' (ALiBi); null: the built-in. The module is imported when the model "
        "is built (train.py, predict.py, eval.py, Pretrained): it must be importable there")
    attention_fn_layers: Optional[list] = _key(None, "the block numbers attention_fn computes in; null: every "
                                                     "softmax self-attention layer")
    share_parameters: bool = _key(False, "GPT-Neo's share_parameters: every layer uses one set of block weights "
                                         "(the first layer with each weight owns it; global and local layers "
                                         "share q/k/v/out, MoE layers one expert set, dense layers one MLP)")
    moe_activation: Optional[str] = _key(None, "activation inside the experts of moe_layers (GPT-Neo's default: "
                                               "relu); null: activation_function", choices=ACTIVATIONS)
    z_loss: float = _key(0.0, "causal_lm/masked_lm training: adds z_loss * mean(logsumexp(logits)^2), reported "
                              "as logits_z_loss (GPT-Neo always added 1e-4; set 1e-4 to train as it did)",
                         minimum=0.0)
    loss_chunk: Optional[int] = _key(
        None, "causal_lm: compute the loss this many positions at a time, so the (B, T, V) float32 logits are never "
        "whole in memory (0: never; null: chunks of 512 once one device's share of them would pass an eighth of its "
        "memory)", minimum=0)
    logits_pad_multiple: Optional[int] = _key(
        None, "the output head's matmul runs over the vocabulary padded with zero rows to a multiple of this and "
        "drops the padding's logits (GPU matmuls favour aligned shapes: 50257 -> 50304 for 64 or 128); parameters, "
        "checkpoints and results are unchanged; 0: as is; null: 128 on GPUs, 0 elsewhere; a layout that splits the "
        "vocabulary keeps it as is", minimum=0)
    entmax_loss: bool = _key(False, "causal_lm/masked_lm: the 1.3-entmax loss (GPT-Neo's alpha) instead of "
                                    "softmax cross-entropy; predict.py then samples from entmax")
    causal: bool = _key(True, "causal (decoder) attention; false: every token sees the whole sequence")
    mlm_training: bool = _key(False, "masked-LM batches (data/mlm.py) and objective; needs causal: false")
    mlm_cls_token_id: Optional[int] = _key(None, "MLM: id prepended as CLS")
    mlm_mask_prob: float = _key(0.15, "MLM: fraction of tokens selected", minimum=0.0, maximum=1.0)
    mlm_same_token_prob: float = _key(0.10, "MLM: selected tokens kept as they are", minimum=0.0, maximum=1.0)
    mlm_random_token_prob: float = _key(0.10, "MLM: selected tokens replaced at random", minimum=0.0, maximum=1.0)
    mlm_mask_ignore_ids: list = _key([], "MLM: ids never masked")
    mlm_mask_token_id: Optional[int] = _key(None, "MLM: the [MASK] id; default: the tokenizer's [MASK] or <mask>")
    mlm_random_token_ids: Optional[list] = _key(None, "MLM: ids random replacements are drawn from")
    span_corruption: bool = _key(False, "T5 span-corruption batches (data/spans.py) for the seq2seq objective")
    span_noise_density: float = _key(0.15, "span corruption: fraction of tokens dropped from the inputs",
                                     minimum=0.0, maximum=1.0)
    span_mean_length: float = _key(3.0, "span corruption: mean length of a dropped span", minimum=1.0)
    pack_pairs: bool = _key(False, "seq2seq pairs: several to a row where they fit (segment ids 1, 2, ...), as "
                            "T5's seqio packs them (data/pairs.py); span corruption's rows are full already")

    # Optimisation.
    opt_name: str = _key("adam", "'adam' (AdamW, GPT-Neo semantics) or 'adafactor' (GPT-Neo's: constant lr, "
                                 "see weight_decay and ada_epsilon1/2)",
                         choices=("adam", "adamw", "adafactor"))
    lr: float = _key(6e-4, "peak learning rate", minimum=0.0)
    lr_decay: str = _key("cosine", "decay after warmup, down to 0.1*lr after lr_decay_end updates",
                         choices=("cosine", "linear", "none"))
    lr_decay_end: Optional[int] = _key(None, "updates after which decay ends (default: train_steps; the schedule "
                                             "counts updates from 0, as GPT-Neo's: step N trains at its value for "
                                             "N-1, so the last step of a run is one before the end value)", minimum=1)
    warmup_steps: int = _key(3000, "linear warmup from 0 to lr over this many updates (step 1 trains at 0, as in "
                                   "GPT-Neo)", minimum=0)
    weight_decay: Optional[float] = _key(
        None, "adam: decoupled weight decay, not on biases and norms (null: 0.01); adafactor: as in GPT-Neo, the "
        "constant decay rate of its second-moment estimates (null: Adafactor's 1-(step+1)^-0.8)", minimum=0.0)
    ada_epsilon1: float = _key(1e-30, "Adafactor: added to squared gradients", minimum=0.0)
    ada_epsilon2: float = _key(1e-3, "Adafactor: floor of the parameter scale its updates are relative to",
                               minimum=0.0)
    beta1: float = _key(0.9, "Adam beta1 (Adafactor momentum when > 0)", minimum=0.0, maximum=1.0)
    beta2: float = _key(0.95, "Adam beta2", minimum=0.0, maximum=1.0)
    epsilon: float = _key(1e-8, "Adam epsilon", minimum=0.0)
    gradient_clipping: float = _key(1.0, "global-norm clip (0 disables)", minimum=0.0)
    train_batch_size: int = _key(32, "global batch in sequences", minimum=1)
    eval_batch_size: int = _key(32, "global eval batch in sequences", minimum=1)
    train_steps: int = _key(10000, "optimizer steps to train for", minimum=1)
    eval_steps: int = _key(10, "batches per evaluation (0 disables eval; GPT-Neo's meaning: Hugging Face's "
                               "eval_steps, evaluate every N steps, is eval_every)", minimum=0)
    eval_every: int = _key(0, "evaluate every N steps (0: only at the end)", minimum=0)
    log_every: Optional[int] = _key(
        None, "without a progress bar (output not a terminal, or --no-progress): a log line every N steps; "
        "default: a tenth of train_steps, at most 50", minimum=1)
    steps_per_checkpoint: int = _key(5000, "checkpoint every N steps (and always at the end)", minimum=1)
    keep_checkpoints: int = _key(3, "how many recent checkpoints to keep (the one a run resumed from, verified, "
                                    "is kept too)", minimum=1)
    max_bad_steps: int = _key(5, "a step whose gradient is non-finite (or spikes, see grad_spike_factor) is "
                                 "skipped; this many in a row stop the run with an error", minimum=1)
    grad_spike_factor: float = _key(0.0, "also skip a step whose gradient norm is above this many times its "
                                         "running mean (0: off)", minimum=0.0)
    precision: str = _key("float32", "'bfloat16': bf16 compute, fp32 master weights and loss",
                          choices=("float32", "bfloat16"))
    recompute_grad: bool | str = _key(
        False, "rematerialise blocks in the backward pass: 'full' (true: keep only each block's input), "
        "'dots_saveable' (keep matmul outputs, recompute the elementwise rest), 'none' (false)")
    scan_layers: bool = _key(False, "run each stack as a loop over its repeating group of layers (GPT-Neo's "
                                    "global/local pair), its layers stored stacked in the train state: compile "
                                    "time does not grow with depth; results unchanged, generation and export "
                                    "see per-layer parameters, a run may resume with it flipped; not with "
                                    "moe_layers")
    tokens_per_mb_per_replica: Optional[int] = _key(
        None, "tokens per microbatch per data-parallel replica: gradient accumulation (a replica's share of the "
        "batch that fits in one is one microbatch)", minimum=1)
    accumulate_unreduced: bool = _key(
        False, "with gradient accumulation: each device sums its microbatches' gradients and the batch axes reduce "
        "them once per step, not after every microbatch (PyTorch DDP's no_sync); parameters the layout splits "
        "over the batch axes (FSDP) are then gathered whole once per step and their gradient sums held whole; "
        "dropout masks differ from the reduced path's; not with moe_layers")
    seed: int = _key(1234, "seed for init, data order and dropout")

    # Parallelism.
    mesh_shape: str = _key("x:-1", "device mesh 'x:4,y:2'; one axis may be -1 (the rest of the devices); 'auto' "
                                   "(with layout 'auto'): chosen for the devices, model and memory")
    layout: str = _key("batch:x", "tensor dimension -> mesh axes, e.g. 'batch:x,heads:y,embd:y'; 'batch:x+z' splits "
                                  "over two axes, 'name:none' not at all; activation_embd / activation_vocab place "
                                  "the residual stream / logits apart from embd / vocab (default: like them); "
                                  "'auto': chosen, with the reason printed")

    # Data and output.
    datasets: list = _key([["embedded", None, None, None]],
                          "[[id, stitch, sampling_mode, weight], ...]; id names configs/dataset_configs/ID.json")
    data_shards: int = _key(
        1, "the input stream is this many interleaved shards, each filling its block of rows of every batch; a "
        "process reads only the shards its rows need, so a multiple of the process count splits the reading. "
        "Fixed by the config, not the process count: batches are the same on any number of processes", minimum=1)
    data_start_step: int = _key(
        0, "the step that trains on the input stream's first batch (step N reads batch N - data_start_step): a run "
        "converted at GPT-Neo's global step (convert.gpt_neo_mtf --keep-step) reads its data from the start there "
        "instead of skipping that many batches", minimum=0)
    tokenizer_path: Optional[str] = _key(
        None, "tokenizer for text datasets (tfds:NAME): a tokenizer.json, a GPT-2 vocab.json+merges.txt directory, "
        "or 'bytes'; default: the first dataset config's")
    tfds_data_dir: Optional[str] = _key(None, "local TFDS data dir for tfds:NAME datasets (default: TFDS's own)")
    model_path: Optional[str] = _key(None, "run directory (default: runs/<config name>)")
    sample_prompt: str = _key("def ", "prompt of the sample printed at the end of training")
    sample_tokens: int = _key(96, "tokens sampled at the end of training (0: none)", minimum=0)
    predict_max_steps: Optional[int] = _key(None, "predict.py's default --max-new-tokens (null: 64)", minimum=1)
    eval_tasks: list = _key([], "tasks scored at every evaluation and by train.py --eval (causal_lm): lambada "
                            "(last-word accuracy and perplexity), multiple_choice (acc, acc_norm)")
    lambada_path: Optional[str] = _key(None, "LAMBADA-format jsonl ({\"text\": ...} per line) for the lambada task "
                                             "(default: the shipped embedded-corpus passages)")
    multiple_choice_path: Optional[str] = _key(None, "jsonl of {context, choices, label} for the multiple_choice "
                                                     "task")
    eval_task_examples: Optional[int] = _key(None, "score only the first N examples of each task (null: all)",
                                             minimum=1)

    # Fine-tuning.
    init_from: Optional[str] = _key(None, "a Hugging Face model directory (or a NeoMesh run) a new run starts "
                                          "from (what --init-from gives); with peft checkpoint 'trainable' "
                                          "resuming reads it again")
    init_new_head: bool = _key(False, "with init_from a classifier: keep its backbone, start a fresh head of "
                                      "num_labels without its label names (transformers' ignore_mismatched_sizes)")
    peft: Optional[dict] = _key(None, "parameter-efficient fine-tuning: {lora: {targets, rank, alpha, dropout}, "
                                      "prefix: {length, hidden}, adapter: {size, activation, after}, bitfit, "
                                      "trainable, checkpoint ('all' or 'trainable')}; only the parts it adds (and "
                                      "the task head) train, unless trainable says otherwise")

    @property
    def attention_layers(self) -> tuple[str, ...]:
        """The attention kind of each layer, expanded from ``attention_types``."""
        if self.attention_types is None:
            return ("global",) * self.n_layer
        return tuple(kind for kinds, repeat in self.attention_types for _ in range(repeat) for kind in kinds)

    @property
    def remat_policy(self) -> str:
        """``recompute_grad`` as one of REMAT_POLICIES (GPT-Neo's true is "full", false "none")."""
        if isinstance(self.recompute_grad, bool):
            return "full" if self.recompute_grad else "none"
        return self.recompute_grad

    @property
    def moe(self) -> dict:
        """``moe_params`` with every option filled in from ``MOE_DEFAULTS``."""
        return {**MOE_DEFAULTS, **(self.moe_params or {})}

    @property
    def head_dropout(self) -> float:
        """The dropout rate on a classification head's input: ``classifier_dropout``, else ``res_dropout``."""
        return self.res_dropout if self.classifier_dropout is None else self.classifier_dropout

    @property
    def rotary_dim(self) -> int:
        """How many leading dimensions of each head rotary embedding rotates (even; 0 when off)."""
        return 2 * int(self.head_dim * self.rotary_emb_fraction / 2) if self.rotary_emb else 0

    @property
    def peft_settings(self) -> dict | None:
        """``peft`` with every option of every part it names filled in (None: no peft)."""
        return None if self.peft is None else check_peft(self.peft)

    @property
    def regression(self) -> bool:
        """A sequence classifier of one label scores each text with one float (Hugging Face's num_labels 1)."""
        return self.task == "sequence_classification" and self.num_labels == 1

    @property
    def reads_text(self) -> bool:
        """Whether the model's inputs are token ids, so a tokenizer goes with it (ViT reads images)."""
        return self.task != "image_classification"

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.n_embd // self.n_head

    @property
    def position_rows(self) -> int:
        """Positions the learned table holds: ``n_positions``, else n_ctx."""
        return self.n_ctx if self.n_positions is None else self.n_positions

    @property
    def learned_position_table(self) -> bool:
        """Whether the model learns a table of absolute positions, ``position_rows`` long: not T5 (relative
        positions), not ViT (one row per patch, its n_ctx fixed), not rotary or axial positions."""
        return self.model not in ("t5", "vit") and not (self.rotary_emb or self.axial_pos_emb)

    @property
    def generation_positions(self) -> int:
        """Positions a decoder generates into, prompt and new tokens: its whole position table (a model trained on
        shorter sequences than its table still writes to the table's end, as transformers' generate does). An
        encoder-decoder's encoder reads n_ctx; its decoder's positions are relative."""
        return self.n_ctx if self.task == "seq2seq" else self.position_rows

    @property
    def decoder_layers(self) -> int:
        """Decoder blocks of an encoder-decoder model: ``n_decoder_layer``, else as many as the encoder's."""
        return self.n_layer if self.n_decoder_layer is None else self.n_decoder_layer

    @property
    def decoder_ctx(self) -> int:
        """seq2seq target tokens per example: ``n_decoder_ctx``, else span corruption's, else n_ctx."""
        if self.n_decoder_ctx is not None:
            return self.n_decoder_ctx
        return self.span_lengths[1] if self.span_corruption else self.n_ctx

    @property
    def span_lengths(self) -> tuple[int, int]:
        """(raw tokens span corruption reads, target tokens it makes) for n_ctx input tokens (T5's rule)."""
        from data.spans import span_corruption_lengths

        return span_corruption_lengths(self.n_ctx, self.span_noise_density, self.span_mean_length)

    @property
    def intermediate(self) -> int:
        """The MLP hidden width: ``d_ff``, else 4 * n_embd."""
        return self.d_ff or 4 * self.n_embd

    @property
    def norm_kind(self) -> str:
        return "scalenorm" if self.scalenorm else self.norm

    @property
    def decay_end(self) -> int:
        return self.lr_decay_end or self.train_steps

    @property
    def log_interval(self) -> int:
        """Steps between log lines when there is no progress bar (``log_every``, or its default)."""
        return self.log_every or max(1, min(50, self.train_steps // 10))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "Config":
        return validated(dataclasses.replace(self, **changes))


# Keys that only meant something to mesh-tensorflow on TPUs: accepted, explained, without effect.
LEGACY_KEYS = {
    "iterations": "steps per TPU host loop in mesh-tensorflow; every NeoMesh step is one jitted call",
    "predict_steps": "TPU predict loop length; predict.py decides what to generate",
    "predict_batch_size": "TPU predict batch; predict.py batches its prompts itself",
    "use_tpu": "the device comes from JAX (CPU, GPU or TPU)",
    "num_cores": "the device count comes from JAX",
    "padding_id": "belongs to the dataset config (configs/dataset_configs)",
    "eos_id": "belongs to the dataset config (configs/dataset_configs)",
    "slow_sampling": "sampling is compiled once; there is no slow path",
    "stop_at_token": "predict.py takes --stop",
    "remove_partial_sequences": "predict.py returns whole generations",
    "sampling_use_entmax": "predict.py samples with temperature / top-k / top-p",
    "lr_decay_end_ratio": "decay always ends at 0.1*lr",
    "input_fn": "GPT-Neo's choice of input function; NeoMesh has one tf.data pipeline (data/pipeline.py)",
    "no_dataset": "GPT-Neo's switch for configs without data; NeoMesh always names its datasets",
    "log_grads": "every metrics.jsonl row has the global grad_norm",
    "shuffle_input_filenames": "training always shuffles files and documents by seed",
    "gpu_ids": "the devices come from JAX",
}

# GPT-Neo's switches for mesh-tensorflow's layout search: true means NeoMesh's "auto" (parallel/auto.py).
AUTO_KEYS = {"auto_layout": ("layout",), "auto_layout_and_mesh_shape": ("mesh_shape", "layout")}

# GPT-Neo's other spellings of NeoMesh keys: its code reads activation_fn, its README documents n_heads,
# mlm_mask_id and axial_pos_emb_.
ALIASES = {"activation_fn": "activation_function", "n_heads": "n_head", "mlm_mask_id": "mlm_mask_token_id",
           "axial_pos_emb_": "axial_pos_emb"}

# Other tools' names (Hugging Face's Trainer, mostly) for NeoMesh keys: an unknown key says which one it is, where
# the closest spelling would mislead (save_steps -> eval_steps, max_steps -> max_bad_steps).
FOREIGN_KEYS = {"learning_rate": "lr", "max_steps": "train_steps", "save_steps": "steps_per_checkpoint",
                "save_every": "steps_per_checkpoint", "checkpoint_every": "steps_per_checkpoint",
                "save_total_limit": "keep_checkpoints", "logging_steps": "log_every", "max_grad_norm":
                "gradient_clipping", "adam_beta1": "beta1", "adam_beta2": "beta2", "adam_epsilon": "epsilon",
                "output_dir": "model_path"}

# GPT-Neo's moe_params were mesh-tensorflow's MoE hyperparameters (moe.py there). Those with a NeoMesh
# equivalent are renamed; those that only tuned mesh-tensorflow's routing are accepted with a note.
MOE_FROM_MESH_TF = {"moe_num_experts": "num_experts", "moe_loss_coef": "aux_loss_weight",
                    "moe_capacity_factor_train": "capacity_factor", "moe_z_loss": "z_loss_weight"}
MOE_GATING = {"top_2": 2, "switch": 1}  # mesh-tensorflow's moe_gating -> NeoMesh's top_k
_SECOND = "mesh-tensorflow skipped a token's second expert at random by its gate; NeoMesh always uses top_k experts"
_SWITCH = "mesh-tensorflow's switch-gating noise and policies; NeoMesh's router is deterministic"
MOE_MESH_TF_NOTES = {
    "moe_capacity_factor_eval": "NeoMesh uses capacity_factor in training and evaluation alike",
    "moe_capacity_factor_second_level": "only for mesh-tensorflow's hierarchical MoE",
    "moe_group_size": "mesh-tensorflow routed tokens in groups of this size; NeoMesh routes each sequence",
    "moe_min_expert_capacity": "NeoMesh's capacity ceil(top_k*T*capacity_factor/num_experts) is at least 1",
    "moe_use_second_place_loss": "mesh-tensorflow's extra balancing loss for second places; NeoMesh's "
                                 "load-balancing loss counts every routed expert",
    "moe_second_policy_train": _SECOND, "moe_second_policy_eval": _SECOND,
    "moe_second_threshold_train": _SECOND, "moe_second_threshold_eval": _SECOND,
    "moe_switch_policy_train": _SWITCH, "moe_switch_policy_eval": _SWITCH, "moe_switch_dropout": _SWITCH,
    "moe_switch_temperature": _SWITCH, "moe_switch_jitter": _SWITCH,
    "moe_ntlb_top_k": "only for mesh-tensorflow's ntlb gating",
}

KNOWN_KEYS = tuple(f.name for f in dataclasses.fields(Config))
# The keys of a dataset config (data/source.py checks them); the run's config only names such a file in datasets.
DATASET_KEYS = {"path", "eval_path", "tokenizer_path", "tokenizer_is_pretrained", "n_vocab", "eos_id", "padding_id",
                "prepare", "vocab_size", "special_tokens", "shuffle_buffer", "text_key", "train_split", "eval_split",
                "data_dir", "lambada_tokens_path",
                "text_pair_key", "label_key", "labels",  # labelled data (data/labelled.py)
                "eval_fraction", "skip_bad_files",  # image folders (data/image_folder.py)
                "inputs_key", "targets_key", "prefix"}  # seq2seq pairs (data/pairs.py)

# Keys that decide what a model computes from its parameters. A resume checks the parameters' shapes; a change of
# one of these keeps them and gives another model, so a resume names it (training/checkpoint.model_changes). Not
# here: what a resume may change as a matter of course (schedule, cadence, data, dropout, init scales, kernels,
# memory-saving options, precision, the mesh).
MODEL_KEYS = ("model", "task", "num_labels", "multi_label", "head_hidden", "n_ctx", "n_positions", "n_embd", "n_head",
              "n_layer", "n_vocab", "d_kv", "n_decoder_layer", "n_decoder_ctx", "decoder_start_token_id",
              "relative_attention_num_buckets", "relative_attention_max_distance", "attention_types",
              "local_attention_radius", "activation_function", "d_ff", "mlp_glu", "norm", "scalenorm",
              "norm_position", "layer_norm_epsilon", "rezero", "macaron", "axial_pos_emb", "attention_scale",
              "dense_bias", "image_size", "patch_size", "num_channels", "interpolate_positions", "n_token_types",
              "position_offset", "no_weight_tie", "qkv_bias", "num_mem_kv", "moe_layers", "moe_params", "rotary_emb",
              "rotary_emb_fraction", "rotary_style", "attention_fn", "attention_fn_layers", "share_parameters",
              "moe_activation", "entmax_loss", "causal", "mlm_training", "peft")
# The value a model key is compared by, where several spellings give one model (attention_types null or every
# layer listed as global; d_ff null or 4*n_embd; norm scalenorm or scalenorm true; moe_params' defaults).
MODEL_VALUE = {"attention_types": "attention_layers", "norm": "norm_kind", "scalenorm": "norm_kind",
               "d_ff": "intermediate", "d_kv": "head_dim", "n_decoder_layer": "decoder_layers", "moe_params": "moe",
               "peft": "peft_settings", "n_positions": "position_rows"}


def describe_keys() -> str:
    """Every key with its default and doc, for ``--help-config``."""
    rows = [f"{f.name:28} {json.dumps(_default(f)):>18}  {f.metadata['doc']}" for f in dataclasses.fields(Config)]
    rows += [f"{k:28} {'false':>18}  GPT-Neo's switch: true sets {' and '.join(t)} to 'auto', over any given"
             for k, t in AUTO_KEYS.items()]
    rows += [f"{k:28} {'(accepted)':>18}  no effect: {why}" for k, why in LEGACY_KEYS.items()]
    rows += [f"{k:28} {'(alias)':>18}  GPT-Neo's name for {v}" for k, v in ALIASES.items()]
    rows += ["", "activation_function / moe_activation values: " + ", ".join(ACTIVATIONS)]
    rows += ["", "family defaults (filled in where a config does not set the key):"]
    rows += [f"  model {name}: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in registry.defaults(name).items())
             for name in registry.FAMILIES]
    return "\n".join(rows)


def _default(f):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _type_ok(value, annotation) -> bool:
    hint = eval(annotation, {"Optional": Optional, "list": list, "dict": dict}) if isinstance(annotation, str) \
        else annotation
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(annotation: str) -> str:
    return annotation.replace("Optional[", "").rstrip("]") + (" or null" if "Optional" in annotation else "")




def validated(cfg: Config) -> Config:
    """Checks every key's type and range and the relations between keys; raises ``ConfigError``."""
    for key in ("activation_function", "moe_activation"):
        if getattr(cfg, key) in LEARNED_ACTIVATIONS:
            raise ConfigError(f"{key}: {json.dumps(getattr(cfg, key))} is one of GPT-Neo's activations with learned "
                              f"parameters ({', '.join(LEARNED_ACTIVATIONS)}), which NeoMesh does not have; "
                              "pick a parameter-free one (python train.py --help-config)")
        if getattr(cfg, key) in HF_TANH_GELUS:
            raise ConfigError(f"{key}: {json.dumps(getattr(cfg, key))} is Hugging Face's name for GELU's tanh "
                              "approximation, which NeoMesh calls \"gelu\" (its \"gelu_exact\" is Hugging Face's "
                              "\"gelu\")")
    for f in dataclasses.fields(Config):
        value = getattr(cfg, f.name)
        if not _type_ok(value, f.type):
            example = {"mesh_shape": ' such as "x:4" (axis:size)', "layout": ' such as "batch:x" (dimension:axis)'}
            raise ConfigError(f"{f.name}: expected {_type_name(f.type)}{example.get(f.name, '')}, got "
                              f"{json.dumps(value)}")
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name}: {value} is not a finite number")
        meta = f.metadata
        if meta["choices"] and value not in meta["choices"]:
            raise ConfigError(f"{f.name}: {json.dumps(value)} is not one of {_choices_hint(value, meta['choices'])}")
        if meta["min"] is not None and value < meta["min"]:
            raise ConfigError(f"{f.name}: {value} is below the minimum {meta['min']}")
        if meta["max"] is not None and value > meta["max"]:
            raise ConfigError(f"{f.name}: {value} is above the maximum {meta['max']}")
    if cfg.mesh_shape == "auto" and cfg.layout != "auto":
        raise ConfigError(f"mesh_shape: 'auto' needs layout 'auto' too (the layout {json.dumps(cfg.layout)} names "
                          f"mesh axes that an automatic mesh may not have)")

    if cfg.n_embd % cfg.n_head and cfg.d_kv is None:
        raise ConfigError(f"n_embd: {cfg.n_embd} is not divisible by n_head {cfg.n_head}")
    _check_attention_types(cfg)
    _check_moe(cfg)
    if cfg.peft is not None:
        check_peft(cfg.peft)
    for width in cfg.head_hidden:
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(f"head_hidden: {json.dumps(width)} is not a layer width (a positive integer)")
    if cfg.init_new_head and not cfg.task.endswith("classification"):
        raise ConfigError(f"init_new_head: only for a classifier (task sequence_classification, token_classification "
                          f"or image_classification), not {cfg.task}")
    if cfg.head_hidden and cfg.task not in ("sequence_classification", *TOKEN_HEAD_TASKS):
        raise ConfigError(f"head_hidden: {json.dumps(cfg.head_hidden)} shapes a classification head; task {cfg.task} "
                          "has none")
    if cfg.rotary_emb and cfg.rotary_dim == 0:
        raise ConfigError(f"rotary_emb_fraction: {cfg.rotary_emb_fraction} of head_dim {cfg.head_dim} rotates no "
                          f"pair of dimensions; use at least {2 / cfg.head_dim:.3g}")
    if cfg.attention_fn is not None and not re.fullmatch(r"[\w.]+:\w+", cfg.attention_fn):
        raise ConfigError(f"attention_fn: {json.dumps(cfg.attention_fn)} is not 'module:function' (e.g. "
                          "'training.peft.hooks:alibi_attention')")
    for layer in cfg.attention_fn_layers or ():
        if not (isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < cfg.n_layer):
            raise ConfigError(f"attention_fn_layers: {json.dumps(layer)} is not a block number (0 to "
                              f"{cfg.n_layer - 1})")
    if cfg.attention_fn_layers is not None and cfg.attention_fn is None:
        raise ConfigError("attention_fn_layers: chooses the layers of attention_fn, which is null")
    if cfg.lr_decay_end is not None and cfg.lr_decay_end < cfg.warmup_steps:
        raise ConfigError(f"lr_decay_end: {cfg.lr_decay_end} is before the end of warmup_steps {cfg.warmup_steps}")
    _check_datasets(cfg.datasets)
    if cfg.scan_layers and cfg.moe_layers:
        raise ConfigError("scan_layers: the mixture-of-experts layers' auxiliary losses cannot leave a scanned loop; "
                          "set scan_layers false or drop moe_layers")
    if cfg.accumulate_unreduced and cfg.moe_layers:
        raise ConfigError("accumulate_unreduced: the mixture-of-experts layers route and balance over the whole "
                          "batch, which each device's own accumulation cannot see; set it false or drop moe_layers")
    if cfg.accumulate_unreduced and cfg.tokens_per_mb_per_replica is None:
        raise ConfigError("accumulate_unreduced: only with gradient accumulation; set tokens_per_mb_per_replica "
                          "(tokens per microbatch per data-parallel replica)")
    if isinstance(cfg.recompute_grad, str) and cfg.recompute_grad not in REMAT_POLICIES:
        raise ConfigError(f"recompute_grad: {json.dumps(cfg.recompute_grad)} is not one of true, false, "
                          f"{', '.join(REMAT_POLICIES)}")
    _check_eval_tasks(cfg)
    for key in ("train_batch_size", "eval_batch_size") if cfg.eval_steps else ("train_batch_size",):
        if cfg.data_shards > getattr(cfg, key):
            raise ConfigError(f"data_shards: {cfg.data_shards} is more than {key} {getattr(cfg, key)} (every shard "
                              "fills at least one row of each batch)")
    _check_block_options(cfg)
    _check_encoder_decoder(cfg)  # a task the family cannot train, named before what that task would need
    _check_images(cfg)
    _check_task(cfg)
    if cfg.mlm_same_token_prob + cfg.mlm_random_token_prob > 1:
        raise ConfigError("mlm_random_token_prob: mlm_same_token_prob + mlm_random_token_prob is above 1")
    _check_mlm_ids(cfg)
    return cfg


def _check_mlm_ids(cfg: Config) -> None:
    """The ids the MLM stage writes into inputs are embedding rows: one past n_vocab was read as a clamped row,
    silently (JAX's out-of-range gather), not refused."""
    ids = [(key, getattr(cfg, key)) for key in ("mlm_mask_token_id", "mlm_cls_token_id")]
    ids += [("mlm_random_token_ids", i) for i in cfg.mlm_random_token_ids or []]
    for key, value in ids:
        if value is not None and not (isinstance(value, int) and 0 <= value < cfg.n_vocab):
            raise ConfigError(f"{key}: {value!r} is not a token id in [0, n_vocab={cfg.n_vocab})")


def _choices_hint(value, choices: tuple) -> str:
    """The valid values, or for a long list the closest one and where the list is."""
    if len(choices) <= 10:
        return ", ".join(choices)
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
    return (f"the known values (did you mean '{close[0]}'? " if close else "the known values (") + \
        "python train.py --help-config lists them)"


def _field(name):
    return next(f for f in dataclasses.fields(Config) if f.name == name)
def _check_block_options(cfg: Config) -> None:
    if cfg.scalenorm and cfg.norm != "layernorm":
        raise ConfigError(f"scalenorm: true contradicts norm {json.dumps(cfg.norm)}; keep one of the two")
    if cfg.rezero and cfg.norm_position == "post":
        raise ConfigError("rezero: true replaces the block norms, so norm_position 'post' has nothing to place")
    if cfg.n_positions is not None and cfg.n_positions < cfg.n_ctx:
        raise ConfigError(f"n_positions: a table of {cfg.n_positions} positions is shorter than n_ctx {cfg.n_ctx}; "
                          "give at least n_ctx, or leave it out")
    if cfg.axial_pos_emb is not None:
        axial = cfg.axial_pos_emb
        if not (isinstance(axial, list) and len(axial) == 2 and all(
                isinstance(a, int) and not isinstance(a, bool) and a >= 1 for a in axial)):
            raise ConfigError(f"axial_pos_emb: {json.dumps(axial)} is not [A, B] with positive integers")
        if axial[0] * axial[1] < cfg.n_ctx:
            raise ConfigError(f"axial_pos_emb: {axial[0]}*{axial[1]} = {axial[0] * axial[1]} positions is fewer "
                              f"than n_ctx {cfg.n_ctx}")
        if cfg.rotary_emb:
            raise ConfigError("axial_pos_emb: rotary_emb is on too; choose one kind of position embedding")


def _check_task(cfg: Config) -> None:
    for key in ("z_loss", "entmax_loss"):
        if getattr(cfg, key) and cfg.task not in ("causal_lm", "masked_lm"):
            raise ConfigError(f"{key}: {json.dumps(getattr(cfg, key))} shapes a language model's vocabulary "
                              f"distribution; task {cfg.task} has none (set it to {json.dumps(_default(_field(key)))})")
    if cfg.entmax_loss and cfg.z_loss:
        raise ConfigError(f"z_loss: {cfg.z_loss} penalises the softmax normaliser, which entmax_loss does not use "
                          "(GPT-Neo ignored it there); set z_loss 0")
    if cfg.num_labels == 1 and cfg.task in ("token_classification", "image_classification"):
        raise ConfigError(f"num_labels: 1 is regression (Hugging Face's num_labels 1), which NeoMesh trains for task "
                          f"sequence_classification only; task {cfg.task} needs 2 or more labels")
    if cfg.multi_label and cfg.task != "sequence_classification":
        raise ConfigError(f"multi_label: true gives a sequence classifier's texts several labels; task {cfg.task} "
                          "has none (set task sequence_classification, or multi_label false)")
    if cfg.multi_label and cfg.num_labels < 2:
        raise ConfigError(f"multi_label: true needs 2 or more labels, num_labels is {cfg.num_labels} (num_labels 1 "
                          "without multi_label is regression)")
    if cfg.task == "question_answering":
        _check_question_answering(cfg)
    if cfg.mlm_training and cfg.task != "masked_lm":
        raise ConfigError(f"mlm_training: true trains masked_lm, but task is {json.dumps(cfg.task)}")
    if cfg.task == "masked_lm":
        if cfg.causal:
            raise ConfigError("causal: a masked_lm model must see both sides of a mask; set causal false")
    if cfg.task == "causal_lm" and not cfg.causal:
        raise ConfigError("causal: false lets causal_lm see the token it predicts; set causal true or choose "
                          "task masked_lm")


def _check_question_answering(cfg: Config) -> None:
    """An answer is a span of context tokens: an encoder (bert, roberta) or a decoder (gpt_neo, gpt2) reads it, as
    transformers' *ForQuestionAnswering do; its head gives two logits a token."""
    if cfg.model not in ("bert", "roberta", "gpt_neo", "gpt2"):
        raise ConfigError(f"task: question_answering picks answer spans with bert, roberta, gpt_neo or gpt2, not "
                          f"model {cfg.model}")
    if cfg.num_labels != 2:
        raise ConfigError(f"num_labels: {cfg.num_labels}, but question_answering's head gives two logits per token "
                          "(answer start and end); leave num_labels at 2")


def _check_images(cfg: Config) -> None:
    """image_classification is the vit family's task, and vit has no other; the patches must tile the image."""
    if (cfg.model == "vit") != (cfg.task == "image_classification"):
        which = "model vit trains task image_classification" if cfg.model == "vit" else \
            f"task image_classification is the vit family's (model is {cfg.model})"
        raise ConfigError(f"task: {which}")
    if cfg.model != "vit":
        return
    if cfg.image_size % cfg.patch_size:
        raise ConfigError(f"patch_size: {cfg.patch_size} does not divide image_size {cfg.image_size}")
    if (cfg.image_mean is None) != (cfg.image_std is None):
        given, missing = ("image_mean", "image_std") if cfg.image_std is None else ("image_std", "image_mean")
        raise ConfigError(f"{missing}: needed with {given} (pixels are fed as (x - image_mean) / image_std)")
    for key in ("image_mean", "image_std"):
        value = getattr(cfg, key)
        if value is not None and (not isinstance(value, list) or len(value) != cfg.num_channels or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
            raise ConfigError(f"{key}: {json.dumps(value)} is not a list of {cfg.num_channels} numbers, one per "
                              f"channel (num_channels {cfg.num_channels})")
    if cfg.image_std is not None and min(cfg.image_std) <= 0:
        raise ConfigError(f"image_std: {json.dumps(cfg.image_std)}; every channel's must be above 0")
    tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
    if cfg.n_ctx != tokens:
        raise ConfigError(f"n_ctx: a vit reads {tokens} tokens ((image_size / patch_size)^2 patches and the class "
                          f"token), not {cfg.n_ctx}; leave n_ctx out")


def _check_encoder_decoder(cfg: Config) -> None:
    """seq2seq is the t5 family's task; its blocks take a relative position bias, which only global softmax
    layers without extra positions or slots have been built for."""
    if (cfg.task == "seq2seq") != (cfg.model == "t5"):
        raise ConfigError(f"task: {cfg.task} does not fit model {cfg.model} (seq2seq is the encoder-decoder "
                          "family's task: model t5)")
    if cfg.span_corruption and cfg.task != "seq2seq":
        raise ConfigError(f"span_corruption: true makes seq2seq batches, but task is {json.dumps(cfg.task)}")
    if cfg.pack_pairs and cfg.task != "seq2seq":  # (span corruption's rows are each one full window already)
        raise ConfigError(f"pack_pairs: true packs the (input, target) pairs of task seq2seq, but task is "
                          f"{json.dumps(cfg.task)}")
    if cfg.model != "t5":
        return
    unsupported = {"moe_layers": cfg.moe_layers, "num_mem_kv": cfg.num_mem_kv, "rotary_emb": cfg.rotary_emb,
                   "axial_pos_emb": cfg.axial_pos_emb, "macaron": cfg.macaron}
    for key, value in unsupported.items():
        if value:
            raise ConfigError(f"{key}: {json.dumps(value)} is not available in model t5 (relative position bias, "
                              "global layers)")
    if set(cfg.attention_layers) != {"global"}:
        raise ConfigError(f"attention_types: model t5 has global layers only, not {sorted(set(cfg.attention_layers))}")
    if cfg.span_corruption:
        if cfg.span_noise_density in (0.0, 1.0):
            raise ConfigError(f"span_noise_density: {cfg.span_noise_density} leaves nothing to predict or nothing "
                              "to read; use a value strictly between 0 and 1")
        raw, targets = cfg.span_lengths
        if raw < 2:
            raise ConfigError(f"n_ctx: {cfg.n_ctx} input tokens is too short for span corruption")
        if cfg.n_decoder_ctx is not None and cfg.n_decoder_ctx < targets:
            raise ConfigError(f"n_decoder_ctx: {cfg.n_decoder_ctx} is shorter than the {targets} target tokens span "
                              f"corruption makes of n_ctx {cfg.n_ctx}")


def attention_types_for(spec: list, n_layer: int) -> str:
    """How to make ``attention_types`` list ``n_layer`` layers: a config's n_layer changed alone (``--set
    n_layer=2`` on the quickstart) leaves its pattern's repeat count behind."""
    kinds = spec[0][0] if len(spec) == 1 else None
    if kinds and n_layer % len(kinds) == 0:
        return f"set both: attention_types {json.dumps([[kinds, n_layer // len(kinds)]])} has {n_layer}"
    return f"set attention_types to list {n_layer} layers too, e.g. {json.dumps([[['global'], n_layer]])}"


def _check_attention_types(cfg: Config) -> None:
    spec = cfg.attention_types
    if spec is None:
        return
    example = '[[["global", "local"], 6]]'
    for entry in spec:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
                and isinstance(entry[1], int) and not isinstance(entry[1], bool) and entry[1] >= 1):
            raise ConfigError(f"attention_types: entry {json.dumps(entry)} is not [[kinds...], repeat], "
                              f"e.g. {example}")
        for kind in entry[0]:
            if kind not in ATTENTION_KINDS:
                raise ConfigError(f"attention_types: unknown kind {json.dumps(kind)} "
                                  f"(valid: {', '.join(ATTENTION_KINDS)})")
    n = len(cfg.attention_layers)
    if n != cfg.n_layer:
        raise ConfigError(f"attention_types: expands to {n} layers but n_layer is {cfg.n_layer}; "
                          f"{attention_types_for(spec, cfg.n_layer)}")
    if cfg.num_mem_kv and "global" not in cfg.attention_layers:  # it added nothing, without a word
        raise ConfigError(f"num_mem_kv: {cfg.num_mem_kv}, but no layer is global "
                          f"({', '.join(sorted(set(cfg.attention_layers)))}); memory key/values join global attention "
                          "only")


def _check_moe(cfg: Config) -> None:
    layers = cfg.moe_layers or []
    for layer in layers:
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < cfg.n_layer:
            raise ConfigError(f"moe_layers: {json.dumps(layer)} is not a layer index in 0..{cfg.n_layer - 1}")
    if len(set(layers)) != len(layers):
        raise ConfigError(f"moe_layers: {json.dumps(layers)} names a layer twice")
    for key, value in (cfg.moe_params or {}).items():
        if key not in MOE_DEFAULTS:
            raise _unknown(key, tuple(MOE_DEFAULTS), "moe_params")
        expected = type(MOE_DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, (int, float) if expected is float else int):
            raise ConfigError(f"moe_params.{key}: expected {expected.__name__}, got {json.dumps(value)}")
    moe = cfg.moe
    if moe["num_experts"] < 1:
        raise ConfigError(f"moe_params.num_experts: {moe['num_experts']} is below the minimum 1")
    if moe["top_k"] not in (1, 2):
        raise ConfigError(f"moe_params.top_k: {moe['top_k']} is not 1 or 2")
    if moe["top_k"] > moe["num_experts"]:
        raise ConfigError(f"moe_params.top_k: {moe['top_k']} is more than num_experts {moe['num_experts']}")
    if moe["capacity_factor"] <= 0:
        raise ConfigError(f"moe_params.capacity_factor: {moe['capacity_factor']} must be above 0")
    for key in ("aux_loss_weight", "z_loss_weight"):
        if moe[key] < 0:
            raise ConfigError(f"moe_params.{key}: {moe[key]} is below the minimum 0")


def _unknown(key: str, valid: tuple, where: str) -> UnknownKeyError:
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{where}.{close[0]}'?" if close else f" (valid: {', '.join(valid)})"
    return UnknownKeyError(f"{where}: unknown key '{key}'{hint}")


def _check_strings(value, where: str, allowed: tuple | None = None) -> list:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a non-empty list of names, got {json.dumps(value)}")
    for v in value:
        if allowed is not None and v not in allowed:
            raise ConfigError(f"{where}: {json.dumps(v)} is not one of {', '.join(allowed)}")
    return value


def check_peft(peft, where: str = "peft") -> dict:
    """``peft`` (the config key, or the dict ``apply_peft`` takes) checked, with every option of each part it
    names filled in; a one-line ``ConfigError`` naming the sub-key (and the closest valid one) otherwise."""
    if not isinstance(peft, dict):
        raise ConfigError(f"{where}: expected an object with keys among {', '.join(PEFT_KEYS)}, got {json.dumps(peft)}")
    out = {"bitfit": False, "trainable": None, "checkpoint": "all"}
    for key, value in peft.items():
        if key not in PEFT_KEYS:
            raise _unknown(key, PEFT_KEYS, where)
        name = f"{where}.{key}"
        if key in PEFT_PARTS:
            if value is None or value is False:
                continue
            value = {} if value is True else value
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected an object of options ({', '.join(PEFT_PARTS[key])}) or true")
            for option in value:
                if option not in PEFT_PARTS[key]:
                    raise _unknown(option, tuple(PEFT_PARTS[key]), name)
            out[key] = {**json.loads(json.dumps(PEFT_PARTS[key])), **value}
            continue
        if key == "bitfit" and not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {json.dumps(value)}")
        elif key == "trainable" and value is not None:
            _check_strings(value, name)
            for item in value:
                if "/" not in item and "*" not in item and item not in TRAINABLE_PARTS:
                    close = difflib.get_close_matches(item, TRAINABLE_PARTS, n=1, cutoff=0.5)
                    raise ConfigError(f"{name}: {json.dumps(item)} is neither a part ({', '.join(TRAINABLE_PARTS)}) "
                                      "nor a parameter path pattern such as 'blocks/1/*'"
                                      + (f"; did you mean '{close[0]}'?" if close else ""))
        elif key == "checkpoint" and value not in ("all", "trainable"):
            raise ConfigError(f"{name}: {json.dumps(value)} is not one of all, trainable")
        out[key] = value
    checks = {  # option -> (type, minimum, maximum)
        ("lora", "rank"): (int, 1, None), ("lora", "alpha"): (float, 0.0, None), ("lora", "dropout"): (float, 0, 1),
        ("prefix", "length"): (int, 1, None), ("prefix", "hidden"): (int, 0, None), ("adapter", "size"): (int, 1, None),
    }
    for (part, option), (kind, low, high) in checks.items():
        if part not in out:
            continue
        value, name = out[part][option], f"{where}.{part}.{option}"
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ConfigError(f"{name}: expected {kind.__name__}, got {json.dumps(value)}")
        if value < low or (high is not None and value > high) or (kind is float and option == "alpha" and value == 0):
            raise ConfigError(f"{name}: {value} is outside its range ({'above' if option == 'alpha' else 'from'} "
                              f"{low}{'' if high is None else f' to {high}'})")
        if option == "dropout" and value == 1:  # every input dropped: the factors would never learn
            raise ConfigError(f"{name}: 1 drops every input, so LoRA would learn nothing (from 0 to below 1)")
    if "lora" in out:
        _check_strings(out["lora"]["targets"], f"{where}.lora.targets")
    if "adapter" in out:
        if out["adapter"]["activation"] not in ACTIVATIONS:
            raise ConfigError(f"{where}.adapter.activation: {json.dumps(out['adapter']['activation'])} is not one of "
                              f"{_choices_hint(out['adapter']['activation'], ACTIVATIONS)}")
        _check_strings(out["adapter"]["after"], f"{where}.adapter.after", ("attn", "mlp"))
    return out


def _check_eval_tasks(cfg: Config) -> None:
    for task in cfg.eval_tasks:
        if task not in EVAL_TASKS:
            raise ConfigError(f"eval_tasks: unknown task {json.dumps(task)} (known: {', '.join(EVAL_TASKS)})")
    if cfg.eval_tasks and cfg.task != "causal_lm":
        raise ConfigError(f"eval_tasks: {', '.join(cfg.eval_tasks)} score text with a language model; task "
                          f"{cfg.task} has none (use task causal_lm, or drop eval_tasks)")
    if "multiple_choice" in cfg.eval_tasks and cfg.multiple_choice_path is None:
        raise ConfigError("eval_tasks: multiple_choice needs multiple_choice_path (a jsonl of {context, choices, "
                          "label})")
    # The files themselves are read where they are scored (evaluation.tasks.check_config_tasks, before training):
    # a run whose task file has moved since still loads for predict.py, export and eval.py --lambada-path.


def _check_datasets(datasets: list) -> None:
    if not datasets:
        raise ConfigError("datasets: empty; give at least one [id, stitch, sampling_mode, weight]")
    for entry in datasets:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
            raise ConfigError(f"datasets: entry {json.dumps(entry)} is not [id, stitch, sampling_mode, weight]")
        _check_dataset_entry(entry)


def _check_dataset_entry(entry: list) -> None:
    """Sampling mode, stitch and weight as the input pipeline checks them (data/source.make_source), here at load:
    a dry run, which reads no data, finds the mistake too."""
    from data.pipeline import check_mode, check_weight

    check_mode(entry, entry[0])
    check_weight(entry, entry[0])


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` from ``--set``: the value is JSON when it parses as JSON, else the plain string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {text}: expected key=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def _check_json_value(key: str, value: Any, text: str) -> None:
    """A ``--set`` value that looks like a JSON object or list but does not parse, for a key that holds no string
    (``peft={"lora": {}``): the JSON error, rather than 'expected dict, got' the text as a string."""
    kind = next((f.type for f in dataclasses.fields(Config) if f.name == key), "str")
    if not isinstance(value, str) or "str" in kind or value.lstrip()[:1] not in ("{", "["):
        return
    try:
        json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--set {text}: the value is not valid JSON ({e.msg} at column {e.colno})") from None


def from_dict(raw: dict, source: str = "config", overrides: tuple[str, ...] = ()) -> tuple[Config, list[str]]:
    """Builds a validated ``Config``; returns it with notes about GPT-Neo keys that were accepted or translated.
    An error in a ``--set`` override names ``--set``, not ``source``."""
    raw = _canonical_spellings(dict(raw), source)
    switches = _take_auto_switches(raw, source, {})
    notes = _drop_legacy_keys(raw, source)
    overridden = {}
    for text in overrides:
        key, value = parse_override(text)
        _check_json_value(ALIASES.get(key, key), value, text)
        given = {ALIASES.get(key, key): value}
        if key in AUTO_KEYS:
            _take_auto_switches(given, f"--set {text}", switches)
        elif key in LEGACY_KEYS:
            notes += _drop_legacy_keys(given, f"--set {text}")
        else:
            _check_known(ALIASES.get(key, key), f"--set {text}")
        raw.update(given)
        overridden.update(given)
    notes += _apply_auto_switches(raw, switches, source, overridden)
    if raw.get("model") == "GPT":  # GPT-Neo's one model name
        raw["model"] = "gpt_neo"
        notes.append(f"{source}: model 'GPT' is GPT-Neo's name for the gpt_neo family")
    model = raw.get("model", "gpt_neo")
    if model not in registry.FAMILIES:
        close = difflib.get_close_matches(str(model), tuple(registry.FAMILIES), n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(registry.FAMILIES)})"
        where = f"--set model={json.dumps(model)}" if "model" in overridden else source
        raise ConfigError(f"{where}: model: unknown family {json.dumps(model)}{hint}")
    family = registry.defaults(model)
    if raw.get("mlm_training"):
        family["task"] = "masked_lm"
    raw = {**family, **raw}
    # the patches and the class token; a saved config's n_ctx follows an image_size or patch_size given with --set
    if model == "vit" and ("n_ctx" not in raw or ({"image_size", "patch_size"} & overridden.keys()
                                                  and "n_ctx" not in overridden)):
        size, patch = raw.get("image_size", 224), raw.get("patch_size", 16)
        if isinstance(size, int) and isinstance(patch, int) and patch > 0:
            raw["n_ctx"] = (size // patch) ** 2 + 1
    if isinstance(raw.get("datasets"), list):  # GPT-Neo: a bare "name" is [name, null, null, null]
        raw["datasets"] = [[d, None, None, None] if isinstance(d, str) else d for d in raw["datasets"]]
    if isinstance(raw.get("moe_params"), dict):
        raw["moe_params"], moe_notes = _moe_params_from_mesh_tf(raw["moe_params"], raw, source)
        notes += moe_notes
    try:
        cfg = validated(Config(**raw))
    except ConfigError as e:
        # "peft: ..." or a nested "peft.lora: ..." both come from --set peft=...
        culprit = next((key for key in overridden if str(e).startswith((f"{key}:", f"{key}."))), None)
        if culprit is None and isinstance(e, UnknownKeyError):  # a typo is found in its file, as at the top level
            raise ConfigError(f"{source}: {e}") from None
        if culprit is None:
            raise
        raise ConfigError(f"--set {culprit}={json.dumps(overridden[culprit])}: {e}") from None
    if cfg.opt_name == "adafactor":
        notes.append(f"{source}: opt_name adafactor runs at the constant lr {cfg.lr:g}, as GPT-Neo's Adafactor did; "
                     "warmup_steps and lr_decay have no effect")
    return cfg, notes


def _take_auto_switches(raw: dict, source: str, switches: dict) -> dict:
    """Moves GPT-Neo's auto-layout switches out of ``raw`` into ``switches`` (key -> (value, where it was
    given)), a later one (``--set``) replacing an earlier; ``_apply_auto_switches`` applies them."""
    for key in AUTO_KEYS:
        if key in raw:
            value = raw.pop(key)
            if not isinstance(value, bool):
                raise ConfigError(f"{key}: expected true or false, got {json.dumps(value)}")
            switches[key] = (value, source)
    return switches


def _apply_auto_switches(raw: dict, switches: dict, source: str, overridden: dict) -> list[str]:
    """A switch that is true sets its keys to "auto" (as documented; GPT-Neo chose the layout itself whatever
    ``layout`` said), once every ``--set`` is in, so that the order they are given in changes nothing; the note
    names a value it replaces."""
    notes = []
    for key, (on, where) in switches.items():
        targets = AUTO_KEYS[key]
        if not on:
            continue
        replaced = [f"{target} '{raw[target]}'" for target in targets if raw.get(target, "auto") != "auto"]
        raw.update({target: "auto" for target in targets})
        if where != source:  # an error in them names the --set
            overridden.update({target: "auto" for target in targets})
        notes.append(f"{where}: '{key}': true sets {' and '.join(targets)} to 'auto'"
                     + (f" (in place of {' and '.join(replaced)})" if replaced else ""))
    return notes


def _drop_legacy_keys(raw: dict, source: str) -> list[str]:
    """Removes the mesh-tensorflow-only keys from ``raw`` (with a note each); an unknown key is an error."""
    notes = []
    for key in list(raw):
        if key in LEGACY_KEYS:
            notes.append(f"{source}: '{key}' has no effect here ({LEGACY_KEYS[key]})")
            del raw[key]
        else:
            _check_known(key, source)
    return notes


def _check_known(key: str, source: str) -> None:
    if key not in KNOWN_KEYS and key in DATASET_KEYS:  # the closest model key would mislead (text_key -> weight_decay)
        raise ConfigError(f"{source}: '{key}' is a dataset config's key, not a model config's: set it in the dataset "
                          "config (JSON) that the config's datasets names (README, Data)")
    if key not in KNOWN_KEYS:
        known = KNOWN_KEYS + tuple(LEGACY_KEYS) + tuple(AUTO_KEYS) + tuple(ALIASES)
        close = [FOREIGN_KEYS[key]] if key in FOREIGN_KEYS else difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{source}: unknown key '{key}'{hint}")



def _canonical_spellings(raw: dict, source: str) -> dict:
    """GPT-Neo's alias keys (``ALIASES``) renamed to NeoMesh's; both spellings with different values is an error."""
    for alias, key in ALIASES.items():
        if alias not in raw:
            continue
        value = raw.pop(alias)
        if key in raw and raw[key] != value:
            raise ConfigError(f"{source}: '{alias}' {json.dumps(value)} contradicts '{key}' {json.dumps(raw[key])} "
                              f"(the same key in GPT-Neo's spelling); keep one")
        raw[key] = value
    return raw


def _moe_params_from_mesh_tf(params: dict, raw: dict, source: str) -> tuple[dict, list[str]]:
    """GPT-Neo's ``moe_params`` (mesh-tensorflow's MoE hyperparameters) -> NeoMesh's, with notes for the ones
    that only tuned mesh-tensorflow's implementation. NeoMesh's own keys pass through unchanged."""
    out, notes = {}, []
    for key, value in params.items():
        if key in MOE_FROM_MESH_TF:
            out[MOE_FROM_MESH_TF[key]] = value
        elif key == "moe_gating":
            if value not in MOE_GATING:
                raise ConfigError(f"moe_params.moe_gating: {json.dumps(value)} is not one of "
                                  f"{', '.join(MOE_GATING)} (NeoMesh's top_k 2 and 1)")
            out["top_k"] = MOE_GATING[value]
        elif key == "moe_dropout_rate":
            if value:
                raise ConfigError(f"moe_params.moe_dropout_rate: {json.dumps(value)}: dropout inside the experts is "
                                  "not available yet; set it to 0")
        elif key == "moe_hidden_size":
            width = 4 * raw.get("n_embd", _field("n_embd").default)
            if value != width:
                raise ConfigError(f"moe_params.moe_hidden_size: {json.dumps(value)} differs from the experts' width "
                                  f"4*n_embd = {width}; other widths are not available yet")
        elif key == "moe_use_experts_attention":
            if value:
                raise ConfigError("moe_params.moe_use_experts_attention: mesh-tensorflow's experts-attention layers "
                                  "are not available; set it to false")
        elif key in MOE_MESH_TF_NOTES:
            notes.append(f"{source}: 'moe_params.{key}' has no effect here ({MOE_MESH_TF_NOTES[key]})")
        else:
            out[key] = value
    return out, notes


def resolve_config_path(path: str) -> str:
    """The config file ``path`` names: a file (relative to the current directory), else a shipped config, by name
    (``quickstart``) or by its repository path (``configs/quickstart.json``, from any directory). A file that is
    not found is a one-line error with the closest config names."""
    from neomesh.paths import configs_dir

    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a directory, not a JSON config file")
    shipped = configs_dir()
    candidates = [os.path.join(os.path.dirname(shipped), path)] if not os.path.isabs(path) else []
    if os.path.dirname(path) == "":
        candidates += [os.path.join(shipped, path), os.path.join(shipped, path + ".json")]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    known = json_names(shipped)
    folder = os.path.dirname(path)
    beside = []  # the folder's own configs, when the path names a folder that exists and is not configs/
    if folder and os.path.isdir(folder) and os.path.abspath(folder) != os.path.abspath(shipped):
        beside = json_names(folder)
    stem = os.path.basename(path).removesuffix(".json")
    hint = ""
    close = closest(stem, beside)
    if close:
        hint = f"; did you mean {os.path.join(folder, close + '.json')}?"
    elif close := closest(stem, known):
        # a shipped config in the path's own spelling only where that spelling finds it (configs/NAME.json)
        spelled = os.path.join(folder, close + ".json")
        found = not os.path.isabs(spelled) and os.path.isfile(os.path.join(os.path.dirname(shipped), spelled))
        hint = f"; did you mean {spelled if found else close}?"
    there = f"; in {folder}: {', '.join(beside)}" if beside else ""
    raise ConfigError(f"{path}: config file not found{hint} (shipped configs: {', '.join(known)}{there})")


def json_names(folder: str) -> list[str]:
    """The configs in ``folder`` by name: its ``.json`` files without the extension, sorted."""
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".json"))


def shipped_configs_of(model: str) -> list[str]:
    """The shipped configs (by name) of model family ``model``: what a config of another family is told to take."""
    from neomesh.paths import configs_dir

    def family(name: str) -> str | None:
        try:
            with open(os.path.join(configs_dir(), f"{name}.json"), encoding="utf-8") as f:
                return json.load(f).get("model", "gpt_neo")
        except (OSError, ValueError, AttributeError):
            return None

    return [name for name in json_names(configs_dir()) if family(name) == model]


def closest(name: str, names: list[str]) -> str | None:
    """The one of ``names`` most like ``name``, case aside (QUICKSTART finds quickstart), or None."""
    lowered = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), lowered, n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def load_config(path: str, overrides: tuple[str, ...] = ()) -> tuple[Config, list[str]]:
    """Reads a JSON config file (see ``resolve_config_path``), applies ``--set`` overrides, validates;
    ``model_path`` defaults to runs/NAME."""
    from neomesh.json_file import read_json

    path = resolve_config_path(path)
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a directory, not a JSON config file")
    if not os.path.exists(path):
        raise ConfigError(f"{path}: config file not found")
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object of config keys")
    _check_not_another_kind_of_config(raw, path)
    source = os.path.basename(path)
    try:
        cfg, notes = from_dict(raw, source=source, overrides=overrides)
    except ConfigError as e:  # a value the file gives: the file is named, as for a key it does not know
        if str(e).split(":", 1)[0] not in raw:
            raise
        raise ConfigError(f"{source}: {e}") from None
    if cfg.model_path is None:
        name = os.path.splitext(os.path.basename(path))[0]
        cfg = dataclasses.replace(cfg, model_path=os.path.join("runs", name))
    return cfg, notes


def _check_not_another_kind_of_config(raw: dict, path: str) -> None:
    """A dataset config or a Hugging Face config.json given where a model config goes is named as what it is (the
    unknown-key error suggested 'patch_size' for a dataset config's 'path')."""
    if "path" in raw or "eval_path" in raw:  # neither is a model config key
        raise ConfigError(f"{path}: a dataset config (it has '{'path' if 'path' in raw else 'eval_path'}'), not a "
                          f"model config; name it in a config's datasets, e.g. --config quickstart --set "
                          f"'datasets=[[\"{path}\", null, null, null]]'")
    if "model_type" in raw or "architectures" in raw:
        folder = os.path.dirname(path) or "."
        raise ConfigError(f"{path}: a Hugging Face model's config.json, not a NeoMesh config; give its directory: "
                          f"train.py --init-from {folder}, predict.py or eval.py --hf-model {folder}, or "
                          f"python -m convert import {folder} MODEL_PATH")


def model_config_path(name: str) -> str:
    """GPT-Neo's ``--model NAME``: ``configs/NAME.json`` (from the working directory, else the shipped configs of
    a checkout or an installed NeoMesh), or NAME itself when it ends in .json."""
    from neomesh.paths import configs_dir

    if name.endswith(".json"):
        return name
    relative = os.path.join("configs", f"{name}.json")
    # The shipped configs are the repository's configs/ in a checkout, package data when installed.
    for path in (relative, os.path.join(configs_dir(), f"{name}.json")):
        if os.path.exists(path):
            return path
    known = json_names(configs_dir())
    close = closest(name, known)
    hint = f"; did you mean --model {close}?" if close else ""
    raise ConfigError(f"--model {name}: no {relative}{hint} (known: {', '.join(known)}; or give a .json path)")

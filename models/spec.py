"""The block spec: everything the zoo's transformer blocks differ by, as frozen data.

A family (gpt_neo.py, bert.py, ...) turns its config into one ``BlockSpec`` per layer and builds blocks from them;
blocks read nothing else. What varies between GPT-Neo, GPT-2, BERT/RoBERTa, T5 and ViT blocks is all here: norm
kind and placement, ReZero, macaron, causal or bidirectional self-attention, the attention kind (global, local,
linear, none), optional cross-attention, the MLP kind (dense, gated, experts) and width, the attention logit scale,
biases, and initialisation.
"""

from __future__ import annotations

import dataclasses

from config import Config

COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    kind: str  # "global", "local" or "linear"
    causal: bool  # False: bidirectional (every token sees every other, within the window for local)
    n_embd: int
    n_head: int
    head_dim: int
    window: int | None = None  # local: a token sees itself and window-1 tokens back (and forward if bidirectional)
    scale: float = 1.0  # logits are scale * q.k (GPT-Neo and T5: 1, their init folds 1/sqrt(head_dim) into q)
    qkv_bias: bool = False
    out_bias: bool = True
    rotary_dim: int = 0  # leading features of each head rotated by position (0: no rotary)
    rotary_style: str = "interleaved"  # rotary pairs: "interleaved" (GPT-J) or "halves" (GPT-Neo, GPT-NeoX)
    num_mem_kv: int = 0  # learned key/value slots every query sees (GPT-Neo's memory_key_values)
    dropout: float = 0.0  # on the attention probabilities
    kernel: str = "auto"  # "auto", "xla" or "cudnn" (softmax kinds)
    decode_kernel: str = "xla"  # "xla" or "cudnn": attention with an explicit mask (cached decoding)
    precision: str = "float32"  # compute dtype name, for the kernel choice
    init: tuple[float, float, float, float] = (0.02, 0.02, 0.02, 0.02)  # stddev of q, k, v, out


@dataclasses.dataclass(frozen=True)
class ExpertSpec:
    """Mixture-of-experts routing (models/moe.py); the fields are ``moe_params``'s."""

    num_experts: int
    top_k: int
    capacity_factor: float
    aux_loss_weight: float
    z_loss_weight: float


@dataclasses.dataclass(frozen=True)
class MlpSpec:
    kind: str  # "dense", "glu" (activation(x W_gate) * x W_fc) or "experts"
    n_embd: int
    d_ff: int
    activation: str
    bias: bool = True
    init: tuple[float, float] = (0.02, 0.02)  # stddev of the input and output projections
    experts: ExpertSpec | None = None  # for "experts"


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    attention: AttentionSpec | None  # None: a feed-forward-only block (GPT-Neo's "none" layers)
    mlp: MlpSpec
    cross_attention: AttentionSpec | None = None  # encoder-decoder blocks attend to the encoder's output
    norm: str = "layernorm"  # "layernorm", "rmsnorm" or "scalenorm"
    norm_position: str = "pre"  # "pre": x + f(norm(x)); "post": norm(x + f(x))
    norm_epsilon: float = 1e-5
    rezero: bool = False  # no norms; x + g * f(x), g a learned scalar starting at 0
    macaron: bool = False  # x + 0.5 * mlp'(x) before attention, and the final MLP halved
    res_dropout: float = 0.0  # on each residual branch


def gpt_neo_attention_init(cfg: Config) -> tuple[float, float, float, float]:
    """mesh-tensorflow's attention init: stddev (embd*head_dim)^-0.5 for q, embd^-0.5 for k and v, and
    (heads*head_dim)^-0.5 for the output. GPT-Neo leaves logits unscaled, so 1/sqrt(head_dim) lives in q's init."""
    d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim
    return (d * h) ** -0.5, d ** -0.5, d ** -0.5, (n * h) ** -0.5


def gpt_neo_mlp_init(cfg: Config) -> tuple[float, float]:
    """GPT-Neo's ``linear`` init: 0.02, divided by sqrt(fan_in) with scale_by_in, and the residual output
    projection by sqrt(n_layer) with scale_by_depth."""
    d, f = cfg.n_embd, cfg.intermediate
    fc = 0.02 * (d ** -0.5 if cfg.scale_by_in else 1.0)
    proj = 0.02 * (f ** -0.5 if cfg.scale_by_in else 1.0) * (cfg.n_layer ** -0.5 if cfg.scale_by_depth else 1.0)
    return fc, proj


def block_spec(cfg: Config, layer: int, attention_init: tuple[float, float, float, float],
               mlp_init: tuple[float, float]) -> BlockSpec:
    """The spec of block ``layer`` from the config keys every family shares (family defaults already applied)."""
    kind = cfg.attention_layers[layer]
    attention = None if kind == "none" else AttentionSpec(
        kind=kind, causal=cfg.causal, n_embd=cfg.n_embd, n_head=cfg.n_head, head_dim=cfg.head_dim,
        window=cfg.local_attention_radius if kind == "local" else None,
        scale=cfg.head_dim ** -0.5 if cfg.attention_scale == "inverse_sqrt_head_dim" else 1.0,
        qkv_bias=cfg.qkv_bias, out_bias=cfg.dense_bias, rotary_dim=cfg.rotary_dim, rotary_style=cfg.rotary_style,
        num_mem_kv=cfg.num_mem_kv if kind == "global" else 0, dropout=cfg.attn_dropout,
        kernel=cfg.attention_kernel, decode_kernel=cfg.decode_kernel, precision=cfg.precision, init=attention_init)
    experts = layer in (cfg.moe_layers or ())
    activation = (cfg.moe_activation or cfg.activation_function) if experts else cfg.activation_function
    mlp = MlpSpec(kind="experts" if experts else "glu" if cfg.mlp_glu else "dense", n_embd=cfg.n_embd,
                  d_ff=cfg.intermediate, activation=activation, bias=cfg.dense_bias, init=mlp_init,
                  experts=ExpertSpec(**cfg.moe) if experts else None)
    return BlockSpec(attention=attention, mlp=mlp, norm=cfg.norm_kind, norm_position=cfg.norm_position,
                     norm_epsilon=cfg.layer_norm_epsilon, rezero=cfg.rezero, macaron=cfg.macaron,
                     res_dropout=cfg.res_dropout)

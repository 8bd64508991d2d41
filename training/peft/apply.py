"""``apply_peft(model, settings)``: LoRA, prefixes and adapters plugged into a built model, in place.

The same for a config's ``peft`` key (``build_model``) and for a model in hand (a loaded ``Pretrained``'s
``.model``, or anything models/registry.py builds). Parts go into the seams the model offers: projections
(``nnx.Einsum``) are replaced by ``LoraEinsum``s, a mixture of experts' weights get a ``LoraUpdate`` beside
them (``w_in_lora``), self-attention layers get a ``prefix``, blocks an ``attn_adapter``/``mlp_adapter``. Nothing
in models/ knows these parts.
"""

from __future__ import annotations

import difflib
import fnmatch
import math

from flax import nnx

from config import Config, ConfigError, check_peft
from models import registry
from models.attention import Attention
from models.block import Block
from models.moe import MoeMlp
from training.peft.adapter import Adapter
from training.peft.hooks import attention_fn_named, set_attention_fn
from training.peft.lora import SEAM, LoraEinsum, LoraUpdate, factor_einsums
from training.peft.prefix import Prefix


def build_model(cfg: Config, rngs: nnx.Rngs) -> nnx.Module:
    """The model of ``cfg`` with the parts its ``peft`` key names and the attention function its ``attention_fn``
    names (what every entry point builds)."""
    model = registry.build(cfg, rngs)
    if cfg.attention_fn is not None:
        set_attention_fn(model, attention_fn_named(cfg.attention_fn), cfg.attention_fn_layers)
    return apply_peft(model, cfg.peft, rngs) if cfg.peft is not None else model


def _modules(model, kind) -> list[tuple[tuple, nnx.Module]]:
    return [(tuple(path), m) for path, m in nnx.iter_graph(model) if isinstance(m, kind)]


def _parent(model, path: tuple):
    for name in path[:-1]:
        model = model[name] if isinstance(name, int) else getattr(model, name)
    return model


def _set(model, path: tuple, value) -> None:
    parent = _parent(model, path)
    if isinstance(path[-1], int):
        parent[path[-1]] = value
    else:
        setattr(parent, path[-1], value)


def _matches(target: str, path: tuple) -> bool:
    """A bare name (``q``, ``c_fc``, ``w_in``) matches the blocks' projections or weights of that name; a pattern with
    ``/`` or ``*`` matches any of their paths (``classifier/out``: a head's)."""
    if "/" in target or "*" in target:
        return fnmatch.fnmatch("/".join(map(str, path)), target)
    return path[-1] == target and "blocks" in path


def _adaptable(model) -> list[tuple[tuple, nnx.Module, str | None]]:
    """(path, module, weight name) of everything LoRA can adapt: every projection (weight name None: its kernel)
    and every weight a module lists in its ``EINSUMS`` (a mixture of experts' router and expert weights)."""
    found = []
    for path, m in _modules(model, nnx.Module):
        if isinstance(m, nnx.Einsum):
            found.append((path, m, None))
        found += [(path + (name,), m, name) for name in getattr(type(m), "EINSUMS", ())]
    return found


def _adapted(module: nnx.Module, weight: str | None) -> bool:
    return isinstance(module, LoraEinsum) if weight is None else getattr(module, SEAM.format(weight)) is not None


def _no_match(target: str, free: list[tuple]) -> ConfigError:
    """The one-line error for a target that matches nothing LoRA can adapt, with the closest candidates."""
    names = sorted({str(p[-1]) for p, _, w in free if "blocks" in p and w is None})
    experts = sorted({str(p[-1]) for p, _, w in free if "blocks" in p and w is not None})
    inside = ", ".join(names) + (f"; mixture-of-experts weights: {', '.join(experts)}" if experts else "")
    if "/" in target or "*" in target:  # a path pattern: the heads' and embeddings' paths are candidates
        paths = sorted("/".join(map(str, p)) for p, _, _ in free if "blocks" not in p)
        close = difflib.get_close_matches(target, paths, n=1, cutoff=0.5)
        return ConfigError(f"peft.lora.targets: {target!r} matches no projection"
                           + (f"; did you mean {close[0]!r}?" if close else "")
                           + f" (outside the blocks: {', '.join(paths) or 'none'}; in every block: {inside})")
    if target in MoeMlp.EINSUMS:
        return ConfigError(f"peft.lora.targets: {target!r} is a mixture-of-experts weight, and this model has no "
                           f"moe_layers (projections: {inside})")
    close = difflib.get_close_matches(target, names + experts, n=1, cutoff=0.5)
    return ConfigError(f"peft.lora.targets: {target!r} matches no projection"
                       + (f"; did you mean {close[0]!r}?" if close else f" (projections: {inside})"))


def add_lora(model: nnx.Module, targets: list[str], rank: int, alpha: float, dropout: float,
             rngs: nnx.Rngs) -> list[str]:
    """Puts a LoRA on every block projection or mixture-of-experts weight whose name (``q``, ``c_fc``, ``w_in``),
    or any whose path pattern (``blocks/*/attn/out``, ``score/out``) is in ``targets``: a projection is replaced
    by a ``LoraEinsum``, a weight W gets a ``LoraUpdate`` at ``W_lora``. Returns the adapted paths. A target that
    matches nothing is an error."""
    candidates = _adaptable(model)
    free = [c for c in candidates if not _adapted(c[1], c[2])]
    adapted = [p for p, m, w in candidates if _adapted(m, w)]
    for target in targets:
        done = next((p for p in adapted if _matches(target, p)), None)
        if done is not None and not any(_matches(target, p) for p, _, _ in free):
            raise ConfigError(f"peft.lora: {'/'.join(map(str, done))} already has LoRA factors (the model holds "
                              "the peft parts it was built or loaded with; name only new parts)")
        if not any(_matches(target, p) for p, _, _ in free):
            raise _no_match(target, free)
    chosen = [c for c in free if any(_matches(t, c[0]) for t in targets)]
    for path, module, weight in chosen:  # A is (in, rank): a rank above the input width is a full update, and more
        kernel = module.kernel if weight is None else getattr(module, weight)
        einsum = module.einsum_str if weight is None else module.EINSUMS[weight]
        width = math.prod(kernel.shape[i] for i in factor_einsums(einsum).contracted)
        if rank > width:
            raise ConfigError(f"peft.lora.rank: {rank} is larger than {'/'.join(map(str, path))}'s input width "
                              f"{width}; a low-rank update uses at most that (LoRA typically 4 to 64)")
    replaced = []
    for salt, (path, module, weight) in enumerate(chosen):
        if weight is None:
            _set(model, path, LoraEinsum(module, rank, alpha, dropout, salt, rngs=rngs))
        else:
            setattr(module, SEAM.format(weight), LoraUpdate(getattr(module, weight), module.EINSUMS[weight], rank,
                                                            alpha, dropout, salt, rngs=rngs))
        replaced.append("/".join(map(str, path)))
    return replaced


def add_prefixes(model: nnx.Module, length: int, hidden: int, rngs: nnx.Rngs) -> int:
    """Gives every softmax self-attention layer ``length`` learned key/value prefixes; returns how many layers."""
    layers = [m for p, m in _modules(model, Attention) if p[-1] == "attn" and m.spec.kind != "linear"]
    if not layers:
        raise ConfigError("peft.prefix: the model has no softmax self-attention layer to prefix")
    held = next(("/".join(map(str, p)) for p, m in _modules(model, Attention)
                 if getattr(m, "prefix", None) is not None), None)
    if held is not None:  # a second prefix would replace the first, trained or loaded, without a word
        raise ConfigError(f"peft.prefix: {held} already has a prefix (the model holds the peft parts it was built "
                          "or loaded with; name only new parts)")
    for attn in layers:
        s = attn.spec
        attn.prefix = Prefix(length, s.n_embd, s.n_head, s.head_dim, hidden, rngs=rngs)
    return len(layers)


def add_adapters(model: nnx.Module, size: int, activation: str, after: list[str], rngs: nnx.Rngs) -> int:
    """Puts a bottleneck adapter after the self-attention and/or MLP sub-layer of every block."""
    blocks = [m for _, m in _modules(model, Block)]
    held = next(("/".join(map(str, p)) for p, m in _modules(model, Block)
                 if getattr(m, "attn_adapter", None) is not None or getattr(m, "mlp_adapter", None) is not None), None)
    if held is not None:
        raise ConfigError(f"peft.adapter: {held} already has adapters (the model holds the peft parts it was built "
                          "or loaded with; name only new parts)")
    for i, block in enumerate(blocks):
        d = block.spec.mlp.n_embd
        if "attn" in after and block.attn is not None:
            block.attn_adapter = Adapter(d, size, activation, 0.0, 2 * i, rngs=rngs)
        if "mlp" in after:
            block.mlp_adapter = Adapter(d, size, activation, 0.0, 2 * i + 1, rngs=rngs)
    return len(blocks)


def apply_peft(model: nnx.Module, settings: dict, rngs: nnx.Rngs | int = 0) -> nnx.Module:
    """Plugs the parts ``settings`` (the ``peft`` config key's dict, checked the same way) names into ``model``,
    in place, and returns it. Which parameters then train is ``training.peft.trainable_filter(settings)``."""
    settings = check_peft(settings)
    rngs = nnx.Rngs(params=rngs) if isinstance(rngs, int) else rngs
    if "lora" in settings:
        lora = settings["lora"]
        add_lora(model, lora["targets"], lora["rank"], lora["alpha"], lora["dropout"], rngs)
    if "prefix" in settings:
        add_prefixes(model, settings["prefix"]["length"], settings["prefix"]["hidden"], rngs)
    if "adapter" in settings:
        a = settings["adapter"]
        add_adapters(model, a["size"], a["activation"], a["after"], rngs)
    return model

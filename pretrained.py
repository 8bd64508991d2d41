"""Load any zoo model from a NeoMesh run directory or a Hugging Face directory, placed on a layout.

    from pretrained import Pretrained
    model = Pretrained.from_pretrained("runs/quickstart")               # or an HF directory
    model(["def add(a, b):"]), model.hidden_states(["text"]), model.generate("def ")

    from pretrained import load
    cfg, graphdef, params, tokenizer = load("runs/quickstart")          # the pieces, for the jitted steps

``load_run`` restores the latest checkpoint's parameters (without optimizer state) onto any mesh: orbax reshards
what another mesh wrote. ``load`` also accepts Hugging Face directories (config.json + weights) and finds the
tokenizer either way.
"""

from __future__ import annotations

import os
import shlex
from typing import Callable

import jax

from config import Config, ConfigError, from_dict


def default_layout():
    """One device, data layout: where a model lands unless told otherwise."""
    return layout_for()


def layout_for(mesh_shape: str | None = None, layout: str = "batch:x", names: tuple[str, str] = ("mesh_shape",
                                                                                                "layout")):
    """The layout of the commands' ``--mesh-shape`` and ``--layout``: ``layout`` on that mesh, or on one device
    when there is no mesh shape. Errors name the two as ``names`` (the flags that gave them)."""
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from predict import check_layout_has_mesh

    for name, value in zip(names, (mesh_shape, layout)):
        if value == "auto":  # parallel/auto.py sizes a train state; a model alone goes on x:-1 with batch:x
            raise ConfigError(f"{name}: 'auto' chooses a mesh and layout for training (train.py); here give one, "
                              "e.g. x:-1 (every device) with the batch split over it, the default layout")
    check_layout_has_mesh(mesh_shape, layout, names)
    try:
        mesh = make_mesh(mesh_shape) if mesh_shape else make_mesh("x:1", jax.devices()[:1])
        return Layout.from_config(mesh, layout)
    except ConfigError as e:
        for key, name in zip(("mesh_shape", "layout"), names):
            if str(e).startswith(f"{key}:") and name != key:
                raise ConfigError(f"{name}{str(e)[len(key):]}") from None
        raise


def load_run(model_path: str, layout=None, overrides: tuple[str, ...] = (),
             check_config: Callable[[Config], None] | None = None) -> tuple[Config, object, dict]:
    """(config, graphdef, parameters) of the latest checkpoint in ``model_path``, on ``layout`` (default: one
    device). The checkpoint may have been written on any mesh. A damaged checkpoint (its checksums differ) or one
    holding NaN or infinity is a one-line error. ``check_config`` sees the checkpoint's config before any weight is
    read (a refusal that needs no weights costs no restore)."""
    from training.checkpoint import Checkpoints

    with Checkpoints(model_path, keep=1, read_only=True) as checkpoints:
        step = checkpoints.latest_step()
        for _ in range(RETRIES):
            try:
                return _load_step(checkpoints, step, model_path, layout, overrides, check_config)
            except ConfigError as e:
                # A run in progress saved a newer checkpoint and its keep_checkpoints rotation deleted this one
                # while it was read: that is no damage, the newest one is what was asked for.
                checkpoints.manager.reload()
                newer = checkpoints.latest_step()
                if "is damaged" in str(e) and step is not None and newer is not None and newer > step:
                    step = newer
                    continue
                if " is damaged: " in str(e):  # what train.py does with one: the way to the previous step
                    raise ConfigError(f"{e} (train.py --model-path {shlex.quote(model_path)} --eval moves a "
                                      "damaged checkpoint to damaged_checkpoints/ and evaluates the one before, "
                                      "which this command then reads)") from None
                raise
        return _load_step(checkpoints, step, model_path, layout, overrides, check_config)


RETRIES = 5  # newer checkpoints tried, one after another, while a running run rotates the ones being read away


def _load_step(checkpoints, step: int, model_path: str, layout, overrides: tuple[str, ...], check_config=None):
    from parallel.state import per_layer_params, sharded_abstract_params, split_params
    from training.checkpoint import DamagedCheckpoint
    from training.layer_stack import stack_abstract
    from training.peft import build_model, trainable_filter

    saved = checkpoints.located_config(step)
    cfg, _ = from_dict(saved, source=f"{model_path} checkpoint config", overrides=overrides)
    if overrides:
        check_same_shapes(from_dict(saved, source=f"{model_path} checkpoint config")[0], cfg, overrides,
                          f"checkpoint {checkpoints.directory}/{step}")
    if check_config is not None:
        check_config(cfg)
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    graphdef, abstract = sharded_abstract_params(make_model, layout or default_layout())
    peft = cfg.peft_settings
    try:
        stacking = checkpoints.stacked_layers(step)  # a scan_layers run's (training/layer_stack.py)
    except DamagedCheckpoint as e:
        raise ConfigError(f"checkpoint {checkpoints.directory}/{step} is damaged: {e}") from None
    if stacking:
        stacked = stack_abstract(abstract, stacking)
        return cfg, graphdef, per_layer_params(checkpoints.restore_params_verified(stacked, step), stacked)
    if peft is None or peft["checkpoint"] == "all":
        return cfg, graphdef, checkpoints.restore_params_verified(abstract, step)  # damaged or NaN: refused
    # The checkpoint holds the trained parts only: the base comes from init_from, or the run's seeded init.
    trained = checkpoints.restore_params_verified(split_params(abstract, trainable_filter(peft))[0], step)
    return cfg, graphdef, _with_base(cfg, make_model, abstract, trained, model_path)


def _with_base(cfg: Config, make_model, abstract: dict, trained: dict, model_path: str) -> dict:
    from parallel.state import init_params, join_params, place_params

    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    fresh = lambda: init_params(make_model, cfg.seed, shardings)  # noqa: E731
    if cfg.init_from is None:
        return join_params(trained, fresh())
    from neomesh.hf_cache import resolve_model
    from training.base_identity import check_base
    from training.init_from import source_params, without_head

    def unreadable(e: ConfigError) -> ConfigError:  # moved or deleted since training: say why that model is read
        return ConfigError(f"{model_path} holds only its trained parameters (peft checkpoint 'trainable'); the rest "
                           f"comes from its init_from, which cannot be read: {e}")

    try:
        source = resolve_model(cfg.init_from, "init_from")
    except ConfigError as e:
        raise unreadable(e) from None
    check_base(model_path, source)  # another model of the same shape put there would fit, and be used unsaid
    try:
        base = source_params(source)[1]
        base = without_head(cfg, base)[0] if cfg.init_new_head else base  # as at the run's start
    except ConfigError as e:
        raise unreadable(e) from None
    return join_params(trained, place_params(base, abstract, fresh))


def check_same_shapes(saved: Config, cfg: Config, overrides: tuple[str, ...], weights: str) -> None:
    """A one-line error naming ``overrides`` where they give the model other parameters than ``weights`` were
    made for (``--set n_ctx=64`` on a model with 128 learned positions), before any restore is tried."""
    from parallel.state import abstract_model, path_name
    from training.peft import build_model

    def shapes(c: Config) -> dict:
        leaves = jax.tree_util.tree_leaves_with_path(abstract_model(lambda rngs: build_model(c, rngs))[1])
        return {path_name(path): leaf.shape for path, leaf in leaves}

    theirs, ours = shapes(saved), shapes(cfg)
    for name in sorted(theirs.keys() | ours.keys()):
        if theirs.get(name) != ours.get(name):
            have = lambda shape: "none" if shape is None else str(shape)  # noqa: E731
            raise ConfigError(f"--set {' '.join(overrides)}: the model would change shape ({name}: "
                              f"{have(theirs.get(name))} in {weights}, {have(ours.get(name))} with --set); set only "
                              "keys that keep its parameters")


def load_hf_model(hf_dir: str, layout=None, notes: list | None = None, overrides: tuple[str, ...] = ()
                  ) -> tuple[Config, object, dict]:
    """(config, graphdef, parameters) of a Hugging Face model directory, placed on ``layout``, its config changed
    by ``overrides`` (``precision=bfloat16``) where they keep the parameters' shapes. A head the checkpoint lacks
    (a bare ``BertModel`` loaded for masked LM) starts from its init, and ``notes`` says so."""
    from convert.hf import load_hf
    from parallel.state import init_params, match_params, place_params, sharded_abstract_params
    from training.peft import build_model

    cfg, params = load_hf(hf_dir)
    if overrides:
        imported = cfg
        cfg, _ = from_dict(cfg.to_dict(), source=f"{hf_dir}/config.json (imported)", overrides=overrides)
        check_same_shapes(imported, cfg, overrides, hf_dir)
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    graphdef, abstract = sharded_abstract_params(make_model, layout or default_layout())
    missing = match_params(params, abstract)[1]
    if missing and notes is not None:
        notes.append(f"{hf_dir} has no weights for {', '.join(missing)}: initialised fresh")
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    return cfg, graphdef, place_params(params, abstract, lambda: init_params(make_model, cfg.seed, shardings))


def load(path: str, layout=None, overrides: tuple[str, ...] = (), kind: str = "auto", notes: list | None = None,
         adapter: str | None = None):
    """(config, graphdef, parameters, tokenizer) of a NeoMesh run directory (``kind`` "run"; it has checkpoints/)
    or a Hugging Face directory ("hf"; it has config.json and weights, or is ORG/NAME in the local Hugging Face
    cache); "auto" tells them apart. A model that reads images (ViT) has no tokenizer: None. ``adapter``: a Hugging
    Face peft LoRA adapter directory put on the model (convert/peft_adapter.py); ``path`` may be one too, put on the
    base its base_model_name_or_path names."""
    from convert.hf_dir import load_tokenizer
    from data.source import make_tokenizer

    if kind not in ("auto", "run", "hf"):
        raise ConfigError(f"load: kind {kind!r} is not one of 'auto', 'run', 'hf'")
    if kind in ("auto", "hf") and not os.path.isdir(path):
        from neomesh.hf_cache import resolve_model
        path, kind = resolve_model(path, "load"), "hf"  # ORG/NAME from the local Hugging Face cache
    if adapter is not None and kind in ("auto", "hf") and not os.path.exists(os.path.join(path, "config.json")):
        from convert.peft_adapter import is_adapter_dir, read_adapter_config

        if is_adapter_dir(path):
            base = read_adapter_config(path).get("base_model_name_or_path")
            raise ConfigError(f"{path}: a peft adapter directory, given as the base model of the adapter {adapter}: "
                              f"an adapter goes on a base model; give its base ({base}), or it alone")
    if adapter is None and kind in ("auto", "hf") and not os.path.exists(os.path.join(path, "config.json")):
        from training.init_from import adapter_base

        base = adapter_base(path)  # a peft adapter directory: on the base it names, as peft's AutoPeftModel
        if base is not None:
            path, adapter, kind = base, path, "auto"
    if kind == "auto":
        kind = "run" if os.path.isdir(os.path.join(path, "checkpoints")) else "hf" if os.path.exists(
            os.path.join(path, "config.json")) else None
    if kind == "run":
        from neomesh.paths import run_tokenizer_dir

        tokenizer_dir = run_tokenizer_dir(path)  # before the checkpoint is read
        cfg, graphdef, params = load_run(path, layout, overrides)
        if not cfg.reads_text:
            tokenizer = None
        else:
            tokenizer = load_tokenizer(tokenizer_dir) if os.path.isdir(tokenizer_dir) else make_tokenizer(cfg)
    elif kind == "hf":
        cfg, graphdef, params = load_hf_model(path, layout, notes, overrides)
        tokenizer = load_tokenizer(path) if cfg.reads_text else None
    else:
        raise ConfigError(f"{path}: neither a NeoMesh run directory (no checkpoints/) nor a Hugging Face model "
                          "directory (no config.json)")
    if tokenizer is not None and tokenizer.vocab_size > cfg.n_vocab:
        raise ConfigError(f"n_vocab: {cfg.n_vocab} is smaller than the tokenizer's {tokenizer.vocab_size} tokens")
    if adapter is not None:
        cfg, graphdef, params = with_adapter_placed(cfg, graphdef, params, adapter, layout)
    return cfg, graphdef, params, tokenizer


def with_adapter_placed(cfg: Config, graphdef, params: dict, adapter: str, layout=None) -> tuple[Config, object, dict]:
    """The model with the peft adapter directory ``adapter`` on it (``convert.peft_adapter.adapter_params``), its
    parameters placed on ``layout`` as the model's own are."""
    from convert.peft_adapter import adapter_params
    from parallel.state import place_params, sharded_abstract_params
    from training.peft import build_model

    cfg, params = adapter_params(cfg, params, adapter)
    graphdef, abstract = sharded_abstract_params(lambda rngs: build_model(cfg, rngs), layout or default_layout())
    return cfg, graphdef, place_params(params, abstract, lambda: abstract)


def label_names_of(path: str, num_labels: int) -> list[str] | None:
    """The label names of the classifier in a run directory (its labels.json) or a Hugging Face directory (its
    id2label, where it names them), in id order; None where they are not named."""
    import json

    from neomesh import label_names

    from training.init_from import adapter_base

    if not os.path.isdir(path):
        from neomesh.hf_cache import resolve_model
        path = resolve_model(path, "load")
    path = adapter_base(path) or path  # a peft adapter directory's labels are its base's
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return label_names.load(path, num_labels)
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            names = label_names.from_hf(json.load(f))
    except (OSError, ValueError):
        return None
    return names if names and len(names) == num_labels else None


class Pretrained:
    """A loaded zoo model and its tokenizer, as Hugging Face users know ``from_pretrained`` models:

        model = Pretrained.from_pretrained("runs/quickstart")     # a NeoMesh run, or any HF directory it imports
        logits = model(["def add(a, b):"])                         # (B, T, V); (B, C) for a classifier; (B, 1, V)
                                                                   # for a T5: its first output token's
        model.labels                                               # a classifier's label names in id order
        vit(vit.read_images(["cat.jpg", "pets/"]))                 # (B, C): image files and folders, as trained
        hidden = model.hidden_states(["def add(a, b):"])           # (B, T, D), padding rows included
        text = model.generate("def ", max_new_tokens=32, temperature=0.8)

    Texts are tokenized and right-padded into one batch (``segment_ids`` 0 marks padding); calls are jitted once
    per padded length. The parameters stay where ``layout`` put them (default: one device).

    ``model`` is the one nnx module every call reads: what changes it in place (``apply_peft``, ``merge``,
    ``set_attention_fn``, a weight set) changes what ``__call__``, ``hidden_states`` and ``generate`` compute.
    ``graphdef`` and ``params`` are its structure and state as they are now."""

    labels: list[str] | None = None  # a classifier's label names in id order (transformers' id2label), if named

    def __init__(self, cfg: Config, graphdef, params: dict, tokenizer, layout=None):
        from flax import nnx

        self.config, self.tokenizer = cfg, tokenizer
        self.layout = layout or default_layout()
        self.model = nnx.merge(graphdef, nnx.State(params))
        # The graphdef is static: a module changed in place (an adapter plugged in) compiles anew, an unchanged one
        # reuses the compiled call.
        self._forward = jax.jit(self._run, static_argnums=(0, 3))

    @classmethod
    def from_pretrained(cls, path: str, layout=None, overrides: tuple[str, ...] = (),
                        mesh_shape: str | None = None, adapter: str | None = None) -> "Pretrained":
        """Loads a run or HF directory (see ``load``); weights a checkpoint lacks (a head) warn, as in
        transformers, and start from their init. ``layout`` is a ``Layout`` or, as predict.py's ``--layout``, a
        string placed on ``mesh_shape`` (``layout="batch:x,heads:y", mesh_shape="x:4,y:2"``). ``adapter``: a
        Hugging Face peft LoRA adapter directory of this base, loaded onto it (peft's ``PeftModel.from_pretrained``)."""
        import warnings

        if isinstance(layout, str) or mesh_shape is not None:  # the commands' strings, checked as they are
            layout = layout_for(mesh_shape, layout or "batch:x")
        layout = layout or default_layout()
        overrides = (overrides,) if isinstance(overrides, str) else tuple(overrides)  # one "key=value" alone
        notes: list[str] = []
        cfg, graphdef, params, tokenizer = load(path, layout, overrides, notes=notes, adapter=adapter)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        pretrained = cls(cfg, graphdef, params, tokenizer, layout)
        if cfg.task.endswith("classification"):
            pretrained.labels = label_names_of(path, cfg.num_labels)
        return pretrained

    @property
    def graphdef(self):
        """The module's structure as it is now (parts plugged in, attention functions set)."""
        from flax import nnx

        return nnx.graphdef(self.model)

    @property
    def params(self) -> dict:
        """The module's state as it is now: a nested dict of arrays."""
        from flax import nnx

        return nnx.to_pure_dict(nnx.state(self.model))

    @params.setter
    def params(self, params: dict) -> None:
        from flax import nnx

        nnx.update(self.model, nnx.State(params))

    def _split(self) -> tuple:
        """(graphdef, params) of the module as it is now, in one walk over it."""
        from flax import nnx

        graphdef, state = nnx.split(self.model)
        return graphdef, nnx.to_pure_dict(state)

    def tokenize(self, texts: list[str] | str, pairs: list[str] | str | None = None) -> dict:
        """Texts (and second texts) -> {"inputs", "segment_ids" (+ "token_types"): (B, T) int32}, right-padded
        with the tokenizer's padding id. Encoders and classifiers read what their training data held: the
        tokenizer's own [CLS] a [SEP] (b [SEP]) template (data/labelled.py), token classifiers the text's words
        tokenized one by one between [CLS] and [SEP] (data/token_labels.py); decoders the plain ids."""
        import numpy as np

        if self.tokenizer is None:
            raise ConfigError(f"tokenize: a {self.config.model} model reads images, not text; pass a batch dict "
                              "{\"images\": (B, H, W, C) images}")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ConfigError("tokenize: texts is empty; pass a text or a list of at least one")
        pairs = [pairs] if isinstance(pairs, str) else list(pairs) if pairs is not None else [None] * len(texts)
        if len(pairs) != len(texts):  # zip would drop the texts without a pair
            raise ConfigError(f"tokenize: {len(texts)} texts but {len(pairs)} second texts; give one per text")
        for what, items in (("texts", texts), ("pairs", pairs)):
            for x in items:
                if not isinstance(x, str) and not (what == "pairs" and x is None):
                    raise ConfigError(f"tokenize: {what} must be strings, not {type(x).__name__} ({str(x):.40}); "
                                      "pass token ids as a batch dict {\"inputs\": (B, T) ids, \"segment_ids\": ...}")
        cfg = self.config
        if cfg.task == "seq2seq":  # T5's encoder inputs: the text (its start, if long), then end-of-text
            from data.pairs import ended

            if any(p is not None for p in pairs):
                raise ConfigError(f"tokenize: a {cfg.model} model reads single texts, not pairs")
            eos = self.tokenizer.eos_id
            encoded = [(ended(ids, cfg.n_ctx, eos)[0], None) for ids in map(self.tokenizer.encode, texts)]
        elif cfg.task == "token_classification":  # words tokenized one by one, framed, as its training data held them
            from data.token_labels import framed, word_pieces

            if any(p is not None for p in pairs):
                raise ConfigError(f"tokenize: a {cfg.model} model trained for {cfg.task} reads single texts, not pairs")
            encoded = [(framed(self.tokenizer, [i for word in word_pieces(self.tokenizer, text.split()) for i in word],
                               cfg.n_ctx), None) for text in texts]
        elif cfg.task == "question_answering":  # the question with the first window of its context, as trained
            if any(p is None for p in pairs):
                raise ConfigError("tokenize: a question-answering model reads (question, context) pairs; give each "
                                  "question its context as the pair")
            from data.squad import context_windows

            encoded = [context_windows(self.tokenizer, q, c, cfg, "tokenize: the question")[0][:2]
                       for q, c in zip(texts, pairs)]
        elif cfg.task == "sequence_classification" or not cfg.causal:
            encoded = self.tokenizer.encode_pairs(texts, pairs, cfg.n_ctx)
        elif any(p is not None for p in pairs):
            raise ConfigError(f"tokenize: a {cfg.model} model trained for {cfg.task} reads single texts, not pairs")
        else:
            encoded = [(ids[:cfg.n_ctx] or [self.tokenizer.eos_id], None) for ids in map(self.tokenizer.encode, texts)]
        width = max(len(ids) for ids, _ in encoded)
        inputs = np.full((len(encoded), width), self.tokenizer.padding_id, np.int32)
        segment_ids = np.zeros((len(encoded), width), np.int32)
        token_types = np.zeros((len(encoded), width), np.int32)
        for row, (ids, types) in enumerate(encoded):
            inputs[row, :len(ids)] = ids
            segment_ids[row, :len(ids)] = 1
            token_types[row, :len(ids)] = types or 0
        batch = {"inputs": inputs, "segment_ids": segment_ids}
        return {**batch, "token_types": token_types} if cfg.n_token_types else batch

    def read_images(self, paths: list[str] | str) -> dict:
        """Image files (or folders of them, their images in sorted order) -> {"images": (B, H, W, C) float32} as
        the model's training batches held a folder's images (data/images.py): converted to RGB or grey, resized to
        image_size, scaled and normalised with image_mean and image_std, as Hugging Face's image processors do."""
        from data.images import image_files, read_image_files

        if self.config.reads_text:
            raise ConfigError(f"read_images: a {self.config.model} model reads text, not images; call the model on "
                              "texts, or a batch dict from tokenize")
        paths = [paths] if isinstance(paths, str) else list(paths)
        if not paths:
            raise ConfigError("read_images: paths is empty; pass an image file, a folder or a list of them")
        return {"images": read_image_files(self.config, image_files(paths))}

    def _run(self, graphdef, params, batch: dict, method: str):
        from flax import nnx

        with self.layout.active():
            model = nnx.merge(graphdef, nnx.State(params))
            kwargs = {k: v for k, v in batch.items() if k != "inputs"}
            if method == "hidden_states":
                return model.hidden_states(batch["inputs"], **kwargs)
            return model(batch["inputs"], **kwargs)[0]

    def __call__(self, texts, pairs=None) -> jax.Array:
        """Texts (and second texts), or a batch dict from ``tokenize`` -> the model's outputs: logits for every
        position, class logits for a sequence classifier, (B, T, 2) start and end logits for a question-answering
        model (texts the questions, pairs their contexts: the first window of each; ``answer`` reads every window),
        or for a T5 the logits of its first output token (B, 1, V): its decoder reads the start token alone, unless
        the batch dict gives ``decoder_inputs`` (B, T), which get (B, T, V). An image model takes ``{"images": (B, H,
        W, C)}``."""
        batch = texts if isinstance(texts, dict) else self.tokenize(texts, pairs)
        return self._forward(*self._split(), self._checked(batch), "__call__")

    def answer(self, question: str | list[str], context: str | list[str], allow_empty: bool = False
               ) -> tuple[str, float] | list[tuple[str, float]]:
        """The span of ``context`` a question-answering model picks for ``question`` and its start + end logit, over
        every window of the context, as an evaluation picks it (run_qa's post-processing: evaluation/squad.py);
        lists of questions and their contexts give a list of those, as the question-answering pipeline does.
        ``allow_empty`` (the question-answering pipeline's handle_impossible_answer, for a model trained on
        unanswerable questions, SQuAD v2): "" and the null score where that beats the best span."""
        import numpy as np

        if isinstance(question, list) and isinstance(context, list) and len(question) == len(context):
            return [self.answer(q, c, allow_empty) for q, c in zip(question, context)]
        for what, text in (("question", question), ("context", context)):
            if not isinstance(text, str):
                raise ConfigError(f"answer: {what} must be a string (or question and context lists of one length), "
                                  f"not {type(text).__name__} ({str(text):.40})")

        from data.squad import context_windows, window_rows
        from evaluation.squad import best_answer
        from training.objectives import NO_ANSWER_HERE

        cfg = self.config
        if cfg.task != "question_answering":
            raise ConfigError(f"answer: a {cfg.model} model trained for {cfg.task} does not answer questions")
        windows = context_windows(self.tokenizer, question, context, cfg, "answer: the question")
        inputs, token_types, lengths, offsets = window_rows(windows, cfg.n_ctx, self.tokenizer.padding_id)
        segment_ids = (np.arange(cfg.n_ctx)[None, :] < lengths[:, None]).astype(np.int32)
        batch = {"inputs": inputs, "segment_ids": segment_ids, **({"token_types": token_types} if cfg.n_token_types
                                                                 else {})}
        logits = np.asarray(self(batch), np.float64)  # (W, T, 2): each window's start and end logits
        # padding, as training and evaluation score it: no span there (its logits were never trained down and took
        # places among the likeliest starts and ends, leaving a short context's answer unpicked)
        logits = np.where(segment_ids[..., None] != 0, logits, NO_ANSWER_HERE)
        return best_answer(logits[..., 0], logits[..., 1], offsets, context, cfg.max_answer_length, allow_empty)

    def hidden_states(self, texts) -> jax.Array:
        """Texts (or a batch dict) -> (B, T, D) final hidden states (after the final norm for decoders; a T5's
        encoder output)."""
        batch = texts if isinstance(texts, dict) else self.tokenize(texts)
        return self._forward(*self._split(), self._checked(batch), "hidden_states")

    def _checked(self, batch: dict) -> dict:
        """A batch dict as the model reads it. For a model that reads images: their (B, H, W, num_channels) array,
        under ``images`` as training batches hold it (or ``inputs``), H and W whole patches (an array of another
        layout failed deep inside the patch reshape or an einsum); a training batch's labels and weights are not
        read."""
        import numpy as np

        cfg = self.config
        if cfg.reads_text:
            return batch
        key = next((k for k in ("images", "inputs") if k in batch), None)
        if key is None:
            raise ConfigError(f"batch: a {cfg.model} model reads images, under \"images\" as training batches hold "
                              f"them; this batch has {', '.join(map(repr, batch)) or 'no keys'}")
        shape = np.shape(batch[key])
        if len(shape) != 4 or shape[-1] != cfg.num_channels or shape[1] % cfg.patch_size or shape[2] % cfg.patch_size:
            raise ConfigError(f"{key}: images of shape {tuple(shape)}; a {cfg.model} model reads (B, H, W, "
                              f"{cfg.num_channels}) images, channels last, H and W multiples of patch_size "
                              f"{cfg.patch_size} (e.g. (B, {cfg.image_size}, {cfg.image_size}, {cfg.num_channels}))")
        return {"inputs": batch[key]}

    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.8, seed: int = 0,
                 top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0) -> str:
        """The text a decoder writes after ``prompt``, or an encoder-decoder (T5) writes for it (until end-of-text
        or ``max_new_tokens``); sampled from entmax for a model trained with ``entmax_loss``. ``top_k``, ``top_p``
        and ``repetition_penalty`` are predict.py's (0, 1 and 1: off)."""
        import math
        from numbers import Integral, Real

        from models.generate import complete

        if not isinstance(prompt, str):
            raise ConfigError(f"generate: prompt must be one string, not a {type(prompt).__name__} (call generate "
                              "once per prompt)")
        def integer(value):
            return isinstance(value, Integral) and not isinstance(value, bool)

        def number(value):
            return isinstance(value, Real) and not isinstance(value, bool)

        for name, value, ok, rule in (
                ("max_new_tokens", max_new_tokens, integer(max_new_tokens) and max_new_tokens >= 1,
                 "an integer of at least 1"),
                ("temperature", temperature, number(temperature) and temperature >= 0, "a number >= 0 (0 is greedy)"),
                ("top_k", top_k, integer(top_k) and top_k >= 0, "an integer >= 0 (0 keeps every token)"),
                ("top_p", top_p, number(top_p) and 0 < top_p <= 1, "in (0, 1] (1 keeps every token)"),
                ("repetition_penalty", repetition_penalty,
                 number(repetition_penalty) and 0 < repetition_penalty < math.inf, "a number > 0 (1 is off)")):
            if not ok:
                raise ConfigError(f"generate: {name} {value!r} must be {rule}")
        if self.config.task not in ("causal_lm", "seq2seq") or not self.config.decoder_layers:
            raise ConfigError(f"generate: a {self.config.model} model trained for {self.config.task} does not "
                              "generate text")
        positions = self.config.generation_positions
        if self.config.task == "seq2seq":  # the encoder reads the prompt's start, as training cut its inputs
            from data.pairs import ended

            prompt = ended(self.tokenizer.encode(prompt), positions, self.tokenizer.eos_id)[0]
        with self.layout.active():
            return complete(*self._split(), self.tokenizer, prompt, max_new_tokens, positions,
                            temperature=temperature, seed=seed, entmax=self.config.entmax_loss, top_k=top_k,
                            top_p=top_p, repetition_penalty=repetition_penalty)

"""Generate text: ``python predict.py --config configs/quickstart.json --prompt "def "``.

The model comes from a NeoMesh run directory (``--model-path``, default the config's model_path; it may have been
trained on any mesh) or straight from a Hugging Face GPT-Neo/GPT-2/T5/ViT or classifier directory (``--hf-model``).
Prompts (repeated ``--prompt``, one per line of ``--prompt-file``, or a whole file each with
``--prompt-from-file``, as GPT-Neo's ``--prompt FILE`` was) run as one left-padded batch; a single prompt streams
to stdout as it is generated. ``--output FILE`` also writes the generations to FILE, as GPT-Neo's predictions file.
Generation is KV-cached and compiled once per shape. A decoder continues its prompt; an encoder-decoder (T5) reads
the prompt with its encoder and writes its output text. An image classifier (ViT) takes ``--image`` files or
folders instead and prints each file's most likely classes; a text classifier labels its prompts (a sequence
classifier's likeliest labels, a regression's score, or a multi-label classifier's labels of probability >= 0.5,
with ``--pair`` second texts for a sentence-pair one; a token classifier's label of each word; a question-answering
model the answer span of each ``--prompt`` question in its ``--pair`` context, and its score); a masked LM (BERT,
RoBERTa) prints the likeliest tokens at each mask of its prompts (fill-mask).
"""

from __future__ import annotations

import argparse
import sys

from neomesh.classifier_output import DEFAULT_TOP_CLASSES, FILL_MASK, QUESTION_ANSWERING, TEXT_CLASSIFIERS

DEFAULT_NEW_TOKENS = 64
DEFAULT_LAYOUT = "batch:x"


def build_parser() -> argparse.ArgumentParser:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--config", metavar="FILE", help="JSON config (a path, or a shipped config by name); its "
                       "model_path is the default --model-path")
    which.add_argument("--model", metavar="NAME", help="GPT-Neo's way to name a config: configs/NAME.json")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model-path", help="NeoMesh run directory with checkpoints (default: the config's "
                        "model_path)")
    source.add_argument("--hf-model", metavar="DIR_OR_NAME", help="Hugging Face model (GPT-Neo, GPT-2, T5, a text "
                        "classifier; a ViT with --image): a directory, or ORG/NAME[@REVISION] from the local Hugging "
                        "Face cache (nothing is downloaded); a peft adapter directory: on the base it names")
    p.add_argument("--adapter", metavar="DIR", help="a Hugging Face peft LoRA adapter directory (adapter_config.json "
                   "+ adapter_model.safetensors) put on the model, as peft's PeftModel.from_pretrained(base, DIR)")
    prompts = p.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt", action="append", help="prompt text (repeatable: one batch)")
    prompts.add_argument("--prompt-file", metavar="FILE", help="a file with one prompt per line (\\n inside a "
                         "line is a line break; empty lines are skipped; - reads standard input)")
    prompts.add_argument("--prompt-from-file", action="append", metavar="FILE",
                         help="a file whose whole text is one prompt (GPT-Neo's --prompt FILE; repeatable; - reads "
                         "standard input)")
    prompts.add_argument("--image", action="append", metavar="FILE_OR_FOLDER", help="an image classifier (ViT): "
                         "classify this image file, or every image in this folder (repeatable); prints each file's "
                         f"--top-k most likely classes (default {DEFAULT_TOP_CLASSES}) and their probabilities")
    p.add_argument("--pair", action="append", metavar="TEXT", help="a sentence-pair classifier (MRPC, NLI): the "
                   "second text of each prompt, in order (repeatable: one per prompt); a question-answering model: "
                   "the context each --prompt question is answered from")
    p.add_argument("--output", metavar="FILE", help="also write the generations to FILE")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens to generate per prompt (default: the "
                   f"config's predict_max_steps, else {DEFAULT_NEW_TOKENS})")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T", help="sampling temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the k most likely tokens (0: all); "
                   f"for a classifier (--image, or a text classifier's prompts), the classes shown (0: "
                   f"{DEFAULT_TOP_CLASSES})")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="keep the smallest set with this "
                   "probability (1: all)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R", help="Hugging Face's penalty "
                   "(1: off)")
    p.add_argument("--num-beams", type=int, default=1, metavar="B", help="beam search with this many beams "
                   "(1: no beam search)")
    p.add_argument("--length-penalty", type=float, default=1.0, metavar="L", help="beam score = log p / length ** "
                   "this")
    p.add_argument("--entmax-sampling", action=argparse.BooleanOptionalAction, help="draw tokens from entmax "
                   "instead of softmax (default: on for a model trained with entmax_loss)")
    p.add_argument("--entmax_sampling", dest="entmax_sampling", action="store_true", default=None,
                   help="GPT-Neo's spelling of --entmax-sampling")
    p.add_argument("--num-samples", type=int, default=1, metavar="S", help="samples per prompt")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when this text appears "
                   "(repeatable)")
    p.add_argument("--truncate-prompt", action="store_true", help="cut a prompt too long for n_ctx instead of "
                   "stopping with an error: a decoder reads its last tokens, an encoder-decoder (T5) its first ones "
                   "and end-of-text, as training cut its inputs")
    p.add_argument("--mesh-shape", metavar="SHAPE", help="run sharded on this mesh, e.g. x:4,y:2 (default: one "
                   "device)")
    p.add_argument("--layout", default=DEFAULT_LAYOUT, help="layout with --mesh-shape")
    p.add_set_option()
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from parallel.xla_flags import apply_defaults

    apply_defaults()  # before jax starts
    from neomesh.errors import run_main

    def run():
        check_options(args)  # before jax starts: a mistake costs well under a second
        predict(args)

    return run_main(run)


def check_options(args) -> None:
    """Checks the options and resolves --hf-model and the config's model_path, all without jax."""
    import math

    from config import ConfigError
    from convert.peft_adapter import is_adapter_dir, not_an_adapter

    checks = [(args.max_new_tokens is None or args.max_new_tokens >= 1, "--max-new-tokens must be at least 1"),
              (0 <= args.temperature < math.inf, "--temperature must be a number >= 0"),
              (args.top_k >= 0, "--top-k must be >= 0"), (0 < args.top_p <= 1, "--top-p must be in (0, 1]"),
              (0 < args.repetition_penalty < math.inf, "--repetition-penalty must be a number > 0"),
              (math.isfinite(args.length_penalty), "--length-penalty must be a number (nan or inf made every beam's "
                                                   "score nan)"),
              (args.num_beams >= 1, "--num-beams must be at least 1"),
              (args.num_samples >= 1, "--num-samples must be at least 1"),
              (args.num_beams == 1 or args.num_samples == 1, "--num-samples > 1 needs sampling, not --num-beams"),
              (args.num_samples == 1 or args.temperature > 0 or args.entmax_sampling,
               "--num-samples > 1 needs sampling: --temperature 0 is greedy, the same text every time"),
              (args.num_beams == 1 or not args.entmax_sampling, "--entmax-sampling samples; it does not combine "
                                                                "with --num-beams"),
              (args.num_beams == 1 or (args.top_k == 0 and args.top_p == 1 and args.temperature in (0, 1)),
               "--top-k, --top-p and --temperature shape sampling; beam search (--num-beams) does not sample"),
              (all(args.stop), "--stop: an empty text would end every generation at once"),
              (args.config or args.model or args.model_path or args.hf_model,
               "give --config, --model, --model-path or --hf-model"),
              (args.adapter is None or is_adapter_dir(args.adapter),
               f"--adapter {args.adapter}: {args.adapter and not_an_adapter(args.adapter)}")]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    flag = generation_flag(args)
    if args.image and flag:
        raise ConfigError(f"{flag} shapes generated text; --image classifies images (--top-k: the classes shown)")
    if args.image and args.pair:
        raise ConfigError("--pair gives a sentence-pair classifier's prompts their second texts; --image classifies "
                          "images")
    check_layout_has_mesh(args.mesh_shape, args.layout)
    check_sets_place_nothing(args.set, "predict.py")
    resolve_model_source(args)


def generation_flag(args) -> str | None:
    """The first option given that only shapes generated text (a classifier has no use for it)."""
    generation = {"--max-new-tokens": args.max_new_tokens is not None, "--temperature": args.temperature != 1,
                  "--top-p": args.top_p != 1, "--repetition-penalty": args.repetition_penalty != 1,
                  "--num-beams": args.num_beams != 1, "--length-penalty": args.length_penalty != 1,
                  "--entmax-sampling": args.entmax_sampling is not None, "--num-samples": args.num_samples != 1,
                  "--stop": bool(args.stop), "--truncate-prompt": args.truncate_prompt}
    return next((flag for flag, given in generation.items() if given), None)


def check_layout_has_mesh(mesh_shape: str | None, layout: str,
                          names: tuple[str, str] = ("--mesh-shape", "--layout")) -> None:
    """Without a mesh shape the model runs on one device, where a layout of one's own would change nothing without
    a word (predict.py and eval.py, before jax starts; ``pretrained.layout_for`` for every caller, ``names`` the
    flags or keys that gave the two)."""
    from config import ConfigError

    if not mesh_shape and layout != DEFAULT_LAYOUT:
        raise ConfigError(f"{names[1]} {layout}: give {names[0]} too (without it the model runs on one device)")


def check_sets_place_nothing(sets, command: str) -> None:
    """The model's mesh is --mesh-shape's and its layout --layout's: a ``--set mesh_shape=...`` or ``layout=...``
    would change a config key nothing reads here, and the model would run on one device without a word."""
    from config import ConfigError, parse_override

    for text in sets:
        key, value = parse_override(text)
        flag = {"mesh_shape": "--mesh-shape", "layout": "--layout"}.get(key)
        if flag:
            raise ConfigError(f"--set {text}: {command} places the model with --mesh-shape and --layout, not the "
                              f"config's {key}; give {flag} {value}")


def resolve_model_source(args) -> None:
    """``--model NAME`` -> its config file, ``--hf-model`` -> a directory (the local Hugging Face cache for
    ORG/NAME), and without either the config's ``model_path`` as ``--model-path``; no jax needed."""
    from config import load_config

    if args.model:
        from config import model_config_path
        args.config = model_config_path(args.model)
    if args.hf_model:
        from neomesh.hf_cache import resolve_model
        args.hf_model = resolve_model(args.hf_model)
    elif args.model_path is None:
        args.model_path = load_config(args.config, tuple(args.set))[0].model_path


def load_model(args, layout):
    """(config, graphdef, parameters placed on ``layout``, tokenizer) from --hf-model or a NeoMesh run directory."""
    from config import ConfigError
    from pretrained import load

    path = args.hf_model or args.model_path  # check_options resolved both
    cfg, graphdef, params, tokenizer = load(path, layout, tuple(args.set), kind="hf" if args.hf_model else "run",
                                            adapter=args.adapter)
    if args.image:
        if cfg.reads_text:
            raise ConfigError(f"--image: {path}: a {cfg.model} model trained for {cfg.task} reads text, not images; "
                              "give --prompt")
    elif cfg.task not in ("causal_lm", "seq2seq", FILL_MASK, QUESTION_ANSWERING, *TEXT_CLASSIFIERS) or (
            cfg.task == "seq2seq" and not cfg.decoder_layers):
        what = "an encoder-only t5" if cfg.task == "seq2seq" else f"a {cfg.model} model trained for {cfg.task}"
        how = "give --image FILE_OR_FOLDER to classify images" if not cfg.reads_text else \
            "Pretrained.from_pretrained (pretrained.py) gives its outputs"
        raise ConfigError(f"{path}: {what} does not generate text; {how}")
    return cfg, graphdef, params, tokenizer


class Printer:
    """Host side of generation: streams one row's text as it grows, and ends rows that produce a stop string.
    Text is decoded from all of a row's tokens each time, so multi-byte characters split over tokens print
    whole; text that could still become a stop string is held back until it cannot."""

    def __init__(self, tokenizer, rows: int, stops: list[str], stream: bool):
        self.tokenizer, self.stops, self.stream = tokenizer, stops, stream
        self.ids = [[] for _ in range(rows)]
        self.stopped = [False] * rows
        self.printed = 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def text(self, row: int) -> str:
        text = self.tokenizer.decode(self.ids[row])
        cut = min((text.find(s) for s in self.stops if s in text), default=-1)
        return text if cut < 0 else text[:cut]

    def __call__(self, tokens, step):
        import numpy as np

        for row, token in enumerate(np.asarray(tokens)):
            if self.stopped[row]:
                continue
            if token == self.tokenizer.eos_id:
                self.stopped[row] = True
                continue
            if token == self.tokenizer.padding_id:  # never text (a T5's <pad>), as transformers' decode skips it
                continue
            self.ids[row].append(int(token))
            self.stopped[row] = any(s in self.tokenizer.decode(self.ids[row]) for s in self.stops)
        if self.stream:
            text = self.text(0)
            ready = len(text) if self.stopped[0] else len(text) - self.hold
            if ready > self.printed and not text[:ready].endswith("\ufffd"):
                sys.stdout.write(text[self.printed:ready])
                sys.stdout.flush()
                self.printed = ready
        return np.asarray(self.stopped)

    def finish(self) -> None:
        if self.stream:
            sys.stdout.write(self.text(0)[self.printed:] + "\n")
            sys.stdout.flush()


def read_prompts(args) -> list[str]:
    """The prompts of --prompt, --prompt-file (one per line, ``\\n`` for a newline) or --prompt-from-file (each
    file whole)."""
    import os

    from config import ConfigError

    if args.prompt:
        for text in args.prompt:
            if os.path.isfile(text):  # GPT-Neo's --prompt took a file name
                print(f"note: --prompt {text!r} is used as text; for that file's contents use --prompt-from-file",
                      file=sys.stderr)
        return args.prompt
    files = [args.prompt_file] if args.prompt_file else args.prompt_from_file
    texts = []
    for path in files:
        try:
            if path == "-":  # standard input, as Unix tools read it: prompts piped in
                texts.append(sys.stdin.buffer.read().decode("utf-8-sig"))
                continue
            with open(path, encoding="utf-8-sig") as f:  # a BOM would be the first prompt's first token
                texts.append(f.read())
        except OSError as e:
            raise ConfigError(f"{path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{'standard input' if path == '-' else path}: not UTF-8 text (byte {e.start})") from None
    if args.prompt_from_file:
        empty = [path for path, text in zip(files, texts) if not text.strip()]
        if empty:
            raise ConfigError(f"{empty[0]}: the prompt file is empty")
        return texts
    # Empty lines separate prompts; a line of spaces is a prompt, as --prompt '    ' is (indentation is text to a code
    # model, and a prompt's trailing spaces are kept too).
    prompts = [line.replace("\\n", "\n") for line in texts[0].splitlines() if line]
    if not prompts:
        raise ConfigError(f"{args.prompt_file}: no prompts in it")
    return prompts


def check_output(path: str | None) -> None:
    """--output names a file in a folder that is there (checked before the model loads)."""
    import os

    from config import ConfigError

    if path and os.path.isdir(path):
        raise ConfigError(f"--output {path}: is a directory; name a file")
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ConfigError(f"--output {path}: no such directory")


def write_output(path: str, blocks: list[str], what: str) -> None:
    """Writes ``blocks`` to --output ``path``, whole or not at all."""
    import os

    with open(path + ".tmp", "w") as f:
        f.write("\n".join(blocks) + "\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {len(blocks)} {what} to {path}", file=sys.stderr)


def classify_images(args) -> None:
    """--image: each file's --top-k most likely classes and their probabilities, one line a file."""
    from data.images import image_files
    from neomesh.classifier_output import class_names, image_lines
    from pretrained import Pretrained, layout_for

    files = image_files(args.image)  # a missing file stops the command before the model loads
    check_output(args.output)
    layout = layout_for(args.mesh_shape, args.layout, ("--mesh-shape", "--layout"))
    model = Pretrained(*load_model(args, layout), layout)
    names = class_names(model, args.hf_model or args.model_path)
    lines = image_lines(model, files, names, min(args.top_k or DEFAULT_TOP_CLASSES, len(names)))
    if args.output:
        write_output(args.output, lines, "classification(s)")


def classify_texts(args, prompts: list[str], model) -> None:
    """A text classifier's or masked LM's prompts, labelled (neomesh/classifier_output.py)."""
    from config import ConfigError
    from neomesh.classifier_output import answer_lines, class_names, text_lines

    cfg = model.config
    flag = generation_flag(args)
    if flag:
        what = "fills its prompts' masks (--top-k: the tokens shown)" if cfg.task == FILL_MASK else \
            "labels its prompts (--top-k: the classes shown)"
        raise ConfigError(f"{flag} shapes generated text; a {cfg.model} model trained for {cfg.task} {what}")
    no_ranking = ("a question-answering model gives each question one answer, no classes to show"
                  if cfg.task == QUESTION_ANSWERING else
                  "this sequence classifier is a regression (num_labels 1): it gives each prompt one score, no classes "
                  "to show" if cfg.regression else
                  "this sequence classifier is multi-label: it shows each prompt's labels of probability >= 0.5, "
                  "however many" if cfg.multi_label else None)
    if args.top_k and no_ranking:
        raise ConfigError(f"--top-k: {no_ranking}")
    pairs = args.pair or [None] * len(prompts)
    if len(pairs) != len(prompts):
        raise ConfigError(f"--pair: {len(pairs)} second texts for {len(prompts)} prompts; give one per prompt")
    if cfg.task == QUESTION_ANSWERING:
        lines = answer_lines(model, prompts, pairs)
    else:
        names = class_names(model, args.hf_model or args.model_path)
        lines = text_lines(model, prompts, pairs, names, min(args.top_k or DEFAULT_TOP_CLASSES, len(names)))
    if args.output:
        write_output(args.output, lines, {FILL_MASK: "fill-mask line(s)", QUESTION_ANSWERING: "answer(s)"}.get(
            cfg.task, "classification(s)"))


def predict(args) -> None:
    import jax
    import numpy as np

    from config import ConfigError
    from data.pairs import ended
    from models.generate import Sampling, beam_search, sample
    from pretrained import layout_for

    if args.image:
        return classify_images(args)
    prompts = read_prompts(args)
    check_output(args.output)
    layout = layout_for(args.mesh_shape, args.layout, ("--mesh-shape", "--layout"))
    cfg, graphdef, params, tokenizer = load_model(args, layout)
    if args.pair and cfg.task not in ("sequence_classification", QUESTION_ANSWERING):
        raise ConfigError(f"--pair: a {cfg.model} model trained for {cfg.task} reads single texts; a second text is "
                          "for a sequence classifier or a question-answering model's context")
    if cfg.task == QUESTION_ANSWERING and not args.pair:
        raise ConfigError(f"--pair: a {cfg.model} model trained for {cfg.task} answers each --prompt question from "
                          "a context; give it with --pair CONTEXT (one per prompt)")
    if cfg.task in (FILL_MASK, QUESTION_ANSWERING, *TEXT_CLASSIFIERS):
        from pretrained import Pretrained

        return classify_texts(args, prompts, Pretrained(cfg, graphdef, params, tokenizer, layout))
    flag = "--max-new-tokens"
    if args.max_new_tokens is None:  # no flag given: name where the number came from
        args.max_new_tokens = cfg.predict_max_steps or DEFAULT_NEW_TOKENS
        flag = "predict_max_steps (the config's default --max-new-tokens)" if cfg.predict_max_steps else \
            "the default --max-new-tokens"

    seq2seq = cfg.task == "seq2seq"
    length = cfg.generation_positions
    length_name = f"n_positions {length}" if length != cfg.n_ctx else f"n_ctx {length}"
    room = length if seq2seq else length - args.max_new_tokens  # T5: the prompt fills the encoder
    if room < 1:
        raise ConfigError(f"{flag} {args.max_new_tokens}: leaves no room for a prompt in the model's "
                          f"{length_name} (at most {length - 1})")
    encoded = []
    for i, text in enumerate(prompts):
        ids = tokenizer.encode(text) or [tokenizer.eos_id]
        if seq2seq and ids[-1] != tokenizer.eos_id:  # T5's encoder inputs end with end-of-text
            ids.append(tokenizer.eos_id)
        if len(ids) > room:
            if not args.truncate_prompt:
                limit, lower = (f"the encoder's n_ctx {cfg.n_ctx}", f", --set n_ctx={len(ids)} (relative "
                                f"positions read any length)") if seq2seq else \
                    (f"{length_name} with --max-new-tokens {args.max_new_tokens}", ", lower --max-new-tokens")
                raise ConfigError(f"prompt {i + 1} has {len(ids)} tokens; only {room} fit in {limit} (shorten it"
                                  f"{lower} or pass --truncate-prompt)")
            if seq2seq:  # the encoder reads the start, where T5's task prefix is, as training cut long inputs
                read = f"its first {room - 1} of {len(ids) - 1} tokens and end-of-text are read"
                ids = ended(ids, room, tokenizer.eos_id)[0]
            else:  # a decoder continues the prompt's end
                read = f"its last {room} of {len(ids)} tokens are read"
                ids = ids[-room:]
            print(f"note: prompt {i + 1}: {read} (--truncate-prompt)", file=sys.stderr)
            # what the model reads is what the output shows: the part kept, not the text given
            prompts[i] = tokenizer.decode(ids[:-1] if seq2seq and ids[-1] == tokenizer.eos_id else ids)
        encoded += [ids] * args.num_samples
    width = max(map(len, encoded))
    pad = np.array([width - len(ids) for ids in encoded], np.int32)
    batch = np.array([[tokenizer.eos_id] * p + ids for p, ids in zip(pad, encoded)], np.int32)  # left-padded

    settings = Sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, repetition_penalty=args.repetition_penalty, num_beams=args.num_beams,
                        length_penalty=args.length_penalty, eos_id=tokenizer.eos_id,
                        entmax=cfg.entmax_loss if args.entmax_sampling is None else args.entmax_sampling)
    stream = len(encoded) == 1 and args.num_beams == 1
    printer = Printer(tokenizer, len(encoded), args.stop, stream)
    if stream and not seq2seq:  # a decoder continues its prompt; T5's output stands alone
        sys.stdout.write(prompts[0])
        sys.stdout.flush()
    with layout.active():
        if args.num_beams > 1:
            out = beam_search(graphdef, params, batch, pad, settings)
        else:
            callback = printer if (stream or args.stop) else None
            out = sample(graphdef, params, batch, pad, settings, jax.random.key(args.seed), callback)
    out = np.asarray(jax.device_get(out))
    separator = "\n=== output ===\n" if seq2seq else ""  # T5's output stands apart from its prompt
    if stream:
        printer.finish()
        blocks = [f"=== prompt 1 ===\n{prompts[0]}{separator}{printer.text(0)}"]
    else:
        blocks = []
        for row, ids in enumerate(out):
            ids = list(ids)
            if tokenizer.eos_id in ids:
                ids = ids[:ids.index(tokenizer.eos_id)]
            printer.ids[row] = [i for i in ids if i != tokenizer.padding_id]  # as the streamed rows: never text
            prompt_index, sample_index = divmod(row, args.num_samples)
            header = f"=== prompt {prompt_index + 1}" + (
                f", sample {sample_index + 1}" if args.num_samples > 1 else "")
            blocks.append(f"{header} ===\n{prompts[prompt_index]}{separator}{printer.text(row)}")
            print(blocks[-1])
    if args.output:
        write_output(args.output, blocks, "generation(s)")


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())

"""``python -m convert import HF_DIR MODEL_PATH`` / ``python -m convert export MODEL_PATH HF_DIR``."""

from __future__ import annotations

import os
import sys

import convert


def main(argv=None) -> int:
    from neomesh.help import ArgumentParser, HelpFormatter

    command = os.path.basename(sys.argv[0])  # neomesh-hf when run as the installed command
    p = ArgumentParser(prog="python -m convert" if command.endswith(".py") else command,
                       description=convert.__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face model -> NeoMesh run directory", allow_abbrev=False,
                         formatter_class=HelpFormatter)
    imp.add_argument("hf_dir", metavar="HF_MODEL", help="a Hugging Face model directory, or ORG/NAME from the "
                     "local Hugging Face cache")
    imp.add_argument("model_path", help="the NeoMesh run directory to write")
    exp = sub.add_parser("export", help="NeoMesh run directory -> Hugging Face directory", allow_abbrev=False,
                         formatter_class=HelpFormatter)
    exp.add_argument("model_path", help="a NeoMesh run directory (its latest checkpoint is exported)")
    exp.add_argument("hf_dir", help="the directory to write (config.json, model.safetensors, tokenizer): new, "
                     "empty, or a previous export, which is replaced; never the run's init_from or tokenizer")
    exp.add_argument("--adapter", action="store_true", help="a LoRA run as a Hugging Face peft adapter directory "
                     "(adapter_config.json + adapter_model.safetensors, its base the run's init_from) rather than "
                     "the merged model; peft.PeftModel.from_pretrained(base, HF_DIR) loads it")
    args = p.parse_args(argv)

    from convert.hf import export_hf, import_hf
    from neomesh.errors import run_main

    def run():
        if args.command == "import":
            cfg = import_hf(args.hf_dir, args.model_path)
            print("\n".join(imported(cfg, args.hf_dir, args.model_path)))
        elif args.adapter:
            from convert.peft_adapter import base_name, export_adapter

            cfg = export_adapter(args.model_path, args.hf_dir)
            print(f"exported {args.model_path}'s LoRA ({cfg.model}) to {args.hf_dir} as a peft adapter of "
                  f"{base_name(cfg.init_from)}")
        else:
            cfg = export_hf(args.model_path, args.hf_dir)
            print(f"exported {args.model_path} ({cfg.model}) to {args.hf_dir}")

    # An export is staged: Ctrl-C leaves nothing half-done.
    return run_main(run, "interrupted" + (f"; {args.hf_dir} is as it was" if args.command == "export" else ""))


def imported(cfg, source: str, run: str) -> list[str]:
    """What an import says: a note when a text model came without a tokenizer (predict.py and eval.py read text
    with it), then what this family's run is good for."""
    from convert.hf_dir import has_tokenizer

    lines = []
    if cfg.reads_text and not has_tokenizer(os.path.join(run, "tokenizer")):
        lines.append(f"note: {source} has no tokenizer (tokenizer.json, vocab.json + merges.txt, vocab.txt or "
                     f"spiece.model); put the model's files in {run}/tokenizer/ before predict.py or eval.py")
    uses = []
    if cfg.task == "causal_lm" or (cfg.task == "seq2seq" and cfg.decoder_layers):
        uses.append(f"generate with predict.py --model-path {run}")
    if cfg.task == "image_classification":
        uses.append(f"classify images with predict.py --model-path {run} --image FILE_OR_FOLDER")
    if cfg.task in ("sequence_classification", "token_classification"):
        uses.append(f"label texts with predict.py --model-path {run} --prompt TEXT")
    if cfg.task == "question_answering":
        uses.append(f"answer questions with predict.py --model-path {run} --prompt QUESTION --pair CONTEXT")
    if cfg.task == "masked_lm":
        uses.append(f"fill masks with predict.py --model-path {run} --prompt TEXT_WITH_A_MASK")
    if cfg.task == "causal_lm":
        uses.append(f"score with eval.py --model-path {run}")
    data = "on data made with its tokenizer " if cfg.reads_text else ""
    uses.append(f"fine-tune {data}with train.py --config YOUR_CONFIG --model-path {run} (this run) or --init-from "
                f"{source} (a new one)")
    uses.append(f"export with python -m convert export {run} HF_DIR")
    lines.append(f"imported {cfg.model} ({cfg.n_layer} layers x {cfg.n_embd}) into {run}: " + "; ".join(uses))
    return lines


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())

"""``python -m convert import HF_DIR MODEL_PATH`` / ``python -m convert export MODEL_PATH HF_DIR``."""

from __future__ import annotations

import argparse
import os
import sys

import convert


def main(argv=None) -> int:
    from neomesh.help import HelpFormatter

    command = os.path.basename(sys.argv[0])  # neomesh-hf when run as the installed command
    p = argparse.ArgumentParser(prog="python -m convert" if command.endswith(".py") else command,
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
    exp.add_argument("hf_dir", help="the directory to write (config.json, model.safetensors, tokenizer)")
    args = p.parse_args(argv)

    from config import ConfigError
    from convert.hf import export_hf, import_hf

    try:
        if args.command == "import":
            cfg = import_hf(args.hf_dir, args.model_path)
            print(f"imported {cfg.model} ({cfg.n_layer} layers x {cfg.n_embd}) into {args.model_path}: generate "
                  f"with predict.py --model-path {args.model_path}; train on data with its tokenizer with train.py "
                  f"--config YOUR_CONFIG --model-path {args.model_path}")
        else:
            cfg = export_hf(args.model_path, args.hf_dir)
            print(f"exported {args.model_path} ({cfg.model}) to {args.hf_dir}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

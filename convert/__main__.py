"""``python -m convert import HF_DIR MODEL_PATH`` / ``python -m convert export MODEL_PATH HF_DIR``."""

from __future__ import annotations

import argparse

import convert


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m convert", description=convert.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="Hugging Face directory -> NeoMesh run directory", allow_abbrev=False)
    imp.add_argument("hf_dir")
    imp.add_argument("model_path")
    exp = sub.add_parser("export", help="NeoMesh run directory -> Hugging Face directory", allow_abbrev=False)
    exp.add_argument("model_path")
    exp.add_argument("hf_dir")
    args = p.parse_args(argv)

    from convert.hf import export_hf, import_hf
    from errors import run_main

    def run():
        if args.command == "import":
            cfg = import_hf(args.hf_dir, args.model_path)
            print(f"imported {cfg.model} ({cfg.n_layer} layers x {cfg.n_embd}) into {args.model_path}: generate "
                  f"with predict.py --model-path {args.model_path}; train on data with its tokenizer with train.py "
                  f"--config YOUR_CONFIG --model-path {args.model_path}")
        else:
            cfg = export_hf(args.model_path, args.hf_dir)
            print(f"exported {args.model_path} ({cfg.model}) to {args.hf_dir}")

    return run_main(run)


if __name__ == "__main__":
    from errors import exit_process

    exit_process(main())

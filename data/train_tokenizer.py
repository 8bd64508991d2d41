"""Train a byte-level BPE tokenizer: ``python data/train_tokenizer.py --output-dir DIR --vocab-size N``.

Reads ``.txt`` / ``.jsonl`` / ``.jsonl.zst`` files (``--input``, repeatable; default: the embedded corpus) and
writes ``DIR/tokenizer.json`` with ``<|endoftext|>`` and ``<|padding|>`` as special tokens.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere


def main(argv=None) -> int:
    from neomesh.help import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--input", nargs="+", default=["embedded"], metavar="PATH",
                   help="files, directories or globs; embedded is the corpus shipped with Python")
    p.add_argument("--output-dir", required=True, help="where tokenizer.json is written")
    p.add_argument("--vocab-size", type=int, required=True, help="tokens in all, special tokens included")
    p.add_argument("--min-frequency", type=int, default=2, help="pairs seen fewer times are not merged")
    args = p.parse_args(argv)
    from config import ConfigError
    from data.text_files import expand_inputs, read_documents
    from data.tokenizer import train_bpe

    try:
        files = expand_inputs(args.input)
        counts = {"documents": 0, "bytes": 0}

        def texts():
            for path in files:
                for text in read_documents(path):
                    counts["documents"] += 1
                    counts["bytes"] += len(text.encode("utf-8"))
                    yield text

        tok = train_bpe(texts(), args.vocab_size, args.min_frequency)
        os.makedirs(args.output_dir, exist_ok=True)
        out = os.path.join(args.output_dir, "tokenizer.json")
        tok.save(out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"trained on {counts['documents']} documents ({counts['bytes']:,} bytes) from {len(files)} files; "
          f"wrote {out} ({tok.vocab_size} tokens; <|endoftext|> = {tok.eos_id}, <|padding|> = {tok.padding_id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a byte-level BPE tokenizer: ``python data/train_tokenizer.py --output-dir DIR --vocab-size N``.

Reads ``.txt`` / ``.jsonl`` / ``.jsonl.zst`` files (``--input``, repeatable; default: the embedded corpus) and
writes ``DIR/tokenizer.json`` with ``<|endoftext|>`` and ``<|padding|>`` as special tokens.

GPT-Neo's flags work too: ``--base_dir DIR --file_type txt`` (the DIR/*.txt files; GPT-Neo's default type ``xz``,
lm_dataformat archives, is not read here) ``--output_dir --vocab_size``. GPT-Neo trained on a random 20% of the
files with NFKC normalisation and a prefix space; NeoMesh trains on every file and keeps text as it is, so that
decoding gives the text back exactly.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere


def main(argv=None) -> int:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--input", nargs="+", default=["embedded"], metavar="PATH",
                   help="files, directories or globs; embedded is the corpus shipped with Python")
    p.add_argument("--base_dir", metavar="DIR", help="GPT-Neo's input: the DIR/*.FILE_TYPE files")
    p.add_argument("--file_type", choices=("txt", "jsonl", "jsonl.zst", "xz"),
                   help="with --base_dir: which files (default: txt)")
    p.add_argument("--output-dir", "--output_dir", required=True, help="where tokenizer.json is written")
    p.add_argument("--vocab-size", "--vocab_size", type=int, required=True,
                   help="tokens in all, special tokens included")
    p.add_argument("--min-frequency", type=int, default=2, help="pairs seen fewer times are not merged")
    p.add_argument("--skip-bad-files", action="store_true", help="skip the rest of an input file that cannot be "
                   "decoded (invalid UTF-8, binary, corrupt or truncated .zst) and count it, instead of stopping")
    args = p.parse_args(argv)
    from config import ConfigError
    from data.text_files import SKIP_HINT, BadFile, expand_inputs, read_documents
    from data.tokenizer import short_of, train_bpe

    try:
        if args.min_frequency < 0:
            raise ConfigError(f"--min-frequency: {args.min_frequency} must be zero or more")
        if args.file_type and not args.base_dir:  # else the embedded corpus was read, the flag silently unused
            raise ConfigError(f"--file_type {args.file_type}: only with --base_dir DIR (GPT-Neo's input); --input "
                              "takes .txt, .jsonl and .jsonl.zst files, folders or globs as they are")
        args.file_type = args.file_type or "txt"
        if args.base_dir and args.file_type == "xz":
            raise ConfigError("--file_type xz: lm_dataformat archives are not read here; extract them to .txt or "
                              ".jsonl files and pass --file_type txt or jsonl")
        inputs = [os.path.join(args.base_dir, f"*.{args.file_type}")] if args.base_dir else args.input
        files = expand_inputs(inputs, "--base_dir" if args.base_dir else "--input")
        counts = {"documents": 0, "bytes": 0}
        bad: list[str] = []

        def texts():
            for path in files:
                try:
                    for text in read_documents(path, keep_blank=False):
                        counts["documents"] += 1
                        counts["bytes"] += len(text.encode("utf-8"))
                        yield text
                except BadFile as e:
                    if not args.skip_bad_files:
                        raise BadFile(f"{e}; {SKIP_HINT}") from None
                    bad.append(str(e))  # the documents read before the bad spot were used

        tok = train_bpe(texts(), args.vocab_size, args.min_frequency)
        if not counts["documents"] and bad:
            raise ConfigError(f"--input: no document read from {len(files)} file(s) ({len(bad)} bad; the first: "
                              f"{bad[0]})")
        if not counts["documents"]:  # empty files or texts (no document): refused as make_dataset.py refuses them
            given = f"--base_dir {args.base_dir}" if args.base_dir else f"--input {' '.join(inputs)}"
            raise ConfigError(f"{given}: no text to train on")
        os.makedirs(args.output_dir, exist_ok=True)
        out = os.path.join(args.output_dir, "tokenizer.json")
        tok.save(out)  # renamed into place when whole
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, as every command says it (outputs are published whole)
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # disk full, permissions, a file where the output directory should be
        print(f"error: {e.filename or args.output_dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    skipped = f"; skipped the rest of {len(bad)} bad file(s) ({bad[0]}{', ...' if len(bad) > 1 else ''})" \
        if bad else ""
    print(f"trained on {counts['documents']} documents ({counts['bytes']:,} bytes) from {len(files)} files; "
          f"wrote {out} ({tok.vocab_size} tokens; <|endoftext|> = {tok.eos_id}, <|padding|> = {tok.padding_id})"
          f"{skipped}")
    if tok.vocab_size < args.vocab_size:
        print(f"note: {short_of(tok.vocab_size, args.vocab_size, '--vocab-size', args.min_frequency)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

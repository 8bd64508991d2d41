"""The help formatter every NeoMesh command line uses (the module docstring keeps its line breaks, and each
option's help ends with its default when there is one worth showing), and the parser whose usage mistakes are
one line."""

from __future__ import annotations

import argparse
import difflib
import sys


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``RawDescriptionHelpFormatter`` plus ``(default: X)`` after every option whose default is a value (not
    None, False, an empty list, or already written in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or action.required or default is argparse.SUPPRESS or default is None \
                or default is False or (isinstance(default, list) and not default):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


# Other tools' flags a newcomer brings along, and NeoMesh's flag for the same thing (where the command has it).
FOREIGN_FLAGS = {"--model_name_or_path": ("--init-from", "--hf-model"), "--output_dir": ("--model-path",)}

# GPT-Neo's main.py flags that have no NeoMesh flag of the same name, and what a migrating user does instead.
GPT_NEO_FLAGS = {
    "--tpu": "JAX finds the TPU itself; run train.py on the TPU VM (on a pod, on every host with --distributed)",
    "--gpu_ids": "JAX uses every GPU it sees; choose them with CUDA_VISIBLE_DEVICES",
    "--predict": "python predict.py --model-path DIR --prompt-from-file FILE samples a run",
    "--prompt": "python predict.py --model-path DIR --prompt-from-file FILE (or --prompt TEXT) samples a run",
    "--entmax_sampling": "python predict.py --model-path DIR --entmax-sampling ... samples a run from entmax",
    "--sacred_id": "NeoMesh has no Sacred; each run writes metrics.jsonl and TensorBoard events in its model_path",
    "--export": "python -m convert export RUN_DIR HF_DIR writes a run as a Hugging Face model",
    "--auto_layout": "--set layout=auto",
    "--auto_layout_and_mesh_shape": "--set mesh_shape=auto layout=auto",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with a usage mistake as one line, ``error: PROG: MESSAGE; did you mean --X? (PROG --help
    lists the options)``, instead of the usage block and a second line: an unknown flag gets the command's closest
    one, in either spelling (``--model_path`` -> ``--model-path``), or its counterpart of another tool's
    (Hugging Face's ``--model_name_or_path`` -> ``--init-from``; GPT-Neo's ``--predict`` -> predict.py), also where
    argparse would first say that a required option is missing (``--promt x``: ``--prompt`` is). Subcommands'
    parsers are of this class too."""

    def add_set_option(self, what: str = "override a key of the model's config, a run's or a Hugging Face model's; "
                       "keys that keep its parameters' shapes, such as precision=bfloat16") -> None:
        """``--set KEY=VALUE ...``: config keys ``what`` says, repeatable, several after one ``--set``."""
        self.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                          help=f"{what} (repeatable, and several may follow one --set)")

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        hint = ""
        unknown = [a.split("=", 1)[0] for a in getattr(self, "given", ())
                   if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions]
        if "required" in message and unknown:  # a misspelt required option is why it is missing
            message = f"unrecognized arguments: {' '.join(unknown)}"
        if message.startswith("unrecognized arguments: "):
            flag = next((a.split("=", 1)[0] for a in message.split(": ", 1)[1].split() if a.startswith("-")), None)
            if flag in GPT_NEO_FLAGS:
                hint = f"; GPT-Neo's {flag}: {GPT_NEO_FLAGS[flag]}"
            elif flag:
                close = self.closest_option(flag) or self.config_key_flag(flag)
                hint = f"; did you mean {close}?" if close else ""
        self.exit(2, f"error: {self.prog}: {message}{hint} ({self.prog} --help lists the options)\n")

    def config_key_flag(self, flag: str) -> str | None:
        """``--set KEY=VALUE`` for a flag that names a config key (``--train_steps 10``, GPT-Neo's
        ``--steps_per_checkpoint``, Hugging Face's ``--save_steps``), where the command takes ``--set``; else None."""
        from config import ALIASES, FOREIGN_KEYS, KNOWN_KEYS

        key = flag.lstrip("-").replace("-", "_")
        key = FOREIGN_KEYS.get(key, key)  # Hugging Face's --save_steps, --learning_rate, ...
        if "--set" not in self._option_string_actions or key not in (*KNOWN_KEYS, *ALIASES):
            return None
        given = getattr(self, "given", [])
        at = next((i for i, a in enumerate(given) if a.split("=", 1)[0] == flag), len(given))
        spelt = given[at:at + 2]  # --lr=3e-4, or --lr and what follows it
        value = spelt[0].split("=", 1)[1] if spelt and "=" in spelt[0] else spelt[1] if len(spelt) == 2 else ""
        return f"--set {key}={value if value and not value.startswith('--') else 'VALUE'}"

    def closest_option(self, flag: str) -> str | None:
        options = [o for o in self._option_string_actions if o.startswith("--")]
        for candidate in (flag.replace("_", "-"), *FOREIGN_FLAGS.get(flag, ())):
            if candidate in options:
                return candidate
        close = difflib.get_close_matches(flag.replace("_", "-"), options, n=1, cutoff=0.7)
        return close[0] if close else None

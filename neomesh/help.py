"""The help formatter every NeoMesh command line uses: the module docstring keeps its line breaks, and each
option's help ends with its default when there is one worth showing."""

from __future__ import annotations

import argparse


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

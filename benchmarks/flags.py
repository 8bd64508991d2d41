"""The benchmark scripts' shared flag checks: a mistake is one line naming the flag (``ConfigError``), before jax
or torch starts."""

from __future__ import annotations

from config import ConfigError


def at_least_one(args, *flags: str) -> None:
    """Each count in ``flags`` (argparse names) is 1 or more."""
    for flag in flags:
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}: {getattr(args, flag)} is below the minimum 1")


def heads_divide_width(args) -> None:
    if args.width % args.heads:
        raise ConfigError(f"--heads: --width {args.width} is not divisible by {args.heads} heads")


def failure(e: BaseException) -> str:
    """A peer's exception as a table cell: its type and the first line of its message."""
    first = (str(e).strip().splitlines() or [""])[0][:120]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__

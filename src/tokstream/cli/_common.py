"""What every command shares: the program name, the two expected failures, the argument types.

A handler raises :class:`UsageError` for arguments that do not go together and
:class:`CommandError` (or TypeError/ValueError/OSError from the library) for expected failures;
:func:`tokstream.cli.main` alone decides what reaches stdout and stderr and the exit code.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from tokstream import _validate

PROG = "tokstream"


class UsageError(Exception):
    """A command's arguments do not go together: printed with the usage, exit code 2."""


class CommandError(Exception):
    """An expected failure of a command: printed as one line, exit code 1."""


# ---------------------------------------------------------------------------------------------
# Argument types (an ArgumentTypeError becomes a usage error, exit code 2)


def positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_list(text: str) -> list[int]:
    return [positive(part.strip()) for part in text.split(",")]


def name_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",")]
        for name in names:
            if name not in allowed:
                raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(allowed)}")
        return list(dict.fromkeys(names))

    return parse


def dtype_name(text: str) -> str:
    try:
        dtype = _validate.integer_dtype(text, "dtype")
    except TypeError:
        raise argparse.ArgumentTypeError(f"expected an integer dtype, got {text!r}") from None
    # The name drops the byte order: ">u2" must not come back as the native "uint16".
    return str(dtype.name if dtype.isnative else dtype.str)

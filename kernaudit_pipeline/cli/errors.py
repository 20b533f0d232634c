"""How every subcommand fails: one line on stderr and a non-zero exit, never a traceback.

A subcommand raises :class:`UserError` for anything the user can fix (a bad file, a bad
option, a missing approval). :func:`one_line` squeezes any message to a single line, so a
multi-line exception text never reaches the terminal as a block.
"""

from __future__ import annotations

EXIT_USAGE = 2      # bad input or options: the user can fix it
EXIT_FAILURE = 1    # the command ran and failed (a failed audit, an internal error)


class UserError(Exception):
    """A one-line reason the command could not do what was asked; exit code 2 by default."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(one_line(message))
        self.exit_code = exit_code


def one_line(message: object, limit: int = 500) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The project's user-error types: bad input (config, data files, checkpoints, missing tools).

`python -m compassplay_jax.main` prints these as one line (`error: ...`, exit status 2); every other
exception is a bug or an environment failure and keeps its traceback. Each concrete error also
derives from the builtin it replaces (ValueError, FileNotFoundError, ...), so callers that catch
those keep working.
"""
from __future__ import annotations


class UserError(Exception):
  """Bad input the user can fix; the message names the thing (a config key, a file, a tool)."""


class InputNotFound(UserError, FileNotFoundError):
  """A file or directory the config names does not exist."""


class InputFormatError(UserError, ValueError):
  """A file the config names exists but its contents are not what is expected."""


def user_error_line(error: BaseException) -> str | None:
  """"error: <first line>" for the project's user-error types; None for anything else, which is a bug
  or an environment failure and keeps its traceback."""
  if not isinstance(error, UserError):
    return None
  first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  hint = " Setup steps: docs/lean.md." if type(error).__name__ == "LeanSetupError" else ""
  return f"error: {first_line}{hint}"

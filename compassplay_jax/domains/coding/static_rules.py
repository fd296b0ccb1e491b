"""Static rules that keep a program away from the interpreter's internals and any capability.

The rules themselves live with the sandbox (`verifiers/sandbox_rules.py`), because the job process
applies them to the exact tree it compiles; this module gives the same reasons in the trainer,
before a job is sent, for proposals (validation) and induction answers (checking):

- imports only from an allow-list of modules and of names per module (`ALLOWED_MODULES`), so that
  a module an allowed one imports (`typing.sys`, `dataclasses.inspect`) is not there;
- builtins only from an allow-list (`ALLOWED_BUILTINS`: no `open`, `getattr`, `vars`, `eval`, ...);
- no attribute whose name starts with "_" or with a frame/code prefix (`f_back`, `gi_frame`,
  `tb_frame`, `co_consts`), no attribute assignment, no dunder names, no `match` statement (class
  patterns read attributes by name), no dunder text or `{0._x}` format field in a string.

Nothing here executes code; `unsafe_reason(tree)` walks an already parsed AST.
"""
import ast
from typing import Optional

from compassplay_jax.verifiers import sandbox_rules

ALLOWED_MODULES = sandbox_rules.ALLOWED_MODULES
ALLOWED_BUILTINS = sandbox_rules.ALLOWED_BUILTINS
BANNED_NAMES = sandbox_rules.BANNED_NAMES
BANNED_ATTRS = sandbox_rules.BANNED_ATTRS


def unsafe_reason(tree: ast.AST) -> Optional[str]:
  """Why the program could reach interpreter internals or a capability; None when it cannot."""
  return sandbox_rules.program_reason(tree)

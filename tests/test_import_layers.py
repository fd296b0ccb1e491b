"""Imports point one way: loops -> domains / evals -> engine -> rewards / rl / sampling -> sharding -> models.

Read from the source with ast (imports inside functions count too), so a wrong-way import fails here
even where it would not create an import cycle.
"""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "compassplay_jax"

# module or package (relative to compassplay_jax) -> top-level parts it must not import
FORBIDDEN = {
    "models": {"selfplay", "domains", "evals", "sharding", "engine", "rewards", "rl", "sampling", "verifiers"},
    "sharding.py": {"selfplay", "domains", "evals", "rl", "rewards", "sampling", "engine", "verifiers"},
    "microbatch.py": {"selfplay", "domains", "evals", "rl", "rewards", "sampling", "engine", "models"},
    "rewards": {"selfplay", "domains", "evals", "engine", "verifiers"},
    "rl": {"selfplay", "domains", "evals", "engine", "verifiers"},
    "sampling": {"selfplay", "domains", "evals", "engine", "verifiers"},
    "engine.py": {"selfplay", "domains", "evals", "verifiers"},
    "lean_syntax": {"selfplay", "domains", "evals", "verifiers", "rewards"},
    "verifiers": {"selfplay", "domains", "evals"},
    "config_base.py": {"selfplay", "domains", "evals"},
    "errors.py": {"*"},
    "jsonl.py": {"selfplay", "domains", "evals", "rl", "rewards", "sampling", "engine", "models", "sharding"},
    "model_setup.py": {"selfplay", "domains", "evals"},
    "evaluate.py": {"selfplay"},
}


def imported_parts(path: pathlib.Path) -> set[str]:
  """compassplay_jax.<part> for every import in the file (absolute imports only; the package uses no others)."""
  parts = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      assert node.level == 0, f"{path}: relative import"
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
      bits = name.split(".")
      if bits[0] == "compassplay_jax" and len(bits) > 1:
        parts.add(bits[1])
  return parts


def files_of(place: str) -> list[pathlib.Path]:
  target = PACKAGE / place
  return sorted(target.rglob("*.py")) if target.is_dir() else [target]


@pytest.mark.parametrize("place", sorted(FORBIDDEN))
def test_no_wrong_way_imports(place):
  files = files_of(place)
  assert files and all(f.exists() for f in files), place
  bad = []
  for f in files:
    own = place.removesuffix(".py")
    found = imported_parts(f) - {own}
    hit = found if FORBIDDEN[place] == {"*"} else found & FORBIDDEN[place]
    bad += [f"{f.relative_to(PACKAGE)} imports compassplay_jax.{p}" for p in sorted(hit)]
  assert not bad, "\n".join(bad)


def test_the_checker_sees_imports_inside_functions(tmp_path):
  f = tmp_path / "m.py"
  f.write_text("def g():\n  from compassplay_jax.selfplay import run\n  import compassplay_jax.domains.lean\n")
  assert imported_parts(f) == {"selfplay", "domains"}

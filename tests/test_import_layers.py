"""Imports point one way: down the layers below, every top-level part of the package in one of them (a
new part without a layer fails `test_every_top_level_part_has_a_layer`); and no two modules import
each other.

Read from the source with ast (imports inside functions count too), so a wrong-way import fails here
even where it would not create an import cycle. docs/architecture.md draws the same table.
"""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "compassplay_jax"


def top_level_parts(root: pathlib.Path = PACKAGE) -> set[str]:
  """Every top-level part: its folders and modules; each built-in setting (settings/<name>/) is a part of
  its own, and `settings` is the registry (settings/__init__.py) they register with."""
  parts = {p.name.removesuffix(".py") for p in root.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
  settings = root / "settings"
  if settings.is_dir():
    parts |= {f"settings/{p.name}" for p in settings.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
  return parts


PARTS = top_level_parts()

# Top to bottom: a part may import the parts of the layers below its own, never one above and never
# another part of its own layer.
LAYERS = [
    ("entry points: the main command, the other commands, the models of cost", {"main", "cli", "costs"}),
    ("reports over runs' outputs", {"reports"}),
    ("the settings, one package each, found by name", {"settings/coding", "settings/lean"}),
    ("the self-play loop: step, session, run, the run's data files", {"selfplay"}),
    ("evaluation on benchmarks", {"evals"}),
    ("the domains' task libraries", {"domains"}),
    ("verifiers: the Python sandbox, the Lean checkers", {"verifiers"}),
    ("what a run is built from: base config, model setup, the engine", {"runtime"}),
    ("device math: rewards, RL, sampling", {"rewards", "rl", "sampling"}),
    ("the setting registry (settings/__init__.py)", {"settings"}),
    ("Lean syntax", {"lean_syntax"}),
    ("infrastructure: sharding, processes, checkpoints, compiles, metrics, profiling", {"infra"}),
    ("models: configs, decoder, loading", {"models"}),
    ("the data directory, pinned sources, fetch", {"data"}),
    ("core: errors, JSON lines", {"core"}),
]
LAYER_OF = {part: i for i, (_, members) in enumerate(LAYERS) for part in members}

# Command-line entry points (`python -m ...`): nothing in the package imports them.
ENTRY_POINTS = ("main", "cli")


def unlayered(root: pathlib.Path = PACKAGE) -> set[str]:
  """Top-level parts under `root` that no layer names."""
  return top_level_parts(root) - set(LAYER_OF)


def test_every_top_level_part_has_a_layer(tmp_path):
  assert unlayered() == set(), "give these parts a layer in LAYERS"
  assert set(LAYER_OF) == PARTS, f"layers name parts that do not exist: {set(LAYER_OF) - PARTS}"
  # A new part without a layer is caught: a module, a folder, a setting.
  for name in ("main.py", "new_module.py", "newpkg/__init__.py", "settings/__init__.py", "settings/maths/__init__.py"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("")
  assert unlayered(tmp_path) == {"new_module", "newpkg", "settings/maths"}


def _imported_names(tree: ast.AST, path) -> list[str]:
  """Dotted names of every import in the tree, `from a import b` giving both a and a.b."""
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      assert node.level == 0, f"{path}: relative import"
      names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
  return names


def part_of_name(name: str) -> str | None:
  """The top-level part a dotted compassplay_jax name belongs to (settings.<name> is its own part)."""
  bits = name.split(".")
  if bits[0] != "compassplay_jax" or len(bits) < 2:
    return None
  if bits[1] == "settings" and len(bits) > 2 and (PACKAGE / "settings" / bits[2]).is_dir():
    return f"settings/{bits[2]}"
  return bits[1]


def imported_parts(path: pathlib.Path) -> set[str]:
  """compassplay_jax.<part> for every import in the file (absolute imports only; the package uses no others)."""
  names = _imported_names(ast.parse(path.read_text(), str(path)), path)
  return {part for part in map(part_of_name, names) if part}


def part_of_file(path: pathlib.Path) -> str:
  rel = path.relative_to(PACKAGE).parts
  if rel[0] == "settings" and len(rel) > 2:
    return f"settings/{rel[1]}"
  return rel[0].removesuffix(".py")


def files_of(part: str) -> list[pathlib.Path]:
  if part == "settings":
    return [PACKAGE / "settings" / "__init__.py"]
  target = PACKAGE / part
  return sorted(target.rglob("*.py")) if target.is_dir() else [PACKAGE / f"{part}.py"]


@pytest.mark.parametrize("part", sorted(PARTS))
def test_imports_point_down(part):
  files = files_of(part)
  assert files and all(f.exists() for f in files), part
  own = LAYER_OF[part]
  bad = [f"{f.relative_to(PACKAGE)} imports compassplay_jax.{p.replace('/', '.')} "
         f"({LAYERS[LAYER_OF[p]][0]}, from {LAYERS[own][0]})"
         for f in files for p in sorted(imported_parts(f) - {part}) if LAYER_OF.get(p, -1) <= own]
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_nothing_in_the_package_imports_an_entry_point(entry):
  importers = sorted(m for m, targets in import_graph().items()
                     if any(t == f"compassplay_jax.{entry}" or t.startswith(f"compassplay_jax.{entry}.") for t in targets)
                     and not (m == f"compassplay_jax.{entry}" or m.startswith(f"compassplay_jax.{entry}.")))
  assert importers == [], f"compassplay_jax.{entry} is an entry point, but {importers} import it"


# What runs any registered setting: none imports a built-in setting's package or compares
# config.setting with a name; they ask the registry (compassplay_jax/settings).
SETTING_BLIND = ("selfplay", "reports", "runtime", "main", "cli")


@pytest.mark.parametrize("place", SETTING_BLIND)
def test_the_loop_and_the_reports_name_no_setting(place):
  from compassplay_jax import settings
  bad = []
  for f in files_of(place):
    tree = ast.parse(f.read_text(), str(f))
    for name in _imported_names(tree, f):
      bits = name.split(".")
      if bits[:2] == ["compassplay_jax", "settings"] and len(bits) > 2 and bits[2] in settings.builtin_names():
        bad.append(f"{f.relative_to(PACKAGE)} imports {name}")
    for node in ast.walk(tree):
      if isinstance(node, ast.Compare) and any(isinstance(x, ast.Attribute) and x.attr == "setting"
                                               for x in (node.left, *node.comparators)):
        bad.append(f"{f.relative_to(PACKAGE)}:{node.lineno} compares .setting")
  assert not bad, "\n".join(bad)


def test_the_checker_sees_imports_inside_functions(tmp_path):
  f = tmp_path / "m.py"
  f.write_text("def g():\n  from compassplay_jax.selfplay import run\n  import compassplay_jax.domains.lean\n")
  assert imported_parts(f) == {"selfplay", "domains"}
  f.write_text("from compassplay_jax.settings import coding, get\nimport compassplay_jax.settings.lean.setting\n")
  assert imported_parts(f) == {"settings", "settings/coding", "settings/lean"}


# ---- import cycles ---------------------------------------------------------------------------------------

def module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
  parts = list(path.relative_to(root.parent).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
  """{module: the package's modules it imports}. `from a import b` is an edge to a.b when that is a
  module, else to a."""
  files = {module_name(f, root): f for f in root.rglob("*.py")}
  graph = {}
  for module, path in files.items():
    tree = ast.parse(path.read_text(), str(path))
    targets = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets |= {a.name for a in node.names if a.name in files}
      elif isinstance(node, ast.ImportFrom) and node.module:
        for a in node.names:
          full = f"{node.module}.{a.name}"
          if full in files:
            targets.add(full)
          elif node.module in files:
            targets.add(node.module)
    graph[module] = targets - {module}
  return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
  """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, groups = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, edges = work[-1]
      child = next(edges, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph.get(child, ())))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        group = set()
        while True:
          member = stack.pop()
          on_stack.discard(member)
          group.add(member)
          if member == node:
            break
        if len(group) > 1:
          groups.append(group)
  return groups


def test_no_import_cycles_between_modules():
  cycles = import_cycles(import_graph())
  report = "\n".join("  " + " <-> ".join(sorted(c)) for c in cycles)
  assert not cycles, f"import cycles:\n{report}"


# The four circles issue 24 removed, each as the import that closed it (module -> what it imported).
_OLD_CIRCLES = [
    ("data/checks.py", "compassplay_jax.data.fetch", "data/fetch.py", "compassplay_jax.data.checks"),
    ("data/paths.py", "compassplay_jax.evals.benchmarks", "evals/benchmarks.py", "compassplay_jax.data.paths"),
    ("sampling/continuous.py", "compassplay_jax.sampling.factory", "sampling/factory.py",
     "compassplay_jax.sampling.continuous"),
    ("selfplay/session.py", "compassplay_jax.selfplay.run", "selfplay/run.py", "compassplay_jax.selfplay.session"),
]


@pytest.mark.parametrize("a,a_imports,b,b_imports", _OLD_CIRCLES, ids=["data", "paths-evals", "sampling", "run"])
def test_putting_an_old_circle_back_fails_the_layer_or_cycle_check(tmp_path, a, a_imports, b, b_imports):
  """A copy of the package with one old circle restored (a function-level import in each module) is
  caught: by the cycle finder, and where the circle crosses layers also by FORBIDDEN."""
  import shutil
  copy = tmp_path / "compassplay_jax"
  shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.jsonl", "*.md"))
  for name, target in ((a, a_imports), (b, b_imports)):
    path = copy / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
      (path.parent / "__init__.py").touch()
      path.write_text("")
    path.write_text(path.read_text() + f"\n\ndef _circle():\n  import {target}\n")
  cycles = import_cycles(import_graph(copy))
  wanted = {"compassplay_jax." + a.removesuffix(".py").replace("/", "."),
            "compassplay_jax." + b.removesuffix(".py").replace("/", ".")}
  assert any(wanted <= c for c in cycles), cycles


def test_the_cycle_finder_finds_cycles_through_function_level_imports(tmp_path):
  pkg = tmp_path / "compassplay_jax"
  (pkg / "sub").mkdir(parents=True)
  for f in ("__init__.py", "sub/__init__.py"):
    (pkg / f).write_text("")
  (pkg / "a.py").write_text("from compassplay_jax.sub import b\n")
  (pkg / "sub" / "b.py").write_text("def g():\n  import compassplay_jax.c\n")
  (pkg / "c.py").write_text("from compassplay_jax import a\n")
  (pkg / "d.py").write_text("from compassplay_jax.a import something\n")  # a name in a, not a module: edge to a
  graph = import_graph(pkg)
  assert graph["compassplay_jax.d"] == {"compassplay_jax.a"}
  assert import_cycles(graph) == [{"compassplay_jax.a", "compassplay_jax.sub.b", "compassplay_jax.c"}]

"""Imports point one way: loops -> domains / evals -> engine -> rewards / rl / sampling -> sharding -> models,
with data/ (the data directory, pinned sources, fetch) at the bottom; and no two modules import each other.

Read from the source with ast (imports inside functions count too), so a wrong-way import fails here
even where it would not create an import cycle.
"""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "compassplay_jax"
# Every top-level part of the package: its folders and its modules.
PARTS = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
         if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}


def everything_but(*allowed: str) -> set[str]:
  return PARTS - set(allowed)


# Modules above the domains and the evaluation: the loops, the entry points, the run-level data check.
_ABOVE_DOMAINS = {"selfplay", "settings", "engine", "rl", "sampling", "rewards", "models", "sharding", "microbatch", "reports",
                  "data_checks", "main", "evaluate", "sweep", "report", "model_setup", "memory_report", "checkpoint"}

# module or package (relative to compassplay_jax) -> top-level parts it must not import
FORBIDDEN = {
    "models": {"selfplay", "settings", "domains", "evals", "sharding", "engine", "rewards", "rl", "sampling",
               "verifiers"},
    "sharding.py": {"selfplay", "settings", "domains", "evals", "rl", "rewards", "sampling", "engine", "verifiers"},
    "microbatch.py": {"selfplay", "settings", "domains", "evals", "rl", "rewards", "sampling", "engine", "models"},
    "rewards": {"selfplay", "settings", "domains", "evals", "engine", "verifiers"},
    "rl": {"selfplay", "settings", "domains", "evals", "engine", "verifiers"},
    "sampling": {"selfplay", "settings", "domains", "evals", "engine", "verifiers"},
    "engine.py": {"selfplay", "settings", "domains", "evals", "verifiers"},
    "lean_syntax": {"selfplay", "settings", "domains", "evals", "verifiers", "rewards"},
    "verifiers": {"selfplay", "settings", "domains", "evals"},
    "config_base.py": {"selfplay", "domains", "evals"},
    "errors.py": {"*"},
    "gc_policy.py": {"*"},
    "tensorboard_events.py": {"*"},
    "preemption.py": {"*"},  # the run loop's SIGTERM flag and multi-process sync point: jax only
    "profiling.py": {"selfplay", "domains", "evals", "engine", "rl", "rewards", "sampling", "verifiers", "sharding"},
    "jsonl.py": {"selfplay", "domains", "evals", "rl", "rewards", "sampling", "engine", "models", "sharding"},
    "model_setup.py": {"selfplay", "domains", "evals"},
    "evaluate.py": {"selfplay"},
    # The bottom layer: the data directory, pinned sources, converters and the fetch know no loader, config
    # or setting (which files a run needs and how to read them back is data_checks.py's job).
    "data": everything_but("data", "errors", "jsonl"),
    "evals": _ABOVE_DOMAINS,
    "domains": _ABOVE_DOMAINS | {"evals"},
    # The loops and the settings they run: below the entry points only.
    "selfplay": {"main", "evaluate", "sweep", "report", "memory_report"},
    "settings": {"main", "evaluate", "sweep", "report", "memory_report"},
}

# What runs any registered setting: none imports a built-in setting's package or compares
# config.setting with a name; they ask the registry (compassplay_jax/settings).
SETTING_BLIND = ("selfplay", "reports", "data_checks.py", "config_base.py", "main.py", "report.py", "sweep.py")

# Command-line entry points (`python -m ...`) that nothing imports: exempt from their folder's rule, held
# to their own. data/__main__.py hands the loaders (data_checks.read_back) to the fetch.
ENTRY_POINTS = {
    "data/__main__.py": everything_but("data", "errors", "jsonl", "data_checks"),
}



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


def imported_parts(path: pathlib.Path) -> set[str]:
  """compassplay_jax.<part> for every import in the file (absolute imports only; the package uses no others)."""
  parts = set()
  for name in _imported_names(ast.parse(path.read_text(), str(path)), path):
    bits = name.split(".")
    if bits[0] == "compassplay_jax" and len(bits) > 1:
      parts.add(bits[1])
  return parts


def files_of(place: str) -> list[pathlib.Path]:
  target = PACKAGE / place
  files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
  return [f for f in files if str(f.relative_to(PACKAGE)) not in ENTRY_POINTS]


def _violations(place: str, files, forbidden) -> list[str]:
  bad = []
  own = place.split("/")[0].removesuffix(".py")
  for f in files:
    found = imported_parts(f) - {own}
    hit = found if forbidden == {"*"} else found & forbidden
    bad += [f"{f.relative_to(PACKAGE)} imports compassplay_jax.{p}" for p in sorted(hit)]
  return bad


@pytest.mark.parametrize("place", sorted(FORBIDDEN))
def test_no_wrong_way_imports(place):
  files = files_of(place)
  assert files and all(f.exists() for f in files), place
  bad = _violations(place, files, FORBIDDEN[place])
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_points_import_only_what_they_may_and_nothing_imports_them(entry):
  path = PACKAGE / entry
  bad = _violations(entry, [path], ENTRY_POINTS[entry])
  assert not bad, "\n".join(bad)
  module = "compassplay_jax." + entry.removesuffix(".py").replace("/", ".")
  importers = sorted(m for m, targets in import_graph().items() if module in targets)
  assert importers == [], f"{module} is an entry point, but {importers} import it"


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
    ("sampling/continuous.py", "compassplay_jax.sampling.engine", "sampling/engine.py",
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

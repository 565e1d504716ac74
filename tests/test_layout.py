"""The package reads as a map: layers import only downward, with no cycle and no lazy own
imports, and the tasks' names are written only in tasks/."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer_jax"

# Layer -> the layers it must not import. ("" is a top-level module such as sharding.py.)
FORBIDDEN = {
    "model": {"training", "data", "decode", "tasks", "hardware", "cli"},
    "data": {"model", "training", "decode", "tasks", "hardware", "cli"},
    "decode": {"training", "tasks", "hardware", "cli"},
    "training": {"tasks", "hardware", "cli"},  # The trainer knows no task.
    "metrics": {"model", "training", "data", "decode", "tasks", "hardware", "cli"},
    "tasks": {"hardware", "cli"},
    "interop": {"hardware", "cli"},
    "hardware": {"cli"},  # Compiling a task's programs for a target: above tasks.
}
LAYERS = {"model", "data", "decode", "training", "tasks", "metrics", "interop", "hardware", "cli"}
# Top-level modules. The foundation every layer may import, importing no layer itself; and
# configs.py, the experiment config, which knows the tasks (each validates its own keys) and
# which only the commands, interop and hardware read.
FOUNDATION = {"errors", "special_tokens", "sharding"}
FORBIDDEN["foundation"] = LAYERS | {"configs"}
FORBIDDEN["configs"] = {"interop", "hardware", "cli"}
for _below in ("model", "data", "decode", "training", "tasks", "metrics"):
  FORBIDDEN[_below] = FORBIDDEN[_below] | {"configs"}
LIBRARY_LAYERS = LAYERS - {"cli"} | {"foundation", "configs"}
# `python -m transformer_jax.<command>`: two-line entry points into cli/, part of that layer.
COMMANDS = {"train", "translate", "evaluate", "average_checkpoints", "model_info", "generate",
            "import_marian", "import_hf", "export", "precompile"}
OUTSIDE_PACKAGE = ("experiments", "benchmarks", "tests")


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = list(path.relative_to(root.parent).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def layer(module: str) -> str:
  """'transformer_jax.model.layers' -> 'model'; a top-level module such as sharding -> ''."""
  parts = module.split(".")[1:]
  if not parts:
    return ""
  if parts[0] in LAYERS:
    return parts[0]
  if parts[0] in COMMANDS:
    return "cli"
  if parts[0] in FOUNDATION:
    return "foundation"
  return parts[0]  # "configs", or a module no rule names (`test_every_module_has_a_layer`).


def _is_module(root: pathlib.Path, dotted: str) -> bool:
  path = root.parent / dotted.replace(".", "/")
  return path.with_suffix(".py").exists() or path.is_dir()


def imports(path: pathlib.Path, root: pathlib.Path) -> list[tuple[str, int, bool, bool]]:
  """(imported module, line, at module top?, a comment on that line or the one above?)."""
  source = path.read_text()
  lines = source.splitlines()
  found = []

  def visit(node: ast.AST, top: bool) -> None:
    for child in ast.iter_child_nodes(node):
      nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        commented = "#" in lines[child.lineno - 1] or (
            child.lineno > 1 and lines[child.lineno - 2].strip().startswith("#"))
        if isinstance(child, ast.Import):
          names = [alias.name for alias in child.names]
        elif child.level:  # A relative import: resolve it against this module.
          base = module_name(path, root).split(".")[: -child.level or None]
          names = [".".join(base + ([child.module] if child.module else []))]
        else:
          # `from transformer_jax.decode import search` imports the module transformer_jax.decode.search.
          submodules = [f"{child.module}.{alias.name}" for alias in child.names
                        if _is_module(root, f"{child.module}.{alias.name}")]
          names = submodules or [child.module]
        for name in names:
          found.append((name, child.lineno, top, commented))
      visit(child, top and not nested)

  visit(ast.parse(source), True)
  return found


def check_package(root: pathlib.Path) -> list[str]:
  """Every violation of the layering rules in the package at `root`, one line each."""
  package = root.name
  problems = []
  graph: dict[str, set[str]] = {}
  for path in sorted(root.rglob("*.py")):
    module = module_name(path, root)
    graph.setdefault(module, set())
    for imported, line, top, commented in imports(path, root):
      where = f"{path.relative_to(root.parent)}:{line}"
      if imported.split(".")[0] in OUTSIDE_PACKAGE:
        problems.append(f"{where} imports {imported}: the package never imports {imported.split('.')[0]}/")
        continue
      if imported.split(".")[0] != package:
        if not top and not commented:
          problems.append(f"{where} imports {imported} inside a function without a comment saying why")
        continue
      if not top:
        problems.append(f"{where} imports {imported} inside a function: the package's own imports "
                        "stand at module top")
      if imported == package:
        continue
      graph[module].add(imported)
      source_layer, target_layer = layer(module), layer(imported)
      if target_layer in FORBIDDEN.get(source_layer, ()):
        problems.append(f"{where}: {source_layer}/ imports {imported} ({target_layer}/)")
      if target_layer == "cli" and source_layer in LIBRARY_LAYERS:
        problems.append(f"{where}: library module {module} imports the command line {imported}")
  problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in find_cycles(graph)]
  return problems


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle per strongly connected group of modules that import each other."""
  cycles, state = [], {}

  def walk(module: str, stack: list[str]) -> None:
    state[module] = "open"
    for target in sorted(graph.get(module, ())):
      if state.get(target) == "open":
        cycles.append(stack[stack.index(target):] + [target])
      elif target not in state:
        walk(target, stack + [target])
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      walk(module, [module])
  return cycles


def test_the_package_keeps_its_layering_rules():
  problems = check_package(PACKAGE)
  assert not problems, "\n".join(problems)


def _fake_package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  root = tmp_path / "transformer_jax"
  for name, text in {"__init__.py": "", "model/__init__.py": "", "training/__init__.py": "",
                     **files}.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  return root


@pytest.mark.parametrize("files, expected", [
    ({"model/layers.py": "from transformer_jax.training import loop\n", "training/loop.py": ""},
     "model/ imports transformer_jax.training.loop (training/)"),
    ({"training/loop.py": "from transformer_jax.training import step\n",
      "training/step.py": "import transformer_jax.training.loop\n"},
     "import cycle: transformer_jax.training.loop -> transformer_jax.training.step -> "
     "transformer_jax.training.loop"),
    ({"training/loop.py": "def f():\n  from transformer_jax.model import layers\n",
      "model/layers.py": ""},
     "inside a function: the package's own imports stand at module top"),
    ({"training/loop.py": "def f():\n  import torch\n"}, "without a comment saying why"),
    ({"training/loop.py": "import experiments.benchmark\n"}, "the package never imports experiments/"),
    ({"training/loop.py": "from transformer_jax.cli import train\n", "cli/__init__.py": "",
      "cli/train.py": ""}, "training/ imports transformer_jax.cli.train (cli/)"),
])
def test_the_rules_catch_what_they_forbid(tmp_path, files, expected):
  problems = check_package(_fake_package(tmp_path, files))
  assert any(expected in problem for problem in problems), problems


def test_a_lazy_optional_import_with_its_reason_passes(tmp_path):
  files = {"training/loop.py": "def f():\n  import torch  # Optional, heavy: only for --compare.\n"}
  assert check_package(_fake_package(tmp_path, files)) == []


def test_every_module_has_a_layer():
  known = LAYERS | {"foundation", "configs", ""}
  strays = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                  if layer(module_name(path, PACKAGE)) not in known)
  assert not strays, f"modules that no layering rule covers: {strays}"


def task_names_outside_tasks(root: pathlib.Path, names: set[str]) -> list[str]:
  """Places outside tasks/ whose code holds a task's name as a string (not a docstring)."""
  found = []
  for path in sorted(root.rglob("*.py")):
    if path.relative_to(root).parts[0] == "tasks":
      continue
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
      if (isinstance(node, ast.Constant) and node.value in names
          and id(node) not in docstrings):
        found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.value!r}")
  return found


def test_no_task_name_is_written_outside_tasks():
  from transformer_jax.tasks.registry import TASKS

  found = task_names_outside_tasks(PACKAGE, set(TASKS))
  assert not found, "name the task through its class (TranslationTask.name):\n" + "\n".join(found)


def test_the_task_name_rule_catches_a_string(tmp_path):
  root = _fake_package(tmp_path, {"training/loop.py": 'if task == "translation":\n  pass\n'})
  assert task_names_outside_tasks(root, {"translation"}) == [
      "transformer_jax/training/loop.py:1 'translation'"]

"""Where things live, checked: the module map in utils/__init__.py names every module of utils/
(and nothing that is gone), and the layers import downwards only. Read from the source with
``ast`` (imports inside functions count too), so nothing is imported to decide."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import ROOT

# What data/ may use of utils/: errors, argument rules, seeds, stop signals, atomic files and
# memory checks. Never the training loop, the checkpointer, the task or the outputs: a
# dataset builds tensors and knows nothing of how they are trained.
DATA_MAY_IMPORT = {
    "utils.errors",
    "utils.arguments",
    "utils.seeding",
    "utils.signals",
    "utils.checkpoint",
    "utils.memory",
}
# Safe files and stored data (reading, writing, checking, claiming) sit below the training loop
# and never import it.
FILE_MODULES = ("checkpoint", "claim", "trust", "text", "errors", "memory", "signals")
TRAINING = {
    "utils.loop",
    "utils.checkpointer",
    "utils.modules",
    "utils.tasks",
    "utils.run",
    "utils.outputs",
    "utils.report",
    "utils.evaluation",
}


def imported(path) -> set[str]:
    """The torchloom modules (``utils.*``, ``data.*``, ``models.*``) a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = (
                [node.module]
                if "." in node.module
                else [f"{node.module}.{alias.name}" for alias in node.names]
            )
            found |= set(names)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.split(".")[0] in ("utils", "data", "models")}


def test_the_module_map_names_every_module_of_utils_and_only_those():
    text = (ROOT / "utils" / "__init__.py").read_text()
    mapped = set(re.findall(r"^    ([a-z_]+) ", text, flags=re.MULTILINE))
    modules = {p.stem for p in (ROOT / "utils").glob("*.py") if p.stem != "__init__"}
    assert modules - mapped == set(), "modules missing from utils/__init__.py's map"
    assert mapped - modules == set(), "the map names modules that do not exist"


@pytest.mark.parametrize("path", sorted((ROOT / "data").glob("*.py")), ids=lambda p: p.name)
def test_data_uses_only_the_foundation_of_utils(path):
    used = {name for name in imported(path) if name.startswith("utils")}
    assert used <= DATA_MAY_IMPORT, f"{path.name} imports {sorted(used - DATA_MAY_IMPORT)}"


@pytest.mark.parametrize("name", FILE_MODULES)
def test_file_handling_never_imports_the_training_loop(name):
    used = imported(ROOT / "utils" / f"{name}.py")
    assert not used & TRAINING, f"utils/{name}.py imports {sorted(used & TRAINING)}"


def test_starting_a_run_never_imports_the_training_loop_or_the_checkpointer():
    # run.py decides where a run lives and whether it continues; what a step changes and what
    # is saved come after it (utils/loop.py, utils/checkpointer.py).
    assert not imported(ROOT / "utils" / "run.py") & {"utils.loop", "utils.checkpointer"}


# The task owns what the model's outputs mean (utils/tasks.py). data/targets.py defines the
# kinds of target; the readers of tables, tensors and manifests parse a file's targets by the
# kind they were asked for. Nothing else asks which kind of task it is: a new task is a class
# in utils/tasks.py and its YAML.
KINDS = {"classes", "label_sets", "values"}
KIND_OWNERS = {
    "utils/tasks.py",
    "data/targets.py",
    "data/tabular.py",
    "data/tensors.py",
    "data/image_manifest.py",
}
TASK_CLASSES = {"Classification", "MultiLabel", "Regression"}


def is_target_kind(node: ast.AST) -> bool:
    """``<...>.targets.kind`` or ``targets.kind``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "kind"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "targets") or (
        isinstance(owner, ast.Name) and owner.id == "targets"
    )


def kind_branches(path) -> list[str]:
    """Where a file compares something with a kind of target or a task class, or maps kinds
    to values."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in KINDS for o in operands) or any(
                is_target_kind(o) for o in operands
            ):
                found.append(f"{path.name}:{node.lineno} compares a target kind")
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & KINDS) >= 2:
                found.append(f"{path.name}:{node.lineno} maps target kinds")
        elif isinstance(node, ast.Name) and node.id in TASK_CLASSES:
            found.append(f"{path.name}:{node.lineno} names {node.id}")
    return found


SOURCES = sorted(p for folder in ("utils", "data", "models") for p in (ROOT / folder).glob("*.py"))


@pytest.mark.parametrize(
    "path",
    [*SOURCES, *(ROOT / f for f in ("train.py", "evaluate.py", "predict.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_only_the_task_asks_which_kind_of_task_it_is(path):
    if str(path.relative_to(ROOT)) in KIND_OWNERS:
        assert path.exists()
        return
    assert kind_branches(path) == []


def test_the_kind_check_finds_a_branch_on_the_kind(tmp_path):
    # The test above would pass on a check that finds nothing: it finds these.
    probe = tmp_path / "probe.py"
    probe.write_text(
        'if data.targets.kind != "classes":\n    pass\n'
        "if record.targets.kind == wanted:\n    pass\n"
        'words = {"classes": "c", "values": "v"}\n'
        "if isinstance(task, Regression):\n    pass\n"
        'if draw.kind == "mixup" or p.kind is p.VAR_KEYWORD:\n    pass\n'
    )
    found = sorted(line.split(" ", 1)[0] for line in kind_branches(probe))
    assert found == ["probe.py:1", "probe.py:3", "probe.py:5", "probe.py:6"]  # not line 8

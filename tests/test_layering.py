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
DATA_MAY_IMPORT = {"utils.errors", "utils.arguments", "utils.seeding", "utils.signals",
                   "utils.checkpoint", "utils.memory"}  # fmt: skip
# Safe files and stored data (reading, writing, checking, claiming) sit below the training loop
# and never import it.
FILE_MODULES = ("checkpoint", "claim", "trust", "text", "errors", "memory", "signals")
TRAINING = {"utils.loop", "utils.checkpointer", "utils.modules", "utils.tasks", "utils.run",
            "utils.outputs", "utils.report", "utils.evaluation"}  # fmt: skip


def imported(path) -> set[str]:
    """The torchloom modules (``utils.*``, ``data.*``, ``models.*``) a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if "." in node.module else [
                f"{node.module}.{alias.name}" for alias in node.names
            ]  # fmt: skip
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

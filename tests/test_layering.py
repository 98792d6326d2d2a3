"""Where things live, checked from the source with ``ast`` (imports inside functions count too,
so nothing is imported to decide):

- the packages sit in one declared order of layers, and a module imports only from its own
  package or from a lower layer: no import points up or sideways, so there is no cycle;
- no module imports a project module inside a function, but for the few listed with a reason;
- each package's ``__init__`` maps its modules, and ``utils/__init__.py`` its packages;
- the pieces stay small: packages, modules, functions and signatures within the bars;
- only the task asks which kind of task it is.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

# Lowest first. A module may import its own package and anything in a lower layer; never a
# package in its own layer or above. "utils" is the foundation at utils/'s top (errors, text,
# files, doctor); utils.precision and utils.schedulers are modules at the top because
# checkpoints store their builders' paths; the entry points sit above everything.
LAYERS = (
    ("utils",),
    ("utils.system",),
    ("utils.config",),
    ("data.augmentation",),
    ("data.batching", "models"),
    ("data.tables",),
    ("data.images",),
    ("data.text", "data.arrays"),
    ("data.shards",),
    ("data.corpus",),
    ("data",),
    ("utils.precision", "utils.schedulers"),
    ("utils.model", "utils.evaluation", "utils.tracking", "utils.diagnose"),
    ("utils.tasks",),
    ("utils.checkpoint",),
    ("utils.report",),
    ("utils.fit", "utils.run"),
    ("utils.preflight",),
    ("train", "evaluate", "predict", "shard", "report"),
)
LEVEL = {package: level for level, packages in enumerate(LAYERS) for package in packages}
TOP_MODULES = {"utils.precision", "utils.schedulers"}
# The project imports that stay inside a function, each with its reason.
LOCAL_IMPORTS = {
    # ${default_monitor:...} resolves the task's metric once a config is composed; importing
    # the tasks (and torch) with the schema would slow every command's start and the doctor.
    ("utils/config/monitor.py", "utils.tasks"),
}
ENTRY_POINTS = ("train.py", "evaluate.py", "predict.py", "shard.py", "report.py")
SOURCES = sorted(
    p for folder in ("utils", "data", "models") for p in (ROOT / folder).rglob("*.py")
) + [ROOT / name for name in ENTRY_POINTS]
MODULES = {
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
    for p in SOURCES
}


def project_module(name: str) -> str | None:
    """The project module ``name`` (a module or a name in one) refers to, if any."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return None


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(project module, line, inside a function) for each import in ``path``."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names = []
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [f"{child.module}.{alias.name}" for alias in child.names]
            elif isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            found.extend(
                (module, child.lineno, inside)
                for module in filter(None, map(project_module, names))
            )
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def where(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def package(module: str) -> str:
    """The layer-owning package of ``module``: ``utils.fit.loop`` → ``utils.fit``."""
    parts = module.split(".")
    if parts[0] in ("train", "evaluate", "predict", "shard", "report", "models"):
        return parts[0]
    if parts[0] == "data":
        nested = ".".join(parts[:2])
        return nested if nested in LEVEL else "data"
    if module in TOP_MODULES or ".".join(parts[:2]) in LEVEL:
        return ".".join(parts[:2])
    return "utils"


def test_every_package_has_a_layer():
    assert {package(module) for module in MODULES} <= set(LEVEL)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    own = package(module)
    wrong = [
        f"{module}:{line} imports {target} ({package(target)}, not below {own})"
        for target, line, inside in imports(MODULES[module])
        if package(target) != own
        and LEVEL[package(target)] >= LEVEL[own]
        and not (inside and (where(module), package(target)) in LOCAL_IMPORTS)
    ]
    assert wrong == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_module_import_cycle_even_through_imports_inside_functions():
    graph = {m: {t for t, _, _ in imports(p) if t != m} for m, p in MODULES.items()}
    # The listed import inside a function is the one edge up; without it, no cycle either.
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_project_imports_inside_functions_are_only_the_listed_ones():
    local = {
        (str(p.relative_to(ROOT)), package(t) if package(t) != "utils" else t)
        for p in SOURCES
        for t, _, inside in imports(p)
        if inside
    }
    assert local == LOCAL_IMPORTS


def test_fit_and_run_never_import_each_other():
    for one, other in (("utils.fit", "utils.run"), ("utils.run", "utils.fit")):
        assert not [
            (m, t)
            for m, p in MODULES.items()
            if package(m) == one
            for t, _, _ in imports(p)
            if package(t) == other
        ]


# --- The maps ---------------------------------------------------------------------------------


def mapped(init: Path) -> set[str]:
    """The names a package's ``__init__`` docstring maps (``    name   what it answers``)."""
    first = ast.parse(init.read_text()).body[0]
    text = first.value.value if isinstance(first, ast.Expr) else ""
    return set(re.findall(r"^ *([a-z_0-9]+/?)  +\S", text, flags=re.MULTILINE))


PACKAGES = sorted(
    p.parent for folder in ("utils", "data", "models") for p in (ROOT / folder).rglob("__init__.py")
)


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_package_maps_its_modules_and_only_those(folder):
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    modules |= {f"{p.parent.name}/" for p in folder.glob("*/__init__.py")}
    assert mapped(folder / "__init__.py") == modules


def test_the_architecture_page_links_every_package_map():
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        str(folder.relative_to(ROOT))
        for folder in PACKAGES
        if f"{folder.relative_to(ROOT)}/__init__.py" not in page
    ]
    assert missing == []


# --- Sizes describe the code -----------------------------------------------------------------

# Past these sizes a piece is named below with the reason it is as long as it is; nothing is
# squeezed, merged or split to stay under them. An entry that no longer applies is removed (the
# test fails on a stale one), so the lists say what is long today, and why.
MODULES_PER_PACKAGE, MODULE_LINES, FUNCTION_LINES, PARAMETERS = 11, 400, 60, 6
BIG_PACKAGES: dict[str, str] = {
    "utils/run": "a command's life, one question a module; the sweep and the search are two",
}
LONG_MODULES = {
    "data/images/imagefolder.py": "a folder of images: listed, split, cached or read lazily",
    "utils/run/start.py": "a run's start: folders, claims, the resume and its checks",
    "utils/run/provenance.py": "what produced a run, and what changed in its data since",
}
LONG_FUNCTIONS = {
    "train.py:train": "the recipe: read top to bottom, its shape checked below",
    "utils/fit/loop.py:_steps": "the step in one place, its order what exact resume relies on;"
    " on a small model a call around it is a share of it, so bare paths sit beside wrapped ones",
}
# Builders whose parameters are the YAML keys of their config group (one key, one parameter).
MANY_PARAMETERS = {
    "data/images/imagefolder.py:load_imagefolder": "conf/data/imagefolder.yaml's keys",
    "utils/schedulers.py:plateau": "conf/scheduler/plateau.yaml's keys",
    "models/tabular/builder.py:tabular": "conf/model/tabular.yaml's keys",
    "models/auto.py:auto": "conf/model/auto.yaml's keys, and the table's quantiles",
    "data/text/dataset.py:load_text": "conf/data/text.yaml's keys",
    "models/text/bag.py:text_bag": "conf/model/text_bag.yaml's keys",
    "models/text/transformer.py:text_transformer": "conf/model/text_transformer.yaml's keys",
    "models/text/encoder.py:hf_model": "conf/model/hf.yaml's keys",
    "models/gpt.py:gpt": "conf/model/gpt.yaml's keys",
    "models/gpt.py:__init__": "a GPT's sizes: the vocabulary and conf/model/gpt.yaml's keys",
    "data/corpus/corpus.py:load_corpus": "conf/data/corpus.yaml's keys",
}
# Lines the formatter may not lay out. None today; a new one must say why it needs to be here.
FMT_SKIPS = 0


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def long_pieces() -> dict[str, set[str]]:
    """What is past each size today: packages, modules, functions, signatures."""
    found: dict[str, set[str]] = {"packages": set(), "modules": set(), "functions": set()}
    found["parameters"] = set()
    for folder in PACKAGES:
        if len([p for p in folder.glob("*.py") if p.stem != "__init__"]) > MODULES_PER_PACKAGE:
            found["packages"].add(str(folder.relative_to(ROOT)))
    for path in SOURCES:
        where = str(path.relative_to(ROOT))
        if len(path.read_text().splitlines()) > MODULE_LINES:
            found["modules"].add(where)
        for node in functions(path):
            if node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                found["functions"].add(f"{where}:{node.name}")
            arguments = node.args
            named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            if len([a for a in named if a.arg not in ("self", "cls")]) > PARAMETERS:
                found["parameters"].add(f"{where}:{node.name}")
    return found


def test_what_is_long_is_named_with_its_reason_and_nothing_else_is():
    found = long_pieces()
    named = {
        "packages": BIG_PACKAGES,
        "modules": LONG_MODULES,
        "functions": LONG_FUNCTIONS,
        "parameters": MANY_PARAMETERS,
    }
    for size, pieces in named.items():
        assert found[size] == set(pieces), size
        assert all(reason.strip() for reason in pieces.values())


def statements(body: list[ast.stmt]):
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from statements(getattr(node, field, []) or [])


def test_train_reads_as_a_recipe():
    # Its shape, not its length: phases under "# ---" headings, one loop (the epochs), nothing
    # defined or caught inside it, each branch a line or two, each statement one call's worth.
    source = (ROOT / "train.py").read_text()
    train = next(n for n in functions(ROOT / "train.py") if n.name == "train")
    inside = list(statements(train.body[1:]))  # after its docstring
    assert len([n for n in inside if isinstance(n, ast.For | ast.While)]) == 1
    nested = [n for s in train.body for n in ast.walk(s)]
    assert not [n for n in nested if isinstance(n, ast.Try | ast.FunctionDef | ast.Lambda)]
    assert all(len(n.body) <= 4 for n in inside if isinstance(n, ast.If))
    assert all(n.end_lineno - n.lineno <= 1 for n in inside if not hasattr(n, "body"))
    lines = source.splitlines()[train.lineno : train.end_lineno]
    assert len([line for line in lines if line.strip().startswith("# ---")]) >= 3


def test_the_size_check_finds_what_is_long(tmp_path, monkeypatch):
    # The test above would pass on a check that finds nothing: it finds these.
    probe = tmp_path / "probe.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    probe.write_text(f"def long(a, b, c, d, e, f, g):\n{body}\n" + "\n" * MODULE_LINES)
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", [probe])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", [])
    found = long_pieces()
    assert found["modules"] == {"probe.py"}
    assert found["functions"] == found["parameters"] == {"probe.py:long"}


def test_the_formatter_lays_out_the_code():
    tracked = [
        p
        for folder in ("utils", "data", "models", "tests", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
    ] + [ROOT / n for n in ENTRY_POINTS]
    assert sum(p.read_text().count("# fmt: " + "skip") for p in tracked) <= FMT_SKIPS


# --- The task owns what outputs mean ----------------------------------------------------------

# The task owns what the model's outputs mean (utils/tasks/). data/batching/targets.py defines
# the kinds of target; data/tables/target_columns.py reads a file's target column by kind
# (tables, texts, image manifests) and an array's y (tensors); the shards' reader parses its
# Arrow columns itself. Nothing else asks which kind of task it is: a
# new task is a module in utils/tasks/ and its YAML.
KINDS = {"classes", "label_sets", "values", "next_tokens"}
KIND_OWNERS = {
    "data/batching/targets.py",
    "data/tables/target_columns.py",  # how targets are read: tables, texts, manifests, arrays
    "data/shards/parquet.py",  # a class column, or number columns for task=regression
}
TASK_CLASSES = {"Classification", "MultiLabel", "Regression", "CausalLM"}


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


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_task_asks_which_kind_of_task_it_is(path):
    where = str(path.relative_to(ROOT))
    if where in KIND_OWNERS or where.startswith("utils/tasks/"):
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


def test_the_import_reader_sees_imports_inside_functions_and_their_layers(tmp_path):
    # The checks above would pass on a reader that finds nothing: it finds these.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from utils.errors import UserError\n"
        "def f():\n    from utils.fit.loop import Loop\n    import data.tables.tabular\n"
    )
    found = [(module, inside) for module, _, inside in imports(probe)]
    assert found == [
        ("utils.errors", False),
        ("utils.fit.loop", True),
        ("data.tables.tabular", True),
    ]
    assert LEVEL[package("utils.run.start")] == LEVEL[package("utils.fit.loop")]  # sideways
    assert LEVEL[package("data.tables.tabular")] < LEVEL[package("utils.fit.loop")]


# --- Only a kind of input asks which kind of input it holds -----------------------------------

# A kind of input (pixels, rows, tokens, values) answers every question that depends on it in
# its family's inputs.py (data/batching/inputs.py's protocol), registered in data/kinds.py. The
# families' own modules (their builders and readers) know their kind; models take the hints
# their builders name. Nothing else reads a kind's own record (a table's columns, a tokenizer,
# the padding id, an image's centre share, the rows a model was fitted to), names a kind's
# class or compares with a kind's name: a new kind is a folder, not edits across the project.
KIND_FOLDERS = (
    "data/images/",
    "data/tables/",
    "data/text/",
    "data/arrays/",
    "data/shards/",
    "data/corpus/",
)
KIND_MODULES = {"data/kinds.py"}
KIND_ATTRIBUTES = {
    "table",
    "text",
    "pixels",
    "pad_id",
    "crop_pct",
    "train_rows",
    "table_rows",
    "feature_quantiles",
    "vocab_size",
    "gapped",
    "fitted_rows",
}
KIND_CLASSES = {"Pixels", "Rows", "Tokens", "Values", "TokenIds", "Stream", "StreamIds"}
KIND_NAMES = {"pixels", "rows", "tokens"}  # "values" is a kind of target too
# What holds data or its record where the project reads it.
DATA_HOLDERS = {"data", "record", "stored", "shapes", "evaluated", "rebuilt"}


def holder(node: ast.AST) -> str | None:
    """The name that ends ``node``: ``data`` of ``data`` or ``run.data``."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def input_kind_branches(path: Path) -> list[str]:
    """Where a file reads a kind of input's own record off data or a record, names a kind's
    class, or compares with a kind's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in KIND_ATTRIBUTES:
            if holder(node.value) in DATA_HOLDERS:
                found.append(f"{path.name}:{node.lineno} reads {node.attr}")
        elif isinstance(node, ast.Call) and holder(node.func) in ("getattr", "hasattr"):
            arguments = node.args
            named = len(arguments) > 1 and isinstance(arguments[1], ast.Constant)
            if named and arguments[1].value in KIND_ATTRIBUTES:
                found.append(f"{path.name}:{node.lineno} reads {arguments[1].value}")
        elif isinstance(node, ast.Name) and node.id in KIND_CLASSES:
            found.append(f"{path.name}:{node.lineno} names {node.id}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in KIND_NAMES for o in operands):
                found.append(f"{path.name}:{node.lineno} compares a kind's name")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_a_kind_of_input_asks_which_kind_of_input_it_is(path):
    where = str(path.relative_to(ROOT))
    if where.startswith((*KIND_FOLDERS, "models/")) or where in KIND_MODULES:
        return
    assert input_kind_branches(path) == []


def test_the_input_kind_check_finds_a_branch_on_the_kind(tmp_path):
    # The test above would pass on a check that finds nothing: it finds what the code before
    # the families asked (shard.py, tune.py, record.py, modules.py), and not these lookalikes.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "uint8 = data.pixels\n"
        "if data.pad_id is not None:\n    pass\n"
        "table = record.table\n"
        'text = getattr(data, "text", None)\n'
        "kind = TokenIds if text else BatchTransform\n"
        'if inputs.name == "pixels":\n    pass\n'
        'tracker.text("train/sample_labels", "x")\n'
        "rows = Table(title='x')\n"
    )
    found = sorted(line.split(" ", 1)[0] for line in input_kind_branches(probe))
    assert found == [f"probe.py:{n}" for n in (1, 2, 4, 5, 6, 7)]


def test_the_docs_index_links_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert [page for page in pages if f"]({page})" not in index] == []

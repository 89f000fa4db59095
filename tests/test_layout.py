"""The package's layers import only downwards: root modules <- data <- model <- training <- feedback,
and inside each folder the modules import one another without a cycle. A command run as a module
(`python -m vits_trainer.speak`) is, like the scripts beside the package, above every layer: it may
import any of them, and nothing in the package imports it.

The subpackages' docstrings promise it; this reads every import statement and holds them to it.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vits_trainer"
LAYERS = ["", "data", "model", "training", "feedback"]  # "" = the root modules
COMMANDS = {"vits_trainer.speak"}  # root files that are commands, not modules of the root layer


def _layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else ""


def _module_path(module: str) -> Path | None:
    """The file of a vits_trainer module (a package: its __init__.py), or None."""
    base = PACKAGE.joinpath(*module.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path) -> set[str]:
    """Absolute names of the vits_trainer modules that `path` imports."""
    own = "vits_trainer." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = own.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("vits_trainer"):
                found |= {f"{name}.{a.name}" for a in node.names} if node.module is None else {name}
                # `from .pkg import module` imports that module too
                found |= {f"{name}.{a.name}" for a in node.names if _module_path(f"{name}.{a.name}")}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vits_trainer")}
    return found


def test_layers_import_only_downwards():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if _module_name(path) in COMMANDS:
            continue
        mine = rel.parts[0] if len(rel.parts) > 1 else ""
        for name in _imports(path):
            theirs = _layer_of(name)
            if LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{rel} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_a_command():
    for name in COMMANDS:
        assert _module_path(name), f"no module {name}: update COMMANDS"
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in _imports(path)
        if any(name == c or name.startswith(c + ".") for c in COMMANDS)
    ]
    assert not wrong, "\n".join(wrong)


def test_every_subpackage_says_what_it_may_import():
    for layer in LAYERS[1:]:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
        assert "May import" in doc, layer


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_a_folder():
    """Every import statement counts, also one inside a function or under TYPE_CHECKING: in a cycle no
    module can be read, tested or moved without the others."""
    wrong = []
    for folder in [PACKAGE, *(PACKAGE / layer for layer in LAYERS[1:])]:
        files = {_module_name(path): path.name for path in sorted(folder.glob("*.py"))}
        graph = {
            files[name]: {files[other] for other in _imports(_module_path(name)) if other in files}
            for name in files
        }
        for component in _cycles(graph):
            edges = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
            wrong.append(
                f"{folder.relative_to(PACKAGE.parent)}/: {', '.join(component)} ({'; '.join(edges)})"
            )
    assert not wrong, "import cycles inside a folder:\n" + "\n".join(wrong)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(["vits_trainer", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def test_the_step_best_model_holds_is_set_by_one_part():
    # which weights best_model/ holds was set in outputs.py and, around the final copy, in run_end.py:
    # a reader had to follow both to know what a checkpoint names; outputs.RunOutputs alone sets it now
    setters = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                for leaf in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(leaf, ast.Attribute) and leaf.attr == "best_model_step":
                        setters.append(str(path.relative_to(PACKAGE)))
    assert setters and set(setters) == {"training/outputs.py"}, setters

"""The package's layers import only downwards: root modules <- data <- model <- training <- feedback.

The subpackages' docstrings promise it; this reads every import statement and holds them to it.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vits_trainer"
LAYERS = ["", "data", "model", "training", "feedback"]  # "" = the root modules


def _layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else ""


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
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vits_trainer")}
    return found


def test_layers_import_only_downwards():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        mine = rel.parts[0] if len(rel.parts) > 1 else ""
        for name in _imports(path):
            theirs = _layer_of(name)
            if LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{rel} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_every_subpackage_says_what_it_may_import():
    for layer in LAYERS[1:]:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
        assert "May import" in doc, layer

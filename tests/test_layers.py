"""The package's shape, as design.md draws it: layers from the ground up, nothing importing a layer above its
own (not even inside a function), and no import cycle between modules at import time."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "colabkit"

# bottom to top; a module belongs to the first entry that its dotted name starts with
LAYERS = [
    ("ground", ["colabkit._version", "colabkit.config", "colabkit.units", "colabkit.optional", "colabkit.mounts",
                "colabkit.proctree",
                "colabkit.runtime", "colabkit.deadline", "colabkit.display"]),
    ("locations", ["colabkit.locations"]),
    # portable: what a migrated notebook calls at run time (paths, Drive); migrate/ writes calls to it
    ("store, devices, Drive", ["colabkit.checkpoints", "colabkit.devices", "colabkit.gdrive", "colabkit.portable"]),
    ("resume core", ["colabkit.resume"]),
    ("adapters, health, session", ["colabkit.keras", "colabkit.torch", "colabkit.torch_lightning", "colabkit.hf",
                                   "colabkit.guard", "colabkit.health",
                                   "colabkit.presence", "colabkit.keepalive", "colabkit.keepalive_page"]),
    ("jobs, cluster, migrate", ["colabkit.jobs", "colabkit.cluster", "colabkit.migrate", "colabkit.doctor"]),
    ("skins", ["colabkit.magics", "colabkit.gpu_magics", "colabkit.cli", "colabkit.widgets", "colabkit.summary",
               "colabkit.demo", "colabkit.__main__", "colabkit"]),
]


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "colabkit" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and to design.md's tree)"
    return best[0]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported colabkit module, at import time?) for every import in the module."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body} | {
        id(inner) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for inner in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "colabkit" or target.startswith("colabkit."):
                out.append((target, id(node) in top_level))
    return out


def resolve(target: str, known: dict) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def test_no_module_imports_a_layer_above_its_own():
    known = modules()
    upward = []
    for name, path in known.items():
        for target, _ in imports(name, path):
            module = resolve(target, known)
            if module and module != name and not name.startswith(module + ".") and layer_of(module) > layer_of(name):
                upward.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {module} ({LAYERS[layer_of(module)][0]})")
    assert not upward, "imports that reach up a layer:\n" + "\n".join(sorted(set(upward)))


def test_no_import_cycle_at_import_time():
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        for target, at_import in imports(name, path):
            module = resolve(target, known)
            # a package's __init__ importing its own submodules is how a package exposes its names
            if at_import and module and module != name and not module.startswith(name + "."):
                graph[name].add(module)
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_is_imported_from_another_package():
    """A name shared across packages is public; a leading underscore means "only this package uses it"."""
    known = modules()
    found = []
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                source = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            elif (node.module or "").startswith("colabkit"):
                source = node.module
            else:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and source.split(".")[:2] != name.split(".")[:2]:
                    found.append(f"{name}: from {source} import {alias.name}")
    assert not found, "private names imported across packages:\n" + "\n".join(found)

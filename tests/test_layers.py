"""The dependency rule, stated once: a package imports only the packages below it in LAYERS.

Bottom to top: the event contract, the lake, the trainers, then the engine's rooms. Rooms on one floor do not
import each other. Every import counts, at module level or inside a function (a lazy import is still an edge).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    ["streams"],
    ["lake"],
    ["trainers"],
    ["engine.domains"],
    ["engine.benchmarks"],
    ["engine.coevolution", "engine.supervised"],
    ["engine.lineage", "engine.workers"],
    ["engine.cli"],
]
FLOOR = {room: floor for floor, rooms in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str | None:
    """The room a dotted module name is in: engine's subpackages are rooms of their own."""
    parts = module.split(".")
    name = ".".join(parts[:2]) if parts[0] == "engine" and len(parts) > 1 else parts[0]
    return name if name in FLOOR else None


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a file, relative ones resolved against its package."""
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
            found += [(node.lineno, name) for name in names]
    return found


def wrong_edges() -> list[str]:
    wrong = []
    for path in sorted(p for top in ("streams", "lake", "trainers", "engine") for p in (ROOT / top).rglob("*.py")):
        source = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for line, module in imports(path):
            target = room_of(module)
            if source and target and target != source and FLOOR[target] >= FLOOR[source]:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line}: {source} imports {module} (floor {FLOOR[target]} "
                    f">= its own {FLOOR[source]})"
                )
    return wrong


def test_every_import_points_down_the_layers():
    assert wrong_edges() == []


def test_the_rule_sees_a_wrong_edge(tmp_path, monkeypatch):
    """The check is not vacuous: a trainer module that imports the engine is caught."""
    fake = tmp_path / "trainers" / "bad.py"
    fake.parent.mkdir()
    fake.write_text("from engine.coevolution import CoEvolution\nfrom . import models\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert [e.split(": ", 1)[1] for e in wrong_edges()] == [
        "trainers imports engine.coevolution (floor 5 >= its own 2)"
    ]


def test_every_room_is_placed():
    """A new package or engine subpackage must be put on a floor before its imports can be judged."""
    rooms = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"} - {"engine"}
    rooms |= {
        f"engine.{p.stem}"
        for p in (ROOT / "engine").iterdir()
        if (p / "__init__.py").is_file() or (p.suffix == ".py" and p.stem != "__init__")
    }
    assert rooms <= set(FLOOR), sorted(rooms - set(FLOOR))

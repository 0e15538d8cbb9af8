"""The house rules, checked on the source (no import is executed): dependencies point one way, nothing cycles,
and every file name passed between stages is the one `pipeline.paths.Layout` and dvc.yaml agree on.

Layers, bottom to top (docs/architecture.md): a module may import its own unit and units of lower layers only,
at the top of the file or inside a function alike (a lazy import cannot hide an upward arrow or a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_params
from pipeline.paths import Layout

ROOT = Path(__file__).resolve().parents[1]

#: units (a top-level module or subpackage of `pipeline`, or `stages`), lowest layer first
LAYERS: list[set[str]] = [
    {"pipeline", "pipeline.settings", "pipeline.records"},
    {"pipeline.paths", "pipeline.provenance", "pipeline.metrics", "pipeline.store", "pipeline.grid"},
    {"pipeline.data"},
    {"pipeline.models"},
    {"pipeline.training"},
    {"pipeline.encoders"},
    {"pipeline.explain"},
    {"pipeline.scoring"},
    {"pipeline.report"},
    {"pipeline.config"},
    {"stages"},
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for package in ("pipeline", "stages") for p in (ROOT / package).rglob("*.py")}


def unit(module: str) -> str:
    return "stages" if module.startswith("stages") else ".".join(module.split(".")[:2])


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that `path` imports anywhere in the file (`from a.b import c` names a.b.c when c is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports(path, modules) for name, path in modules.items()}


def test_every_module_belongs_to_a_layer(graph):
    assert {unit(m) for m in graph} <= set(LAYER), sorted({unit(m) for m in graph} - set(LAYER))


def test_dependencies_point_down_only(graph):
    upward = [f"{m} imports {t}" for m, targets in graph.items() for t in targets
              if unit(t) != unit(m) and LAYER[unit(t)] >= LAYER[unit(m)]]
    assert upward == [], "\n".join(upward)


def test_the_library_never_imports_the_applications(graph):
    assert [m for m, targets in graph.items() if m.startswith("pipeline") and any(t.startswith("stages") for t in targets)] == []


def test_no_import_cycles(graph):
    """Depth-first search over the module graph; a back edge is a cycle."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == [], cycles


def test_no_eval_or_exec_in_the_code(graph):
    modules = our_modules()
    calls = [f"{name}: {node.func.id}" for name, path in modules.items() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec")]
    assert calls == []


def test_dvc_yaml_paths_are_the_layouts():
    """Every store path in dvc.yaml is a path of `Layout` (for the cells: of their run), and vice versa for outputs."""
    layout = Layout(Path("."))
    params = load_params(ROOT / "params.yaml")
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    run = params.cells()[0].name
    known = {str(p) for p in (layout.data, layout.encoder, layout.encoder_metrics, layout.embeddings, layout.image_embeddings,
                              layout.captions, layout.metrics, layout.evals, layout.planted_metrics, layout.report)}
    cell = {str(layout.model(run)), str(layout.run_metrics(run)), str(layout.run_explanations(run)), str(layout.run_curve(run)),
            str(layout.run_timings(run))}
    used = set()
    for stage in stages.values():
        for entry in [*stage.get("deps", []), *stage.get("outs", []), *stage.get("metrics", []), *stage.get("plots", [])]:
            path = entry if isinstance(entry, str) else next(iter(entry))
            if path.startswith(("store/", "reports/")):
                used.add(path.replace("${item.method}-${item.size}-${item.k}", run).replace("${item.method}-${item.k}", run))
    assert used <= known | cell, sorted(used - known - cell)
    assert cell <= used, "the grid-cell stages must declare the run's model and records"

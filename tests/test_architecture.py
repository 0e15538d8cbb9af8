"""The house rules, checked on the source (no import is executed): dependencies point one way, nothing cycles, the
schema of params.yaml is cheap to load, and every file name passed between stages is the one
`pipeline.paths.Layout` and dvc.yaml agree on.

Floors, bottom to top (docs/architecture.md draws them): a module may import its own unit and units of lower floors
only, whether at the top of the file or inside a function, absolutely, relatively (`from . import x`) or through
`importlib.import_module` / `__import__` (a lazy import cannot hide an upward arrow or a cycle). A unit is the
longest name below that prefixes the module (`pipeline.models.options` is its own unit, `pipeline.models.cedar`
belongs to `pipeline.models`). The applications share the top floor; the only arrow between them is the `cedar`
command's into the flow's commands (`SIDEWAYS`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_params
from pipeline.paths import Layout

ROOT = Path(__file__).resolve().parents[1]

#: the packages of the house: the library and its three applications
PACKAGES = ("pipeline", "stages", "cli", "flow")

#: units, lowest floor first
FLOORS: list[set[str]] = [
    {"pipeline", "pipeline.atomic"},
    {"pipeline.settings", "pipeline.records"},
    {"pipeline.metrics", "pipeline.grid", "pipeline.data.table"},
    {"pipeline.data.options", "pipeline.models.options", "pipeline.training.options"},
    {"pipeline.encoders.options", "pipeline.explain.options", "pipeline.scoring.options"},
    {"pipeline.config"},
    {"pipeline.paths", "pipeline.provenance", "pipeline.store", "pipeline.presets"},
    {"pipeline.data"},
    {"pipeline.models"},
    {"pipeline.training"},
    {"pipeline.encoders"},
    {"pipeline.explain"},
    {"pipeline.scoring"},
    {"pipeline.report"},
    {"pipeline.resources"},
    {"stages", "cli", "flow"},
]
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}

#: arrows allowed between units of one floor: the `cedar` command offers the flow's commands (`cedar flow`, `serve`)
SIDEWAYS = {("cli", "flow")}

#: what `import pipeline.config` must not load (the schema is read by every stage, `cedar validate` and the flow)
HEAVY = ("torch", "sklearn", "zarr", "scipy", "PIL", "transformers", "open_clip", "dvc", "prefect")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for package in PACKAGES if (root / package).is_dir() for p in (root / package).rglob("*.py")}


def unit(module: str) -> str:
    """The longest declared unit that is `module` or a package above it (the root package `pipeline` is a unit of its
    own, not a catch-all: a new library module must be given its floor here)."""
    parts = module.split(".")
    prefixes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    prefixes = [p for p in prefixes if p != "pipeline" or module == "pipeline"]
    return next((p for p in prefixes if p in FLOOR), module)


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names, resolving `from . import x` / `from ..a import b`."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], list[str]]:
    """(our modules that `path` imports anywhere in the file, dynamic imports whose target is not a literal).

    Counts `import a.b`, `from a.b import c` (a.b.c when c is a module), relative imports, and calls of
    `importlib.import_module(...)` / `import_module(...)` / `__import__(...)` with a string literal."""
    found: set[str] = set()
    opaque: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                else:
                    opaque.append(f"{module}:{node.lineno}: {name}() of a computed name")
    resolved = set()
    for name in found:  # `import pipeline.models.cedar` depends on that module; a name below a module on the module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            resolved.add(name)
    return resolved, opaque


def build_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    modules = our_modules(root)
    graph, opaque = {}, []
    for name, path in modules.items():
        graph[name], dynamic = imports(name, path, modules)
        opaque += dynamic
    return graph, opaque


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Arrows that point up, or sideways without being declared in SIDEWAYS."""
    out = []
    for m, targets in graph.items():
        for t in targets:
            a, b = unit(m), unit(t)
            if a == b or FLOOR[b] < FLOOR[a] or (FLOOR[b] == FLOOR[a] and (a, b) in SIDEWAYS):
                continue
            out.append(f"{m} imports {t} ({'up' if FLOOR[b] > FLOOR[a] else 'sideways'}: floor {FLOOR[a]} -> {FLOOR[b]})")
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph()[0]


def test_every_module_belongs_to_a_floor(graph):
    assert {unit(m) for m in graph} <= set(FLOOR), sorted({unit(m) for m in graph} - set(FLOOR))


def test_dependencies_point_down_only(graph):
    assert violations(graph) == [], "\n".join(violations(graph))


def test_no_dynamic_import_hides_its_target():
    assert build_graph()[1] == []


def test_the_library_never_imports_the_applications(graph):
    apps = ("stages", "cli", "flow")
    assert [m for m, targets in graph.items() if m.startswith("pipeline") and any(unit(t) in apps for t in targets)] == []


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


@pytest.mark.parametrize("source, caught", [
    ("from pipeline.scoring import cell\n", "pipeline.metrics.fake imports pipeline.scoring.cell (up"),
    ("from ..scoring import cell\n", "pipeline.metrics.fake imports pipeline.scoring.cell (up"),
    ("from .. import config\n", "pipeline.metrics.fake imports pipeline.config (up"),
    ("import importlib\nimportlib.import_module('pipeline.report.render')\n", "pipeline.metrics.fake imports pipeline.report.render (up"),
    ("def f():\n    __import__('stages.cell')\n", "pipeline.metrics.fake imports stages.cell (up"),
])
def test_a_planted_upward_import_is_caught(tmp_path, source, caught):
    """The checker itself: an upward arrow in any spelling (absolute, relative, importlib, __import__, lazy) fails."""
    for rel in ("pipeline/__init__.py", "pipeline/metrics/__init__.py", "pipeline/scoring/__init__.py", "pipeline/scoring/cell.py",
                "pipeline/config.py", "pipeline/report/__init__.py", "pipeline/report/render.py", "stages/__init__.py", "stages/cell.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "pipeline/metrics/fake.py").write_text(source)
    found = violations(build_graph(tmp_path)[0])
    assert any(line.startswith(caught) for line in found), found


def test_a_computed_dynamic_import_is_refused(tmp_path):
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline/__init__.py").write_text("")
    (tmp_path / "pipeline/grid.py").write_text("import importlib\nname = 'pipeline.report'\nimportlib.import_module(name)\n")
    assert build_graph(tmp_path)[1] == ["pipeline.grid:3: import_module() of a computed name"]


def test_the_schema_loads_without_the_heavy_libraries():
    """`import pipeline.config` (every stage, `cedar validate`, DVC's params parsing through the flow) loads neither
    torch nor scikit-learn nor zarr (nor scipy, PIL, the model libraries, DVC or Prefect): the settings classes live in
    light `options` modules. Checked in a fresh interpreter, whose sys.modules shows what the import really loaded."""
    code = textwrap.dedent(f"""
        import sys
        import pipeline.config
        from pipeline.config import load_params
        load_params({str(ROOT / 'params.yaml')!r})
        print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    assert out == "[]", f"import pipeline.config loaded {out}"


def test_no_eval_or_exec_in_the_code():
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
                              layout.captions, layout.probes, layout.metrics, layout.evals, layout.planted_metrics, layout.report)}
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


def test_the_drawing_in_the_docs_is_the_house_this_test_holds():
    """docs/architecture.md draws the floors; the drawing is these FLOORS, floor by floor."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawn = {int(line.split(":")[0].removeprefix("floor ")): set(line.split(":", 1)[1].replace(" ", "").split(","))
             for line in text.splitlines() if line.startswith("floor ")}
    assert drawn == dict(enumerate(FLOORS))

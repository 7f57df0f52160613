"""The layers point one way: every import in the code (at module level or inside a function, read with `ast`) goes to
the same layer or one below it, and no modules import each other in a circle.

The order is the README's layout table, bottom to top. The main job (`python run.py`, `replay`, `serve`) runs on
the layers below `bench`; measurement code (benchmarks, evaluations, soak, training) sits in `bench/` and is imported
only by the CLI's measurement verbs.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [                      # bottom first; a module may import its own layer and the ones listed before it
    "kernels",                  # pure numerics over arrays
    "models",                   # GGUF, conversion, graphs, the ONNX Runtime runner, the model registry
    "pipeline.config pipeline.channel pipeline.process pipeline.report",  # profiles, channels, a process's self, reports
    "pipeline.decode",          # sequence state, the speculative step, the serial and pipelined engines, drafts
    "pipeline.stream",          # records, sources, triggers, prompts, the replay frame, the archive
    "pipeline.serve",           # the operators' front: HTTP, zmq, metrics, the fair queue
    "actors",                   # one process each
    "pipeline.launch",          # starts the actors (local processes or Ray)
    "bench",                    # benchmarks, evaluations, soak, training
    "run",                      # the CLI
]
PACKAGES = ("kernels", "models", "pipeline", "actors", "bench", "run")


def layer_of(module: str) -> int:
    """Index of the layer holding `module` (the longest prefix listed)."""
    best, found = -1, None
    for i, names in enumerate(LAYERS):
        for prefix in names.split():
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    if found is None:
        raise LookupError(f"{module} is in no layer: add it to LAYERS (and to the README's layout table)")
    return found


def modules() -> dict[str, Path]:
    out = {"run": ROOT / "run.py"}
    for package in PACKAGES[:-1]:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__init__.py" and not path.read_text().strip():
                continue                                    # an empty package marker holds no code to place
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported project module, line) for every import statement in the file, wherever it stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:          # `import a.b.c` names the deepest module known
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] in PACKAGES:
                out.append((target, node.lineno))
    return out


def graph() -> dict[str, list[tuple[str, int]]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def upward_imports(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    return [f"{src} (layer {LAYERS[layer_of(src)]!r}) imports {dst} (layer {LAYERS[layer_of(dst)]!r}) "
            f"at line {line}"
            for src, targets in edges.items() for dst, line in targets if layer_of(dst) > layer_of(src)]


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), and modules importing themselves."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or any(w == v for w, _ in edges.get(v, ())):
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_every_module_sits_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_points_up_a_layer():
    assert upward_imports(graph()) == []


def test_no_modules_import_each_other_in_a_circle():
    assert cycles(graph()) == []


def test_nothing_the_main_job_runs_imports_bench():
    edges = graph()
    runtime = [m for m in edges if m.split(".")[0] in ("kernels", "models", "pipeline", "actors")]
    assert [(m, d) for m in runtime for d, _ in edges[m] if d.split(".")[0] == "bench"] == []


@pytest.mark.parametrize("planted", ["from pipeline.serve.front import Front", "import actors.target"])
def test_a_planted_upward_import_is_caught(tmp_path, planted):
    """The checks can fail: an import from the decoding layer up to serving (or the actors) is named."""
    edges = graph()
    path = tmp_path / "engine.py"
    path.write_text(modules()["pipeline.decode.engine"].read_text() + f"\n\ndef late():\n    {planted}\n")
    edges["pipeline.decode.engine"] = imports("pipeline.decode.engine", path, set(edges))
    found = upward_imports(edges)
    assert len(found) == 1 and found[0].startswith("pipeline.decode.engine (layer 'pipeline.decode') imports")


def test_a_planted_cycle_is_caught():
    edges = graph()
    edges["kernels.ring"] = edges["kernels.ring"] + [("kernels.rope", 1)]
    edges["kernels.rope"] = edges["kernels.rope"] + [("kernels.ring", 1)]
    assert ["kernels.ring", "kernels.rope"] in cycles(edges)

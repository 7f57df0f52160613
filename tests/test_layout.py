"""The layers point one way: every import in the code (at module level or inside a function, read with `ast`) goes to
the same layer or one below it, and no modules import each other in a circle.

The order is the README's layout table, bottom to top. The main job (`python run.py`, `replay`, `serve`) runs on
the layers below `bench`; measurement code (benchmarks, evaluations, soak, training) sits in `bench/`, above the CLI,
and nothing imports it: `python run.py bench ...` hands over to `python -m bench bench ...`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import ROOT

LAYERS = [                      # bottom first; a module may import its own layer and the ones listed before it
    "kernels",                  # pure numerics over arrays
    "models",                   # GGUF, conversion, graphs, the ONNX Runtime runner, the model registry
    "pipeline.config pipeline.channel pipeline.process "     # validated profiles, shared-memory channels,
    "pipeline.messages pipeline.report pipeline.watch "      # a process's self, the actors' typed messages, reports,
    "pipeline.topology",                                     # waiting on another process by its progress, the
                                                             # channels' geometry
    "pipeline.decode",          # sequence state, the speculative step, the serial and pipelined engines, drafts
    "pipeline.stream",          # records, sources, triggers, prompts, the replay frame, the archive
    "pipeline.answer",          # the answering layer: span candidates (issue 59; the cited reader moves here)
    "pipeline.serve",           # the operators' front: HTTP, zmq, metrics, the fair queue
    "actors",                   # one process each, and what each is started with (actors/args.py)
    "pipeline.launch",          # starts the actors (local processes or Ray) and checks their memory plan
    "run",                      # the CLI (its measurement verbs hand over to `python -m bench`)
    "bench",                    # benchmarks, evaluations, soak, training: above all, imported by nothing below
]
PACKAGES = ("kernels", "models", "pipeline", "actors", "bench", "run")
OPTIONAL = {"torch", "transformers", "llama_cpp", "ray", "rknnlite", "rknn",
            "hypothesis"}   # extras: imported where first used (hypothesis: `run.py fuzz`, the test extra)


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


def late_imports(path: Path) -> list[tuple[str, int]]:
    """(top-level package, line) of every import inside a function (a module-level try/except is module level)."""
    out = []

    def visit(node, inside: bool):
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.Import):
                out.extend((a.name.split(".")[0], child.lineno) for a in child.names)
            elif inside and isinstance(child, ast.ImportFrom):
                out.append(((child.module or "").split(".")[0] if not child.level else ".", child.lineno))
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
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
    runtime = [m for m in edges if m.split(".")[0] in ("kernels", "models", "pipeline", "actors", "run")]
    assert [(m, d) for m in runtime for d, _ in edges[m] if d.split(".")[0] == "bench"] == []


def test_imports_stand_at_module_level_except_optional_extras_each_in_one_function():
    """The dependency graph is what the top of each file says; an optional extra (torch, llama-cpp, ray, rknn) is
    imported inside the one function that needs it first, so the engine runs without it."""
    late = {name: late_imports(path) for name, path in modules().items()}
    assert [(m, pkg, line) for m, found in late.items() for pkg, line in found if pkg not in OPTIONAL] == []
    homes: dict[str, set] = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    for pkg in {n.split(".")[0] for n in names} & OPTIONAL:
                        homes.setdefault(pkg, set()).add(f"{name}.{fn.name}")
    assert {pkg: where for pkg, where in homes.items() if len(where) > 1} == {}


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


# what happens to a stream line is decided in one place: the session builds the triggers and the line score, and
# asks them after each line. Elsewhere only an evaluation of the score itself (bench/surprisal.py) and the chaos
# bench's oracle of which assessments a run owed (bench/chaos.py, over the journal's lines) may ask them.
STREAM_DECISIONS = {"Triggers": {"pipeline.stream.session", "bench.chaos"},
                    "Surprise": {"pipeline.stream.session", "bench.surprisal"},
                    "after_line": {"pipeline.stream.session", "bench.chaos"}}


def stream_decisions(sources: dict[str, str]) -> dict[str, set[str]]:
    """Which modules build `Triggers` or `Surprise`, or ask a trigger `after_line` (a stream loop of their own)."""
    found: dict[str, set[str]] = {name: set() for name in STREAM_DECISIONS}
    for module, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
                for what in STREAM_DECISIONS:
                    if what in (name, owner):
                        found[what].add(module)
    return found


def test_no_stream_loop_outside_the_stream_session():
    sources = {name: path.read_text() for name, path in modules().items()}
    assert {what: where - STREAM_DECISIONS[what] for what, where in stream_decisions(sources).items()} == \
        {what: set() for what in STREAM_DECISIONS}


def test_a_planted_stream_loop_is_caught():
    """The check can fail: a launcher that counts lines against the triggers itself is named."""
    planted = "def loop(cfg, lines):\n    t = Triggers.of(cfg.replay)\n    return [t.after_line(x) for x in lines]\n"
    found = stream_decisions({"pipeline.stream.replay": planted})
    assert found["Triggers"] == found["after_line"] == {"pipeline.stream.replay"}


# a model is named once: below the launcher, a model's file, converted directory, card and tokenizer come from its
# handle (models/handle.py, `Config.target`, `Config.draft_model`), never from a name resolved again. The handle
# resolves names; the converter and the runner read the file or converted directory they are given.
MODEL_LOOKUPS = ("resolve_gguf", "converted_dir", "from_gguf", "load_card")
MAY_LOOK_UP = {"models.handle", "models.convert", "models.runner"}
MAY_NAME = {"pipeline.config", "models.handle"}        # where a name becomes a handle (`Model.of`)


def model_lookups(sources: dict[str, str]) -> dict[str, set[str]]:
    """Which modules outside bench call a model lookup, by lookup."""
    found: dict[str, set[str]] = {}
    for module, text in sources.items():
        if module.startswith("bench"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name in MODEL_LOOKUPS and module not in MAY_LOOK_UP:
                    found.setdefault(name, set()).add(module)
                owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
                if (owner, name) == ("Model", "of") and module not in MAY_NAME:
                    found.setdefault("Model.of", set()).add(module)
    return found


def test_nothing_below_the_launcher_resolves_a_model_name_its_handle_holds():
    assert model_lookups({name: path.read_text() for name, path in modules().items()}) == {}


def test_a_planted_model_lookup_is_caught():
    """The check can fail: an actor that reads its tokenizer from the name again is named."""
    planted = ("def run(args):\n    tok = Tokenizer.from_gguf(resolve_gguf(args.cfg.model.gguf))\n"
               "    draft = Model.of(args.cfg.draft.model)\n")
    assert model_lookups({"actors.output": planted}) == {"from_gguf": {"actors.output"},
                                                         "resolve_gguf": {"actors.output"},
                                                         "Model.of": {"actors.output"}}


def frozen_dataclasses(source: str) -> set[str]:
    """The classes a module defines under `@dataclass(frozen=True)`."""
    def frozen(d) -> bool:
        return (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dataclass"
                and any(k.arg == "frozen" and getattr(k.value, "value", None) is True for k in d.keywords))
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    return {n.name for n in classes if any(map(frozen, n.decorator_list))}


def untyped_actors(sources: dict[str, str], typed: set[str]) -> list[str]:
    """Every actor module whose module-level `run` is not `run(args: X)`, X one of `typed` (actors/args.py's frozen
    dataclasses) imported from actors.args: an actor is never launched with a dict or keyword arguments."""
    out = []
    for name, source in sources.items():
        tree = ast.parse(source)
        run = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None)
        if run is None:
            out.append(f"{name} has no module-level run(args)")
            continue
        a = run.args
        params = a.posonlyargs + a.args + a.kwonlyargs
        hint = ast.unparse(params[0].annotation) if len(params) == 1 and params[0].annotation else None
        imported = {alias.asname or alias.name for n in tree.body if isinstance(n, ast.ImportFrom)
                    and n.module == "actors.args" for alias in n.names}
        if a.vararg or a.kwarg or hint not in typed or hint not in imported:
            out.append(f"{name}.run({ast.unparse(a)}) at line {run.lineno}: an actor's run takes one argument, "
                       f"annotated with its frozen dataclass of actors/args.py")
    return out


def actor_sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in modules().items()
            if name.startswith("actors.") and name != "actors.args"}


def test_every_actor_runs_on_one_frozen_dataclass_of_actors_args_never_a_dict():
    typed = frozen_dataclasses((ROOT / "actors" / "args.py").read_text())
    assert untyped_actors(actor_sources(), typed) == []


def test_an_actor_plan_carries_the_actors_run_and_its_typed_arguments():
    """ActorPlan (pipeline/launch/plan.py) holds the actor's `run` itself and its arguments typed as `ActorArgs`
    (a tuple of them: several streams' threads), and `ActorArgs` is exactly the dataclasses the actors' runs take."""
    tree = ast.parse((ROOT / "pipeline" / "launch" / "plan.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ActorPlan")
    fields = {n.target.id: ast.unparse(n.annotation) for n in cls.body if isinstance(n, ast.AnnAssign)}
    assert fields == {"name": "str", "run": "Callable[..., None]", "args": "ActorArgs | tuple[ActorArgs, ...]"}
    args = ast.parse((ROOT / "actors" / "args.py").read_text())
    union = next(n.value for n in args.body if isinstance(n, ast.Assign) and n.targets[0].id == "ActorArgs")
    taken = {ast.unparse(arg.annotation) for source in actor_sources().values() for fn in ast.parse(source).body
             if isinstance(fn, ast.FunctionDef) and fn.name == "run" for arg in fn.args.args}
    assert {ast.unparse(n) for n in ast.walk(union) if isinstance(n, ast.Name)} == taken


@pytest.mark.parametrize("planted", ["def run(**kwargs) -> None:", "def run(args: dict) -> None:",
                                     "def run(inboxes, outboxes, cfg, spec, stop) -> None:",
                                     "def run(args: TargetArgs, stop) -> None:"])
def test_a_planted_keyword_actor_is_caught(planted):
    """The check can fail: the target actor's run back on keyword arguments, or a dict, is named."""
    sources = actor_sources()
    sources["actors.target"] = sources["actors.target"].replace("def run(args: TargetArgs) -> None:", planted)
    found = untyped_actors(sources, frozen_dataclasses((ROOT / "actors" / "args.py").read_text()))
    assert len(found) == 1 and found[0].startswith("actors.target.run(")


def test_every_package_is_installed_with_its_data():
    """pyproject's setuptools lists each package by name (a flat layout): a package left out is missing from a
    non-editable install (pipeline/decode/drafts was), and so is a data file beside a module."""
    import tomllib
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in ROOT.glob("*/**/__init__.py")
             if p.parts[len(ROOT.parts)] not in ("tests", ".git")}
    assert found == set(tool["packages"])
    data = {f"{str(p.parent.relative_to(ROOT)).replace('/', '.')}:{p.name}" for p in ROOT.glob("pipeline/**/*")
            if p.suffix in (".json", ".html")}
    assert data == {f"{pkg}:{name}" for pkg, names in tool["package-data"].items() for name in names}

"""Checks on the code itself, run with the suite: streamtrace's imports form no cycle and point
down a table of layers (every import statement counts, the ones inside functions too, since an
upward import hidden in a function is still a tangle), and no function in the package is longer
than 80 lines."""
from __future__ import annotations

from paths import ROOT
import ast
import re
from pathlib import Path

# the installed package's folders: adapters/ is installed as streamtrace.adapters (pyproject.toml)
PACKAGES = {"streamtrace": ROOT / "streamtrace", "streamtrace.adapters": ROOT / "adapters",
            "streamtrace_runner": ROOT / "runner" / "streamtrace_runner"}
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The streamtrace modules ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:   # `from pkg import module` imports that module
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "streamtrace.engine.launch" in graph["streamtrace.adapters.replay"]    # imported inside run_cli
    assert "streamtrace.learner.algorithms" in graph["streamtrace.recipe.recipe"]


def test_streamtrace_imports_have_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The layers, lowest first: a module may import its own package and any package of a lower layer,
# nothing else (docs/architecture.md draws them). The package root's modules are named by file.
LAYERS = [
    {"streamtrace_runner"},              # the jax-free runner distribution: wire, checkpoints, runtime
    {"streamtrace", "units", "addresses", "_imports", "wire", "checkpoints"},   # jax-free basics
    {"arguments"},                       # command-line argument types (with units)
    {"transport"},                       # ZeroMQ clients, subscribers, the echo floor
    {"nn"},                              # models
    {"etrace"},                          # the trace compiler and algorithms
    {"learner"},                         # OnlineLearner: transforms, readouts, programs, slot banks
    {"recipe"},                          # a learner's recipe and its builder
    {"engine"},                          # the streaming server
    {"export", "dashboard", "cluster"},  # built on the engine, side by side (none imports another)
    {"evaluation"},                      # tasks, files, prequential evaluation
    {"adapters"},                        # bridges, the cluster link, replay
    {"commands"},                        # the command line
    {"__main__"},                        # python -m streamtrace
]
EVALUATION = {"tasks", "files", "evaluate"}     # the root's deprecated names of evaluation's modules


def package_of(module: str) -> str:
    """The layer-table name of a module: its subpackage, or the root module's own name."""
    parts = module.split(".")
    if parts[0] == "streamtrace_runner":
        return "streamtrace_runner"
    if len(parts) == 1:
        return "streamtrace"
    name = parts[1]
    return "evaluation" if name in EVALUATION else name


def upward_imports(graph: dict[str, set[str]], layers=None) -> list[str]:
    """Every import that does not point down ``layers`` (an import of an unlisted package too)."""
    layers = LAYERS if layers is None else layers
    level = {p: i for i, group in enumerate(layers) for p in group}
    bad = []
    for module, targets in sorted(graph.items()):
        a = package_of(module)
        for target in sorted(targets):
            b = package_of(target)
            if a == b:
                continue
            if a not in level or b not in level or level[b] >= level[a]:
                bad.append(f"{module} -> {target}")
    return bad


def test_the_layer_check_sees_an_upward_import():
    graph = {"streamtrace.learner.online": {"streamtrace.engine.server"},      # up
             "streamtrace.engine.core": {"streamtrace.learner.online"},        # down
             "streamtrace.export.cli": {"streamtrace.cluster.worker"},       # sideways
             "streamtrace.mystery": {"streamtrace.wire"}}                    # not in the table
    assert upward_imports(graph) == ["streamtrace.export.cli -> streamtrace.cluster.worker",
                                     "streamtrace.learner.online -> streamtrace.engine.server",
                                     "streamtrace.mystery -> streamtrace.wire"]


def test_every_import_points_down_the_layers():
    bad = upward_imports(import_graph())
    assert not bad, "imports that do not point down the layer table (tests/project/test_code_shape.py LAYERS):\n" + \
        "\n".join(bad)


def test_no_function_is_longer_than_80_lines():
    long = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 80 lines (split them into named steps):\n" + "\n".join(long)


# a measured duration ("257 us", "1.2 ms") in package code goes stale: measurements live in docs/
# and bench/RESULTS.md. Format strings and units names ("us", "step p50 us") are fine.
MEASURED = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:us|µs|μs|ms)\b(?! *[\"'|])")


def test_no_measured_durations_in_package_code():
    found = []
    for name, path in sorted(_modules().items()):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if MEASURED.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "measured durations in package code (move them to docs/):\n" + "\n".join(found)


def test_the_duration_pattern_finds_figures_not_format_strings():
    assert MEASURED.search("257 us a step handed off") and MEASURED.search("(~60 us of its step)")
    assert MEASURED.search("takes 1.5 ms") and not MEASURED.search('"| step p50 us |"')
    assert not MEASURED.search("busy_poll_us = 5000") and not MEASURED.search('in_unit(v, unit="us")')


def test_no_reference_to_documents_the_project_does_not_have():
    """Every ``*.md`` named in the package, docs/, README and tests exists in the repo."""
    named = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
    files = [*ROOT.glob("streamtrace/**/*.py"), *ROOT.glob("adapters/*.py"), *ROOT.glob("docs/**/*.md"),
             *ROOT.glob("tests/**/*.py"), ROOT / "README.md"]
    have = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("**/*.md") if ".venv" not in p.parts}
    have |= {"bench/NOTES.md"}      # the retired lab notebook: named with where its text is (git history)
    names = {h.rsplit("/", 1)[-1] for h in have}
    missing = []
    for path in files:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for ref in named.findall(line):
                if ref not in have and ref.rsplit("/", 1)[-1] not in names:
                    missing.append(f"{path.relative_to(ROOT)}:{i}: {ref}")
    assert not missing, "references to documents that are not in the repo:\n" + "\n".join(missing)


def test_the_readme_is_a_short_guide():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move reference material to docs/ (limit 300)"


def test_bench_scripts_import_no_test_file():
    """bench/ shares its helpers through plain modules (timing.py, limits.py), never a pytest file."""
    bad = [f"{p.name}: {line.strip()}" for p in sorted((ROOT / "bench").glob("*.py"))
           for line in p.read_text().splitlines() if re.match(r"\s*(from|import) test_\w+", line)]
    assert not bad, "bench scripts importing pytest files:\n" + "\n".join(bad)

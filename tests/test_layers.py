"""The package's layers, read from its own imports (those inside functions included).

Each package may import only the packages below it (``ALLOWED``), and no two modules may import each
other, directly or through others. An import inside a function is allowed only with a comment on
its line or the line above that starts with ``lazy:`` and says why (a heavy optional dependency, or
what the agent must not load at a process's start). Library modules never parse arguments, print or
exit: that is the ``commands`` package's job. DESIGN.md's "Package layout" describes the same order.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "holoprof"

BASE = {"model", "errors", "_version", "progress", "knobspec"}
_EVERYTHING = {
    "holoprof", "commands", "workflows", "serve", "launch", "exports", "bench", "present", "analyze",
    "store", "api", "checkpoint", "collect", "agent", "examples",
}  # fmt: skip
#: package -> the packages it may import (besides itself and BASE). ``holoprof`` is the facade
#: (``holoprof/__init__.py``); a name with a dot names one module of a package.
ALLOWED: dict[str, set[str]] = {
    "cli": _EVERYTHING,
    "commands": _EVERYTHING,
    "workflows": {"launch", "exports", "present", "analyze", "store"},
    "serve": {"present", "analyze", "store"},
    "exports": {"present", "analyze", "store"},
    "present": {"analyze", "bench"},
    "analyze": {"store"},
    "bench": {"store"},
    "store": set(),
    # the job's side: what runs inside every traced process
    "holoprof": {"api", "store", "analyze", "exports"},
    "checkpoint": {"api"},
    "api": {"launch", "collect", "agent", "store.raw", "store.rundir", "store.convert", "store.compact"},
    "launch": {"collect", "agent", "store"},
    "collect": {"agent", "store.raw", "store.mailbox", "store.native_dumps"},
    "agent": {"store.raw"},
    "examples": set(),
}
#: where parsing arguments, printing and exiting are allowed
COMMAND_LAYER = {"cli", "commands"}
#: scripts run as programs rather than imported (they may print and exit)
SCRIPTS = {
    "holoprof.examples.demo_train",
    "holoprof.launch.boot.sitecustomize",
    "holoprof.collect.io_native.build",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _target(module: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: None if is_pkg else -1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for name in names:
        if name != "holoprof" and not name.startswith("holoprof."):
            continue
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


def _comments(source: str) -> dict[int, str]:
    return {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.depth = 0
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module != "__future__":
            self.found.append((node, self.depth > 0))


def _said_why(lines: list[str], comments: dict[int, str], lineno: int) -> bool:
    """A ``lazy:`` comment on the import's line or in the block of imports and comments just above it
    (one comment may explain a group of imports)."""
    n = lineno
    while n >= 1:
        if "lazy:" in comments.get(n, ""):
            return True
        above = lines[n - 2].strip() if n >= 2 else ""
        if not above.startswith(("import ", "from ", "#", ")")) and not above.endswith((",", "(")):
            return False
        n -= 1
    return False


def _is_type_checking(tree: ast.Module) -> set[int]:
    """Lines of imports under ``if TYPE_CHECKING:`` (annotations only: not an import at run time)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for sub in node.body:
                for n in ast.walk(sub):
                    lines.add(getattr(n, "lineno", -1))
    return lines


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    unexplained: list[str] = []
    for module, path in MODULES.items():
        source = path.read_text()
        tree = ast.parse(source)
        comments = _comments(source)
        lines = source.splitlines()
        typing_only = _is_type_checking(tree)
        visitor = _Imports()
        visitor.visit(tree)
        for node, inner in visitor.found:
            if node.lineno in typing_only:
                continue
            targets = [t for t in _target(module, node, path.name == "__init__.py") if t != module]
            edges[module].update(targets)
            inline = any(
                "lazy:" in comments.get(n, "") for n in range(node.lineno, (node.end_lineno or 0) + 1)
            )
            if inner and not inline and not _said_why(lines, comments, node.lineno):
                unexplained.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return edges, unexplained


def _package(module: str) -> str:
    parts = module.split(".")
    return "holoprof" if len(parts) == 1 else parts[1]


def _allowed(source: str, target: str) -> bool:
    src, dst = _package(source), _package(target)
    if dst in BASE or (src == dst and source != "holoprof"):
        return True
    allowed = ALLOWED.get(src, set())
    short = target.removeprefix("holoprof.")
    return dst in allowed or any(short == a or short.startswith(a + ".") for a in allowed if "." in a)


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in MODULES} - BASE
    assert packages <= set(ALLOWED), f"packages with no layer in ALLOWED: {packages - set(ALLOWED)}"


def test_no_upward_import() -> None:
    edges, _ = _graph()
    wrong = sorted(f"{s} imports {t}" for s, ts in edges.items() for t in ts if not _allowed(s, t))
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_circle() -> None:
    edges, _ = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(", ".join(c) for c in circles)


def test_imports_inside_functions_say_why() -> None:
    _, unexplained = _graph()
    assert not unexplained, (
        "holoprof imports inside functions without a `# lazy: why` comment:\n" + "\n".join(unexplained)
    )


def test_only_commands_parse_print_and_exit() -> None:
    wrong = []
    for module, path in MODULES.items():
        if _package(module) in COMMAND_LAYER or module in SCRIPTS:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            what = None
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if "argparse" in names:
                    what = "imports argparse"
            elif isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if func in ("print", "sys.exit", "exit", "quit") or func.endswith(".add_argument"):
                    what = f"calls {func}"
            if what:
                wrong.append(f"{path.relative_to(SRC)}:{node.lineno} {what}")
    assert not wrong, "library modules that parse, print or exit:\n" + "\n".join(wrong)


def test_the_layer_check_sees_a_violation(tmp_path: Path) -> None:
    """The checks above can fail: an analysis importing a presenter is refused."""
    assert not _allowed("holoprof.analyze.report", "holoprof.present.terminal")
    assert not _allowed("holoprof.store.reader", "holoprof.analyze.steps")
    assert not _allowed("holoprof.agent.core", "holoprof.collect.torch")
    assert not _allowed("holoprof.store.raw", "holoprof")
    assert _allowed("holoprof.present.terminal", "holoprof.analyze.findings")
    assert _allowed("holoprof.collect.torch", "holoprof.store.raw")
    assert not _allowed("holoprof.collect.torch", "holoprof.store.reader")


MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 500


def _sizes() -> list[tuple[str, str, int, bool]]:
    """(where, kind, lines, explained) of every function and class."""
    out = []
    for path in MODULES.values():
        source = path.read_text()
        comments = _comments(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                said = "long:" in comments.get(node.lineno, "") + comments.get(first - 1, "")
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                out.append((f"{path.relative_to(SRC)}:{node.lineno} {node.name}", kind, size, said))
    return out


def test_functions_and_classes_stay_small() -> None:
    """No function over ~80 lines and no class over ~500 without a ``# long: why`` comment above it."""
    big = [
        f"{where} ({size} lines)"
        for where, kind, size, said in _sizes()
        if not said and size > (MAX_CLASS_LINES if kind == "class" else MAX_FUNCTION_LINES)
    ]
    assert not big, "too long, split them or say why with `# long:`:\n" + "\n".join(sorted(big))

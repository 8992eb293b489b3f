"""The shape of the tree: no import circle among minite's modules (kernels/ is minite.kernels), file
names that say what each file holds, and a product that speaks of itself as it is now.

Imports inside functions count too: a lazy import hides a circle from Python's loader, not from a
reader, who still cannot understand one module without the other. What changed and when lives in git
history: no file of the product labels a fact by a numbered round of work ("session 19", "issue 6",
"stop 18") or by a round suffix on a file name (`kernels_h200_s19.md`)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "kernels":
        parts = ["minite", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (at any depth of the file)."""
    files = {_module_name(p): p for d in ("minite", "kernels") for p in (REPO / d).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [target, *(f"{target}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            graph[name].update(c for c in candidates if c in files and c != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    graph = import_graph()
    assert "minite.kernels.moe" in graph and graph["minite.kernels.moe"], "the scan found no imports"
    assert cycles(graph) == []


PRODUCT = ("README.md", "docs", "kernels", "minite", "results", "scripts", "configs")
ROUND_LABEL = re.compile(
    r"\b(?:sessions?[ -]?\d+|rounds? \d+|stops? \d+|issues? ?#?\d+)\b|_s\d+[a-z]?\b", re.IGNORECASE
)


def round_labels(text: str) -> list[str]:
    return [m.group(0) for m in ROUND_LABEL.finditer(text)]


def test_round_label_pattern():
    hits = "kernels_h200_s19b.md; in session 19; session-19 tiles; Issue 6 sweep; (stop 18); round 3"
    assert round_labels(hits) == ["_s19b", "session 19", "session-19", "Issue 6", "stop 18", "round 3"]
    assert round_labels("max_seq 4096 tokens, 16x16 blocks, s_enc, top-8 experts, step 18") == []


def test_no_round_labels_in_the_product():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to list the tracked files")
    files = subprocess.run(
        ["git", "ls-files", "-z", "--", *PRODUCT], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    assert len(files) > 100, "the scan found no files"
    found = []
    for name in filter(None, files):
        path = REPO / name
        found += [f"{name}: file name"] if round_labels(path.name) else []
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in ROUND_LABEL.finditer(text)
        ]
    assert found == []




def shared_basenames(paths: list[Path]) -> dict[str, set[str]]:
    """basename -> the folders holding a file of that name, for names held by more than one folder."""
    folders: dict[str, set[str]] = {}
    for p in paths:
        if p.name != "__init__.py":
            folders.setdefault(p.name, set()).add(p.parent.as_posix())
    return {name: where for name, where in folders.items() if len(where) > 1}


def test_shared_basename_finder():
    paths = [Path("a/x.py"), Path("b/x.py"), Path("a/__init__.py"), Path("b/__init__.py"), Path("a/y.py")]
    assert shared_basenames(paths) == {"x.py": {"a", "b"}}


def test_no_new_shared_basename():
    paths = [p.relative_to(REPO) for d in ("minite", "kernels") for p in (REPO / d).rglob("*.py")]
    assert len(paths) > 100, "the scan found no files"
    found = shared_basenames(paths)
    assert found == {}, "a file's name says what it holds: rename it (or its twin) instead of sharing a name"


TOP_LEVEL_MODULES = 8  # configuration, recipes, the CLI and the like; a concept of several files is a package


def test_few_modules_at_the_top():
    top = sorted(p.name for p in (REPO / "minite").glob("*.py") if p.name != "__init__.py")
    assert "cli.py" in top, "the scan found no modules"
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} modules at minite/'s top: {top}; make a package"


LONG_MODULE = 600  # lines
REASON = "Why one module"


def test_a_long_module_says_why_at_its_top():
    """A module of minite/ or kernels/ over ~600 lines states, in its docstring, why it is not split."""
    files = [p for d in ("minite", "kernels") for p in (REPO / d).rglob("*.py")]
    assert len(files) > 100, "the scan found no files"
    assert any(p.parent == REPO / "kernels" for p in files), "the scan found no kernel modules"
    unexplained = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > LONG_MODULE and REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(REPO)}: {text.count(chr(10))} lines")
    assert unexplained == [], f"say why at the top ({REASON!r} in the docstring) or split the module"

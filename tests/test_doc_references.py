"""Every `slime_<pkg>.module.name` and `tests/...` path that a workspace member's source names exists.

Docstrings and comments point a reader at the module that does the work (`slime_rollout.engines.launch.sglang.
build_sglang_command`) or at a fixture (`tests/fixtures/sglang-wire/README.md`); after a module moves, a stale
pointer sends a newcomer nowhere. The check is static (nothing is imported): a dotted name resolves when its
longest module prefix is a file of some member's `src/`, the next part is a top-level name of that module (a def,
class, assignment or import), and a part after a class is a name bound in the class body.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted([*REPO.glob("packages/*/src"), *REPO.glob("apps/*/src")])

_DOTTED = re.compile(r"\bslime_(?:core|rollout|train_fsdp|train_megatron|convert|envs|app)(?:\.[A-Za-z_]\w*)+")
_TEST_PATH = re.compile(r"\btests/[\w/.\-]+\.(?:md|json|jsonl|py)\b")


def _module_file(dotted: str) -> pathlib.Path | None:
    rel = pathlib.Path(*dotted.split("."))
    for src in SOURCES:
        for path in (src / rel.with_suffix(".py"), src / rel / "__init__.py"):
            if path.is_file():
                return path
    return None


def _bound_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds (defs, classes, assignments, imports), each with its node."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # guarded definitions (TYPE_CHECKING, optional imports)
            for block in (node.body, getattr(node, "orelse", []), *[h.body for h in getattr(node, "handlers", [])]):
                names.update(_bound_names(block))
    return names


@functools.cache
def _module_names(path: pathlib.Path) -> dict[str, ast.AST]:
    return _bound_names(ast.parse(path.read_text(), str(path)).body)


def resolves(dotted: str) -> bool:
    """Whether `dotted` names a module of the workspace, or a name bound in one (see the module docstring)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        node = _module_names(path).get(rest[0])
        if node is None:
            return False
        if len(rest) > 1 and isinstance(node, ast.ClassDef):
            return rest[1] in _bound_names(node.body)
        return True
    return False


def stale_references(sources: list[pathlib.Path], root: pathlib.Path = REPO) -> list[str]:
    """`file:line: reference` for each dotted name or test path in `sources`' Python files that does not exist.

    The keys of `slime_rollout.plugins.FLAT_PATH_ALIASES` are old paths on purpose and are not checked.
    """
    from slime_rollout.plugins import FLAT_PATH_ALIASES

    bad = []
    for src in sources:
        for path in sorted(src.rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                where = f"{path.relative_to(root)}:{number}"
                for ref in _DOTTED.findall(line):
                    if ref not in FLAT_PATH_ALIASES and not resolves(ref):
                        bad.append(f"{where}: {ref}")
                bad += [f"{where}: {ref}" for ref in _TEST_PATH.findall(line) if not (root / ref).exists()]
    return bad


def test_every_named_module_and_fixture_exists():
    bad = stale_references(SOURCES)
    assert not bad, "stale references (moved or renamed?):\n" + "\n".join(bad)


def test_a_moved_module_and_a_missing_fixture_are_found(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text(
        '"""See slime_rollout.engines.commands.build_sglang_command and tests/fixtures/sglang-wire/CONTRACT.md;\n'
        "slime_rollout.engines.launch.sglang.build_sglang_command, slime_core.registry.Registry.get and\n"
        'tests/fixtures/sglang-wire/README.md exist."""\n'
    )
    (tmp_path / "tests" / "fixtures" / "sglang-wire").mkdir(parents=True)
    (tmp_path / "tests" / "fixtures" / "sglang-wire" / "README.md").write_text("")
    assert stale_references([src], root=tmp_path) == [
        "src/pkg/mod.py:1: slime_rollout.engines.commands.build_sglang_command",
        "src/pkg/mod.py:1: tests/fixtures/sglang-wire/CONTRACT.md",
    ]
    assert not resolves("slime_core.registry.Registry.lookup")

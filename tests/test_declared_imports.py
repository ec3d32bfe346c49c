"""Every import in a workspace package's source resolves to something the package declares.

The per-package isolation runs in CI (`.ci/run`) install one package with only its declared dependencies and
collect its tests: that catches an undeclared import at module level, but not one inside a function that no
collected test calls (most heavy imports here are lazy). This test reads every `import` statement of every
member's `src/` (lazy ones included) and checks that the imported top-level module is the standard library, the
package itself, or provided by a distribution in the closure of the package's declared dependencies (extras
included, environment markers evaluated here). Imports inside `if TYPE_CHECKING:` or a `try` that catches
`ImportError` are optional by construction and skipped.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import pathlib
import re
import sys
import tomllib

from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parents[1]

# Top-level modules of distributions that the CPU workspace does not install (GPU extras), with their
# distribution names: `packages_distributions()` cannot know them.
NOT_INSTALLED = {
    "sglang": "sglang",
    "sglang_router": "sglang-router",
    "sgl_kernel": "sglang",
    "megatron": "megatron-core",
    "transformer_engine": "transformer-engine",
    "torch_memory_saver": "torch-memory-saver",
    "flash_attn": "flash-attn",
}

_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _members() -> list[pathlib.Path]:
    """The workspace members' directories (each with a pyproject.toml and a src/ folder)."""
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    out = []
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        out += [p for p in sorted(REPO.glob(pattern)) if (p / "pyproject.toml").is_file() and (p / "src").is_dir()]
    return out


@functools.cache
def _module_dists() -> dict[str, frozenset[str]]:
    """Top-level module name → normalized names of the distributions that provide it."""
    table = {mod: {_norm(d) for d in dists} for mod, dists in md.packages_distributions().items()}
    for mod, dist in NOT_INSTALLED.items():
        table.setdefault(mod, set()).add(dist)
    for member in _members():  # editable installs: the finder's metadata does not list their modules
        dist = _norm(tomllib.loads((member / "pyproject.toml").read_text())["project"]["name"])
        for top in _own_modules(member):
            table.setdefault(top, set()).add(dist)
    return {mod: frozenset(dists) for mod, dists in table.items()}


def _own_modules(member: pathlib.Path) -> set[str]:
    src = member / "src"
    return {p.name.removesuffix(".py") for p in src.iterdir() if p.is_dir() or p.suffix == ".py"}


def _requires(dist: str, extras: frozenset[str]) -> set[tuple[str, frozenset[str]]]:
    """The distributions `dist[extras]` requires here (markers evaluated), as (name, extras); none if absent."""
    try:
        lines = md.requires(dist) or []
    except md.PackageNotFoundError:
        return set()
    out = set()
    for line in lines:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            out.add((_norm(req.name), frozenset(req.extras)))
    return out


def _closure(dist: str, extras: frozenset[str]) -> set[str]:
    """`dist` and every distribution it needs, transitively."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(_norm(dist), extras)]
    while todo:
        item = todo.pop()
        if item in seen:
            continue
        seen.add(item)
        todo += _requires(*item)
    return {name for name, _ in seen}


def _is_optional(parents: list[ast.AST]) -> bool:
    """Whether the import under `parents` (outermost first, the import's parent last) is guarded.

    Only a `try`'s body is guarded by its handlers: an import in a handler, `else` or `finally` runs unguarded.
    """
    for node, child in zip(parents, parents[1:] + [None], strict=True):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
        if isinstance(node, ast.Try) and any(child is stmt for stmt in node.body):
            for handler in node.handlers:
                caught = handler.type
                names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
                if caught is None or any(getattr(n, "id", getattr(n, "attr", "")) in _OPTIONAL for n in names):
                    return True
    return False


def _imports(path: pathlib.Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, optional) for every absolute import statement in the file."""
    out = []
    stack: list[tuple[ast.AST, list[ast.AST]]] = [(ast.parse(path.read_text(), str(path)), [])]
    while stack:
        node, parents = stack.pop()
        stack += [(child, [*parents, node]) for child in ast.iter_child_nodes(node)]
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, _is_optional([*parents, node])) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, _is_optional([*parents, node])))
    return out


def undeclared_imports(member: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
    """`file:line: module (why)` for each import of the member's source that its declared dependencies lack.

    Paths in the lines are relative to `root`.
    """
    project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
    extras = frozenset(project.get("optional-dependencies", {}))
    allowed = _closure(project["name"], extras)
    own = _own_modules(member)
    bad = []
    for path in sorted((member / "src").rglob("*.py")):
        for line, module, optional in _imports(path):
            top = module.split(".")[0]
            if optional or top in own or top in sys.stdlib_module_names or top == "__future__":
                continue
            where = f"{path.relative_to(root)}:{line}: {module}"
            dists = _module_dists().get(top)
            if dists is None:
                bad.append(f"{where} (nothing installed provides {top!r}; declare it or list it in NOT_INSTALLED)")
            elif not dists & allowed:
                bad.append(f"{where} (from {', '.join(sorted(dists))}, not a dependency of {project['name']})")
    return bad


def test_every_member_is_checked():
    names = {m.name for m in _members()}
    assert {"slime-core", "slime-rollout", "slime-train-fsdp", "slime-train-megatron", "train"} <= names, names


def test_every_import_is_declared():
    bad = [line for member in _members() for line in undeclared_imports(member)]
    assert not bad, "undeclared imports:\n" + "\n".join(bad)


def _core_member(tmp_path: pathlib.Path, source: str) -> pathlib.Path:
    """A member `pkg` declaring slime-core's dependencies (its name is slime-core), with `source` as its module."""
    member = tmp_path / "pkg"
    (member / "src" / "pkg").mkdir(parents=True)
    (member / "pyproject.toml").write_text('[project]\nname = "slime-core"\nversion = "0"\n')
    (member / "src" / "pkg" / "mod.py").write_text(source)
    return member


def test_an_undeclared_lazy_import_is_found(tmp_path):
    source = (
        "import torch\n\ndef f():\n    import transformers\n\ntry:\n    import peft\nexcept ImportError:\n    pass\n"
    )
    bad = undeclared_imports(_core_member(tmp_path, source), root=tmp_path)
    # slime-core declares torch; transformers is imported lazily and undeclared; peft is optional (guarded).
    assert bad == ["pkg/src/pkg/mod.py:4: transformers (from transformers, not a dependency of slime-core)"], bad


def test_an_import_in_an_import_error_handler_is_not_guarded(tmp_path):
    source = (
        "def f():\n    try:\n        import peft\n    except ImportError:\n        import transformers\n"
        "    else:\n        import accelerate\n    finally:\n        import datasets\n"
    )
    bad = undeclared_imports(_core_member(tmp_path, source), root=tmp_path)
    # Only the try body (peft) is guarded; the fallback, else and finally imports run whatever happened.
    assert sorted(line.split(" (")[0] for line in bad) == [
        "pkg/src/pkg/mod.py:5: transformers",
        "pkg/src/pkg/mod.py:7: accelerate",
        "pkg/src/pkg/mod.py:9: datasets",
    ], bad

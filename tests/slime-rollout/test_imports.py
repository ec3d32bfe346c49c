"""The import graph of slime_rollout has one direction (no cycles between its modules and subpackages).

Read from the source with `ast` (lazy imports inside functions count too): e.g. the engines and the weight
updaters meet only in `slime_rollout.engines.wire`, and `engines.process <- engines.router <- engines.launch`.
"""

import ast
import pathlib

import pytest

import slime_rollout

ROOT = pathlib.Path(slime_rollout.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(*, modules: bool = False) -> dict[str, set[str]]:
    """`slime_rollout.<x>` -> the `slime_rollout.<y>` it imports.

    Subpackages count as one node, or with `modules` every module is a node (an imported name resolves to the
    longest module path it starts with).
    """
    known = {_module_name(p) for p in ROOT.rglob("*.py")}

    def node(name: str) -> str:
        if not modules:
            return ".".join(name.split(".")[:2])
        while name not in known:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = node(_module_name(path))
        for n in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else []
            if isinstance(n, ast.ImportFrom) and n.module:
                names = [f"{n.module}.{a.name}" for a in n.names]
            for name in names:
                if name.startswith("slime_rollout.") and node(name) != src:
                    graph.setdefault(src, set()).add(node(name))
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*path[path.index(m) :], m] if m in path else [n, m]
            if m not in state and (cycle := visit(m, [*path, m])):
                return cycle
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n, [n])):
            return cycle
    return None


@pytest.mark.parametrize("modules", [False, True], ids=["subpackages", "modules"])
def test_no_import_cycle(modules):
    graph = _graph(modules=modules)
    assert _find_cycle(graph) is None, f"import cycle: {' -> '.join(_find_cycle(graph))}"


def test_engine_launch_router_process_direction():
    graph = _graph(modules=True)
    assert "slime_rollout.engines.router" in graph["slime_rollout.engines.launch.group"]
    assert "slime_rollout.engines.process" in graph["slime_rollout.engines.launch.launcher"]
    # The router checks that the server on its port is its own (listeners: /proc only, no slime_rollout import).
    assert graph["slime_rollout.engines.router"] == {"slime_rollout.engines.process", "slime_rollout.engines.listeners"}
    assert "slime_rollout.engines.process" not in graph and "slime_rollout.engines.listeners" not in graph


def test_wire_is_a_leaf_that_engines_and_weight_sync_share():
    graph = _graph(modules=True)
    assert "slime_rollout.engines.wire" not in graph  # imports nothing of slime_rollout
    assert "slime_rollout.engines.wire" in graph["slime_rollout.engines.engine_client"]
    assert "slime_rollout.engines.wire" in graph["slime_rollout.engines.reference.routes.weights"]
    assert "slime_rollout.engines.wire" in graph["slime_rollout.weight_sync.updaters"]
    # Engines never reach into the trainer side of a push.
    assert not any(dst.startswith("slime_rollout.weight_sync") for dst in _graph()["slime_rollout.engines"])


def test_subpackages_import_downward():
    graph = _graph()
    assert graph["slime_rollout.weight_sync"] <= {"slime_rollout.engines", "slime_rollout.runtime"}
    assert graph["slime_rollout.runtime"] <= {"slime_rollout.plugins"}
    assert "slime_rollout.generation" not in graph["slime_rollout.data"]
    assert "slime_rollout.plugins" not in graph  # the plugin loader sits below everything it loads


def test_a_cycle_would_be_found():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_documented_multi_turn_plugin_path_still_loads():
    # `--custom-generate-function-path slime_rollout.multi_turn.generate` is in users' configs (MIGRATION, examples).
    from slime_rollout.generation import multi_turn
    from slime_rollout.plugins import load_function

    assert load_function("slime_rollout.multi_turn.generate") is multi_turn.generate
    assert load_function("slime_rollout.multi_turn.env_reward") is multi_turn.env_reward


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("slime_rollout.rollout.generate_rollout", "slime_rollout.generation.rollout.generate_rollout"),
        ("slime_rollout.data_source.RolloutDataSource", "slime_rollout.data.source.RolloutDataSource"),
        ("slime_rollout.sft.generate_sft_rollout", "slime_rollout.data.sft.generate_sft_rollout"),
        ("slime_rollout.opd.reward_func", "slime_rollout.generation.opd.reward_func"),
    ],
)
def test_plugin_paths_from_before_the_split_still_load(old, new):
    # The earlier defaults of --rollout-function-path / --data-source-path sit in saved run configs.
    from slime_core.plugins import load_function as core_load_function
    from slime_rollout.plugins import load_function

    assert load_function(old) is load_function(new)
    assert core_load_function(old, flag="--rollout-function-path") is load_function(new)


def test_no_flat_module_left_beside_the_subpackages():
    flat = sorted(p.stem for p in ROOT.glob("*.py"))
    # entries (the package's registry records) and preflight (its checks) are the package's own entry points.
    assert flat == ["__init__", "base_types", "entries", "multi_turn", "plugins", "preflight"]

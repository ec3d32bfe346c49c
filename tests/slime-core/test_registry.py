"""The generic open registry: lazy entry points, duplicate and unknown names, records and bare factories."""

import dataclasses
import subprocess
import sys
import types

import pytest

from slime_core import registry
from slime_core.registry import DuplicateNameError, Entry, Problem, Registry, UnknownNameError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Spec(Entry):
    fast: bool = False


def _ep(name, value, dist, obj=None):
    loads = []

    def load():
        loads.append(name)
        return obj

    return types.SimpleNamespace(name=name, value=value, group="slime.things",
                                 dist=types.SimpleNamespace(name=dist), load=load, loads=loads)  # fmt: skip


def _registry(monkeypatch, eps, builtins=None):
    installed = {"slime.things": eps}
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: installed.get(group, []))
    return Registry("slime.things", flag="--thing", kind="thing", entry_type=_Spec, builtins=builtins)


def test_names_read_metadata_only_and_records_load_once(monkeypatch, caplog):
    fast = _Spec(name="fast_one", fast=True)
    ep = _ep("fast_one", "pkg:FAST", "pkg-a", fast)
    reg = _registry(monkeypatch, [ep], builtins={"dict_thing": "builtins:dict"})
    assert reg.names() == ["dict_thing", "fast_one"] and ep.loads == []  # listing imports nothing
    assert reg.get("fast_one") is fast and reg.get("fast_one") is fast
    assert ep.loads == ["fast_one"]
    with caplog.at_level("INFO", logger="slime_core.registry"):
        wrapped = reg.get("dict_thing")  # a bare factory gets the default (conservative) capabilities
    assert (wrapped.name, wrapped.load(), wrapped.fast) == ("dict_thing", dict, False)
    assert "names a bare factory: default capabilities of _Spec" in caplog.text


def test_a_bare_factory_of_a_plain_entry_is_wrapped_without_a_log_line(monkeypatch, caplog):
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [])
    reg = Registry("slime.things", flag="--thing", kind="thing", entry_type=Entry, builtins={"d": "builtins:dict"})
    with caplog.at_level("INFO", logger="slime_core.registry"):
        assert reg.get("d").load() is dict
    assert "bare factory" not in caplog.text  # e.g. every run's slime.preflight entry of slime-rollout


def test_the_same_name_from_two_distributions_names_both(monkeypatch):
    reg = _registry(monkeypatch, [_ep("x", "pkg_a:X", "pkg-a"), _ep("x", "pkg_b:X", "pkg-b")])
    with pytest.raises(DuplicateNameError, match=r"'x' is declared by two .*distribution pkg-a \(pkg_a:X\) and "
                                                  r"distribution pkg-b \(pkg_b:X\)"):  # fmt: skip
        reg.names()


def test_unknown_name_lists_the_registered_ones_and_the_group(monkeypatch):
    reg = _registry(monkeypatch, [_ep("b", "pkg:B", "pkg-b", _Spec(name="b"))], builtins={"a": "builtins:dict"})
    message = r"""--thing: unknown thing 'c' \(registered: a, b; a package adds one under \[project.entry-points."""
    with pytest.raises(UnknownNameError, match=message + r'"slime.things"\]\)'):
        reg.get("c")
    with pytest.raises(UnknownNameError):
        reg.check_name("c")
    reg.check_name("a")


def test_a_record_of_another_name_or_type_is_refused(monkeypatch):
    reg = _registry(monkeypatch, [_ep("a", "pkg:A", "pkg-a", _Spec(name="b")), _ep("n", "pkg:N", "pkg-a", 3)])
    with pytest.raises(TypeError, match=r"entry point slime.things:a of distribution pkg-a .* named 'b', not 'a'"):
        reg.get("a")
    with pytest.raises(TypeError, match=r"expected a _Spec or a callable, got 3"):
        reg.get("n")
    with pytest.raises(TypeError, match="expected a _Spec"):
        reg.register(Entry(name="plain"))


def test_preflight_hooks_must_return_problems():
    ok = Entry(name="ok", preflight=lambda cfg: [Problem(message=f"lr {cfg}", severity="note")])
    assert ok.check(0.1) == [Problem(message="lr 0.1", severity="note")]
    with pytest.raises(TypeError, match="'bad' preflight must return a list of Problem"):
        Entry(name="bad", preflight=lambda cfg: "fine").check(None)
    with pytest.raises(ValueError, match="severity must be 'error' or 'note'"):
        Problem(message="x", severity="warning")


def test_listing_the_builtin_names_imports_no_provider():
    code = (
        "import sys\nfrom slime_core.extensions import TRAIN_BACKENDS, ROLLOUT_ENGINES, REWARDS\n"
        "names = TRAIN_BACKENDS.names() + ROLLOUT_ENGINES.names() + REWARDS.names()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('slime_train', 'slime_rollout', 'torch'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_entry_points_are_read_once_until_refreshed(monkeypatch):
    reads = []

    def entry_points(group):
        reads.append(group)
        return []

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", entry_points)
    reg = Registry("slime.things", flag="--thing", kind="thing", entry_type=_Spec, builtins={"a": "builtins:dict"})
    for _ in range(3):
        reg.check_name("a")
    assert reads == ["slime.things"]  # the config checks names on every build: one scan per process
    reg.refresh()
    reg.check_name("a")
    assert reads == ["slime.things", "slime.things"]


def test_source_entry_points_read_a_src_layout_pyproject_without_importing(tmp_path, monkeypatch):
    dist = tmp_path / "packages" / "slime-fake"
    (dist / "src" / "slime_fake_src").mkdir(parents=True)
    (dist / "src" / "slime_fake_src" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (dist / "pyproject.toml").write_text(
        '[project]\nname = "slime-fake"\n[project.entry-points."slime.things"]\na = "slime_fake_src.e:A"\n'
    )
    flat = tmp_path / "flat" / "slime_fake_flat"  # not a src layout: whatever pyproject sits above is not its own
    flat.mkdir(parents=True)
    (flat / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text('[project.entry-points."slime.things"]\nb = "x:B"\n')
    monkeypatch.syspath_prepend(str(dist / "src"))
    monkeypatch.syspath_prepend(str(tmp_path / "flat"))
    assert registry.source_entry_points("slime_fake_src", "slime.things") == {"a": "slime_fake_src.e:A"}
    assert registry.source_entry_points("slime_fake_src", "slime.other") == {}
    assert registry.source_entry_points("slime_fake_flat", "slime.things") == {}
    assert registry.source_entry_points("slime_not_installed_anywhere", "slime.things") == {}
    assert "slime_fake_src" not in sys.modules
    (dist / "pyproject.toml").write_text("[project\n")
    with pytest.raises(ValueError, match=r"slime-fake/pyproject.toml: not valid TOML"):
        registry.source_entry_points("slime_fake_src", "slime.things")

"""The original's `slime.agent` modules this slime does not carry fail in one line naming them and MIGRATION.md.

Issue 27: `from slime.agent.adapters import AnthropicAdapter` raised a bare "No module named
'slime.agent.adapters.anthropic'" that said neither that the module is the original's nor where to look.
"""

import importlib
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Python modules of THUDM/slime's `slime/agent/` tree (624b824a8: `git ls-tree -r HEAD --name-only slime/agent`).
ORIGINAL_AGENT_MODULES = [
    "slime.agent",
    "slime.agent.adapters",
    "slime.agent.adapters.anthropic",
    "slime.agent.adapters.common",
    "slime.agent.adapters.openai",
    "slime.agent.aiohttp_threaded",
    "slime.agent.harness",
    "slime.agent.harness.claude_code",
    "slime.agent.harness.codex",
    "slime.agent.harness.common",
    "slime.agent.parsing",
    "slime.agent.sandbox",
    "slime.agent.trajectory",
]
CARRIED = {"slime.agent", "slime.agent.adapters", "slime.agent.adapters.openai"}
PARAGRAPH = "Not carried from slime.agent"


def _refused(module: str) -> str:
    """The message importing `module` raises (asserting it is a ModuleNotFoundError of one line)."""
    sys.modules.pop(module, None)
    with pytest.raises(ModuleNotFoundError) as e:
        importlib.import_module(module)
    message = str(e.value)
    assert "\n" not in message
    assert e.value.name is not None and module.startswith(e.value.name)
    return message


@pytest.mark.parametrize("module", sorted(set(ORIGINAL_AGENT_MODULES) - CARRIED))
def test_each_module_not_carried_names_itself_and_the_migration_paragraph(module):
    message = _refused(module)
    # A submodule of the harness package is refused by the package, which is what is missing.
    missing = "slime.agent.harness" if module.startswith("slime.agent.harness") else module
    assert message.startswith(f"No module named '{missing}': this slime does not carry it (in the original slime: ")
    assert message.endswith(f"MIGRATION.md 'Plugins', paragraph '{PARAGRAPH}' says what to use instead")


@pytest.mark.parametrize(
    ("name", "module", "what"),
    [
        ("AnthropicAdapter", "slime.agent.adapters.anthropic", "AnthropicAdapter"),
        ("BaseAdapter", "slime.agent.adapters.common", "BaseAdapter"),
    ],
)
def test_the_original_adapters_names_fail_in_one_line(name, module, what):
    with pytest.raises(ModuleNotFoundError) as e:
        exec(f"from slime.agent.adapters import {name}", {})
    assert str(e.value).startswith(f"No module named '{module}': this slime does not carry it")
    assert what in str(e.value) and PARAGRAPH in str(e.value)
    # What is carried still imports, and an unknown name is a plain AttributeError.
    from slime.agent.adapters import OpenAIAdapter
    from slime_rollout.agent import OpenAIAdapter as RolloutAdapter

    assert OpenAIAdapter is RolloutAdapter
    adapters = importlib.import_module("slime.agent.adapters")
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchAdapter'"):
        adapters.NoSuchAdapter  # noqa: B018


def test_the_migration_paragraph_exists_and_lists_every_module():
    text = (REPO / "MIGRATION.md").read_text()
    start = text.index(f"\n{PARAGRAPH}: ")
    paragraph = text[start : text.index("\n\n", start)]
    listed = set(re.findall(r"`(slime\.agent\.[\w.]+)`", paragraph))
    assert listed == {m for m in set(ORIGINAL_AGENT_MODULES) - CARRIED if not m.startswith("slime.agent.harness.")}


def test_a_plugin_path_into_one_is_named_as_the_originals():
    from slime_core.plugins import PluginError, load_function

    with pytest.raises(PluginError, match=r"'slime.agent.sandbox.exec_and_wait' is the original slime's; this version"):
        load_function("slime.agent.sandbox.exec_and_wait", flag="--custom-generate-function-path")


def test_a_plugin_importing_one_is_named_at_its_own_import_line(tmp_path, monkeypatch):
    # The stub raises inside slime-compat; the error named the stub's line (`_not_carried.py:31`, in an editable
    # install), not the plugin's `from slime.agent.sandbox import ...` that a user has to change.
    from slime_core.plugins import PluginError, forget_loaded_plugins, load_function

    plugin = tmp_path / "agent_plugin_q27.py"
    plugin.write_text(
        "import json\nfrom slime.agent.sandbox import Sandbox\n\n\nasync def gen(args, sample, p):\n    ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_loaded_plugins()
    with pytest.raises(PluginError) as e:
        load_function("agent_plugin_q27.gen", flag="--custom-generate-function-path")
    assert str(e.value).startswith(
        f"--custom-generate-function-path: importing module 'agent_plugin_q27' failed at {plugin}:2: No module named "
        "'slime.agent.sandbox': this slime does not carry it"
    )
    assert e.value.missing_dependency == "slime.agent.sandbox"
    sys.modules.pop("agent_plugin_q27", None)

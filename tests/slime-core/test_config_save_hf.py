"""`--save-hf` template rules (slime_core.config.save_hf): formatting, path characters, checkpoint overlaps."""

import os
import re

import pytest

from slime_core.config import ConfigError, SlimeArgs, validation
from slime_core.config import base as config_base
from slime_core.config.save_hf import save_hf_paths


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)


def make(**overrides):
    return SlimeArgs.from_dict({"rollout_batch_size": 4, "num_rollout": 3, **overrides})


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{rollout_id.x}", "cannot be filled in with rollout_id=0 (KeyError: 'rollout_id.x')"),
        ("{rollout_id[0]}", "cannot be filled in with rollout_id=0 (KeyError: 'rollout_id[0]')"),
        ("{rollout_id.__class__}", "(KeyError: 'rollout_id.__class__')"),
        ("{0}", "(KeyError: '0')"),
        ("{rollout_id:s}", "(ValueError: Unknown format code 's' for object of type 'int')"),
        ("{rollout_id!z}", "(ValueError: Unknown conversion specifier z)"),
        ("out/{", "(ValueError: Single '{' encountered in format string)"),
        ("{rollout_id:{w}}", "(KeyError: 'w')"),
        ("", "the path is empty at rollout 0"),
        ("{rollout_id:c}", "the path at rollout 0 is '\\x00', which holds control character(s) '\\x00'"),
        ("out/\tx", "holds control character(s) '\\t'"),
        ("{rollout_id:>{rollout_id}}", "at rollout 12345 a path component is 12345 characters (at most 255 bytes)"),
    ],
)
def test_bad_templates_are_one_config_error_naming_the_flag(template, fragment):
    with pytest.raises(ConfigError) as info:
        make(save_hf=template)
    message = str(info.value)
    assert message.startswith(f"--save-hf {template!r}: ") and "\n" not in message
    assert fragment in message


def test_a_too_long_path_component_is_quoted_as_a_preview():
    # The component (12340 spaces and "12345") is shown cut to 43 characters (slime_core.error_text.preview).
    with pytest.raises(ConfigError) as info:
        make(save_hf="{rollout_id:>{rollout_id}}")
    assert str(info.value).endswith("(at most 255 bytes): '" + " " * 39 + "...")


def test_good_templates_are_kept_and_format_per_rollout():
    assert make(save_hf="/out/hf_{rollout_id:05d}").save_hf == "/out/hf_{rollout_id:05d}"
    assert save_hf_paths("/o/{rollout_id}/{{x}}/{rollout_id!r:>3}", [0, 12]) == {0: "/o/0/{x}/  0", 12: "/o/12/{x}/ 12"}


@pytest.mark.parametrize(
    ("flag", "save_hf"),
    [
        ("save", "{d}/ckpt"),  # the same directory
        ("save", "{d}/ckpt/hf"),  # inside it
        ("hf_checkpoint", "{d}"),  # containing it
        ("load", "{d}/./ckpt/../ckpt"),  # the same once normalized
        ("ref_load", "{d}/ckpt"),
        ("critic_load", "{d}/ckpt"),
        ("critic_save", "{d}/ckpt/{{rollout_id}}"),
    ],
)
def test_an_export_over_a_checkpoint_directory_is_refused(tmp_path, flag, save_hf):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    template = save_hf.format(d=tmp_path)
    with pytest.raises(ConfigError) as info:
        extra = {"advantage_estimator": "ppo"} if flag.startswith("critic") else {}
        if flag == "critic_save":
            extra["save"] = str(tmp_path / "run")  # --critic-save needs --save
        make(save_hf=template, **{flag: str(ckpt)}, **extra)
    message = str(info.value)
    assert f"overlaps --{flag.replace('_', '-')} {ckpt} ({os.path.realpath(ckpt)})" in message
    assert "\n" not in message


def test_overlap_is_found_through_a_symlink_and_at_a_later_rollout(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(ConfigError, match=re.escape("overlaps --save")):
        make(save_hf=str(tmp_path / "link"), save=str(tmp_path / "real"))
    # --load runs/2 is replaced by the export of rollout 2 only.
    with pytest.raises(ConfigError, match=re.escape(f"(at rollout 2: {tmp_path}/runs/2) overlaps --load")):
        make(save_hf=f"{tmp_path}/runs/{{rollout_id}}", load=f"{tmp_path}/runs/2")


def test_siblings_and_prefix_names_do_not_overlap(tmp_path):
    cfg = make(save=f"{tmp_path}/ckpt", save_hf=f"{tmp_path}/ckpt_hf", hf_checkpoint=f"{tmp_path}/model")
    assert cfg.save_hf == f"{tmp_path}/ckpt_hf"


def test_the_folder_holding_the_prompt_data_is_refused(tmp_path):
    """Hostile repro: `--save-hf <the folder of --prompt-data>` used to pass --dry-run and delete train.jsonl."""
    (tmp_path / "train.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError) as info:
        make(save_hf=str(tmp_path), prompt_data=f"{tmp_path}/train.jsonl@[0:2]")
    message = str(info.value)
    assert f"is or contains --prompt-data {tmp_path}/train.jsonl ({tmp_path}/train.jsonl)" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=re.escape(f"is or contains --eval-prompt-data {tmp_path}/train.jsonl")):
        make(save_hf=str(tmp_path), eval_prompt_data=["aime", "/elsewhere.jsonl", "math", f"{tmp_path}/train.jsonl"])
    with pytest.raises(ConfigError, match=re.escape(f"is or contains --output-dir {tmp_path}/outputs")):
        make(save_hf=str(tmp_path), output_dir=f"{tmp_path}/outputs")


def test_the_working_and_home_directories_and_their_parents_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match=re.escape(f"(at rollout 0: {tmp_path}) is or contains the current working")):
        make(save_hf=".")
    with pytest.raises(ConfigError, match=re.escape("is or contains the current working directory")):
        make(save_hf="sub/../..")
    with pytest.raises(ConfigError, match=re.escape(f"is or contains the home directory ({tmp_path}/home)")):
        make(save_hf=str(tmp_path / "home"))
    # Inside them, beside --output-dir, is where exports usually go.
    assert make(save_hf="outputs/hf_{rollout_id}").save_hf == "outputs/hf_{rollout_id}"


def test_an_existing_folder_slime_did_not_write_is_refused_and_a_marked_one_is_kept(tmp_path):
    from slime_core.dir_swap import mark

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    with pytest.raises(ConfigError) as info:
        make(save_hf=str(mine))
    assert str(info.value) == (
        f"--save-hf '{mine}' (at rollout 0): {mine} is a non-empty folder that slime did not write (no "
        ".slime_export file in it); an export replaces its folder, so give --save-hf a new or empty folder of its "
        "own (or move that one away)"
    )
    (tmp_path / "runs" / "2.tmp").mkdir(parents=True)  # a user's folder where rollout 2 would stage its export
    (tmp_path / "runs" / "2.tmp" / "keep").write_text("x")
    with pytest.raises(ConfigError, match=re.escape(f"(at rollout 2): {tmp_path}/runs/2.tmp is a non-empty")):
        make(save_hf=f"{tmp_path}/runs/{{rollout_id}}")
    mark(mine)  # an earlier export of this run: replaced at the next save
    assert make(save_hf=str(mine)).save_hf == str(mine)


def test_a_dump_template_is_found_through_its_fixed_directory(tmp_path):
    template = f"{tmp_path}/dumps/{{rollout_id}}.pt"
    with pytest.raises(ConfigError, match=re.escape(f"is or contains --save-debug-rollout-data {tmp_path}/dumps (")):
        make(save_hf=str(tmp_path), save_debug_rollout_data=template)
    assert make(save_hf=f"{tmp_path}/dumps/hf", save_debug_rollout_data=template).save_hf == f"{tmp_path}/dumps/hf"


def test_a_huge_width_is_refused_before_it_is_built():
    # Fifth hostile pass on issue 27: `{rollout_id:1000000000}` built a 1 GB string per rollout id before the
    # component-length check refused it (100 MB: 7 s; 1 GB: about 70 s and GBs of memory).
    import time

    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"a width or precision of 1000000000 \(a path component is at most 255\)"):
        save_hf_paths("/o/{rollout_id:1000000000}", [0, 1])
    assert time.perf_counter() - start < 1.0
    assert save_hf_paths("/o/{rollout_id:05d}/{rollout_id:>255}", [7])[7] == "/o/00007/" + " " * 254 + "7"

"""`--env-path` is looked up before Ray starts (issue 27): the multi-turn generate found an unknown one at its first
sample, after the engines and the trainer had started."""

MULTI_TURN = "slime_rollout.generation.multi_turn.generate"


def _run(cli_without_ray, tmp_path, *extra):
    from slime_app.demo import default_demo_argv

    return cli_without_ray([*default_demo_argv(tmp_path / "run"), "--custom-generate-function-path", MULTI_TURN,
                            *extra])  # fmt: skip


def test_an_unknown_env_name_is_refused_before_ray_starts(tmp_path, cli_without_ray):
    out = _run(cli_without_ray, tmp_path, "--env-path", "no_such_env")
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.splitlines()[-1]
    assert last.startswith("slime: error: unknown env 'no_such_env' (--env-path); installed: ["), last
    assert "Traceback" not in out.stderr


def test_an_env_import_path_that_does_not_resolve_is_refused(tmp_path, cli_without_ray):
    out = _run(cli_without_ray, tmp_path, "--env-path", "os.no_such_factory")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1].startswith("slime: error: --env-path: module 'os' has no attribute"), (
        out.stderr.splitlines()[-1]
    )

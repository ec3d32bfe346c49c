"""A custom rollout function written as the original's `generate_rollout` is runs over `slime.*` and keeps what the
default rollout keeps (THUDM/slime `slime/rollout/sglang_rollout.py`).

Users copy the original's `generate_rollout` / `generate_rollout_async` to make their own `--rollout-function-path`:
its first line is `assert args.rollout_global_dataset` (the original's name of `not --disable-rollout-global-dataset`),
then `GenerateState(args).submit_generate_tasks`, `asyncio.wait` on `state.pendings`, the `filter_hub` helpers around
`--dynamic-sampling-filter-path`, `abort(args, rollout_id)` and `state.reset()`. The function below is written here in
that shape; a scripted engine answers each prompt with fixed tokens after a fixed delay, so the groups kept, dropped and
drawn are known in advance.
"""

import asyncio

import pytest

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import MetricGatherer, call_dynamic_filter, should_drop_dynamic_filter_output
from slime.rollout.sglang_rollout import GenerateState, abort
from slime.utils.async_utils import run
from slime.utils.misc import load_function
from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.generation.rollout import generate_rollout_async

A, B = ord("A"), ord("B")
ZERO_STD = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


class _Engine:
    """Prompt `p` (the sample's first token) answers `answers[p][j % len]` for its j-th request, `delays[p]` s later."""

    def __init__(self, answers, delays):
        self.answers, self.delays = answers, delays
        self.requests: dict[int, int] = {}
        self._epoch = 0

    async def generate(self, payload):
        prompt = payload["input_ids"][0]
        j = self.requests[prompt] = self.requests.get(prompt, -1) + 1
        epoch = self._epoch
        for _ in range(10):  # the delay in steps, so that an abort ends the request early
            await asyncio.sleep(self.delays[prompt] / 10)
            if self._epoch != epoch:
                return {"text": "", "output_ids": [], "meta_info": {"finish_reason": {"type": "abort"},
                                                                    "output_token_logprobs": []}}  # fmt: skip
        token = self.answers[prompt][j % len(self.answers[prompt])]
        meta = {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, token, None]]}
        return {"text": chr(token), "output_ids": [token], "meta_info": meta}

    async def abort_all(self):
        self._epoch += 1


class _Prompts:
    """Groups of n samples of prompts 0, 1, 2, ... (`tokens=[p]`), counting the prompts drawn."""

    def __init__(self, n):
        self.n, self.drawn = n, 0

    def get_samples(self, num_groups):
        groups = []
        for p in range(self.drawn, self.drawn + num_groups):
            group = [Sample(prompt=f"p{p}", tokens=[p], group_index=p, index=p * self.n + j) for j in range(self.n)]
            groups.append(group)
        self.drawn += num_groups
        return groups

    def add_samples(self, groups):
        raise AssertionError("nothing goes back without --partial-rollout")


def reward_a(args, sample):
    return 1.0 if sample.response == "A" else 0.0


async def _collect_as_the_original(args, rollout_id, get_samples):
    state = GenerateState(args)
    dynamic_filter = load_function(args.dynamic_sampling_filter_path) if args.dynamic_sampling_filter_path else None
    gatherer = MetricGatherer()
    target = args.rollout_batch_size
    data = []
    while len(data) < target:
        while state.remaining_batch_size < target:
            state.submit_generate_tasks(get_samples(args.over_sampling_batch_size))
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            group = task.result()
            verdict = call_dynamic_filter(dynamic_filter, args, group)
            if should_drop_dynamic_filter_output(
                verdict, remaining_batch_size=state.remaining_batch_size, target_data_size=target
            ):
                gatherer.on_dynamic_filter_drop(reason=verdict.reason)
                state.remaining_batch_size -= 1
                continue
            if len(data) < target:
                data.append(group)
    leftovers = await abort(args, rollout_id)
    state.reset()
    data.sort(key=lambda group: group[0].index)
    return RolloutFnTrainOutput(samples=data, metrics=gatherer.collect()), leftovers


def rollout_as_the_original(args, rollout_id, data_source, evaluation=False):
    """A `--rollout-function-path` in the shape of the original's `generate_rollout`."""
    assert args.rollout_global_dataset
    output, leftovers = run(_collect_as_the_original(args, rollout_id, data_source.get_samples))
    if leftovers:
        data_source.add_samples(leftovers)
    return output


@pytest.fixture
def engine(monkeypatch):
    """The scripted engine behind both the default generate function and `slime.rollout.sglang_rollout.abort`."""
    import slime.rollout.sglang_rollout as compat_rollout
    from slime_rollout.generation import generate as generate_mod

    # Prompt p: 0 (mod 3) always "A" (zero std, reward 1), 1 always "B" (zero std, reward 0), 2 "A"/"B" (kept).
    # Delays make the finishing order 0, 1, 2, ... within each draw.
    client = _Engine({p: [[A], [B], [A, B]][p % 3] for p in range(64)}, {p: 0.02 * (1 + p % 4) for p in range(64)})
    monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
    monkeypatch.setattr(compat_rollout, "get_client", lambda args: client)
    # A text-only checkpoint has no processor; looking for one takes seconds (test_processing_utils covers it).
    monkeypatch.setattr(compat_rollout, "load_processor", lambda path: None)
    GenerateState.clear_instances()
    yield client
    GenerateState.clear_instances()


def _args(tokenizer_dir, **kw):
    fields = dict(rollout_batch_size=2, over_sampling_batch_size=4, n_samples_per_prompt=2, num_rollout=1,
                  hf_checkpoint=str(tokenizer_dir), custom_rm_path=f"{__name__}.reward_a",
                  dynamic_sampling_filter_path=ZERO_STD, rollout_max_response_len=4, sglang_server_concurrency=64,
                  rollout_num_gpus=1, rollout_num_gpus_per_engine=1)  # fmt: skip
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


def test_the_originals_disable_flags_read_under_its_positive_names():
    base = dict(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=1)
    defaults = PluginArgs.from_config(SlimeArgs.from_dict(base))
    names = ("rollout_global_dataset", "compute_advantages_and_returns", "grpo_std_normalization",
             "rewards_normalization", "wandb_random_suffix")  # fmt: skip
    assert [getattr(defaults, name) for name in names] == [True] * 5
    for name in names:
        extra = {"loss_type": "sft_loss"} if name == "compute_advantages_and_returns" else {}
        flipped = SlimeArgs.from_dict({**base, **extra, f"disable_{name}": True})
        assert getattr(flipped, name) is False  # the config trainer-side hooks get
        assert getattr(PluginArgs.from_config(flipped), name) is False  # the view rollout plugins get
        assert [getattr(flipped, other) for other in names if other != name] == [True] * 4


def test_a_rollout_function_written_as_the_originals_keeps_what_the_default_keeps(engine, qwen3_tokenizer_dir):
    args = _args(qwen3_tokenizer_dir)
    source = _Prompts(n=2)
    out = rollout_as_the_original(args, 0, source)  # was AttributeError: no attribute 'rollout_global_dataset'
    # Draw 1 (prompts 0-3): 0 and 1 dropped (zero std), 2 kept, 3 dropped; draw 2 (4-7): 4 dropped, 5 kept.
    assert [[s.index for s in g] for g in out.samples] == [[4, 5], [10, 11]]
    assert [[s.reward for s in g] for g in out.samples] == [[1.0, 0.0], [1.0, 0.0]]
    assert out.metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 2, "rollout/dynamic_filter/drop_zero_std_0.0": 2}
    assert source.drawn == 8

    GenerateState.clear_instances()
    default_source = _Prompts(n=2)
    ours, leftovers = asyncio.run(generate_rollout_async(_args(qwen3_tokenizer_dir), 0, default_source))
    assert leftovers == []
    assert [[s.index for s in g] for g in ours.samples] == [[s.index for s in g] for g in out.samples]
    assert default_source.drawn == source.drawn
    drops = {k: v for k, v in ours.metrics.items() if k.startswith("rollout/dynamic_filter/")}
    assert drops == out.metrics


def test_generate_state_reads_engine_flags_however_a_config_file_spells_them(engine, qwen3_tokenizer_dir):
    # `sglang_args` keeps the keys as given: a config file's `enable-deterministic-inference` / `sglang-dp-size`
    # were not read, so the group's seeds and the DP-rank counts were silently left out.
    flags = {"enable-deterministic-inference": True, "sglang-dp-size": "2", "enable-dp-attention": True}
    # DP attention of 2 needs an engine of at least 2 TP ranks (validation refuses it on one GPU, as SGLang does).
    engine = {"rollout_num_gpus": 2, "rollout_num_gpus_per_engine": 2}
    state = GenerateState(_args(qwen3_tokenizer_dir, sglang_args=flags, rollout_seed=7, **engine))
    assert state.group_sampling_seeds == [7, 8]
    assert state.dp_counts == [0, 0]

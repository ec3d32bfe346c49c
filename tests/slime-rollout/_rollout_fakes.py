"""Test doubles of the rollout loop's tests (`test_rollout.py`, `test_rollout_plugins.py`).

`FakeClient` is a scripted in-process stand-in for `RolloutClient`.

Each prompt is `tokens=[prompt_id]`. The engine emits one token per `step_s` seconds: the script
`answers[prompt_id]` (a list cycled over the requests of that prompt) gives the token emitted,
`lengths[prompt_id]` the response length before a "stop" (default 2). Log-prob of the k-th emitted
token of a request is `-(k + 1) / 10`. `abort_all` makes every in-flight request return at once with
finish_reason abort and the tokens emitted so far, then waits until none is running, like SGLang's
`/abort_request {"abort_all": true}` + polling `/v1/loads`.
"""

import asyncio
import collections


class FakeClient:
    def __init__(self, answers, lengths=None, step_s=0.0, default_length=2):
        self.answers = answers
        self.lengths = lengths or {}
        self.step_s = step_s
        self.default_length = default_length
        self.calls = collections.Counter()
        self.payloads = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.abort_calls = 0
        self.finishes = []  # (prompt_id, finish type) per request
        self._abort_generation = 0

    async def generate(self, payload):
        self.payloads.append(payload)
        ids = payload["input_ids"]
        prompt_id = ids[0]
        k = self.calls[prompt_id]
        self.calls[prompt_id] += 1
        answer = self.answers[prompt_id][k % len(self.answers[prompt_id])]
        target = self.lengths.get(prompt_id, self.default_length)
        already = len(ids) - 1  # continuation of a partial response
        budget = payload["sampling_params"]["max_new_tokens"]
        generation = self._abort_generation
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        out, finish = [], None
        try:
            while finish is None:
                await asyncio.sleep(self.step_s)  # 0: one event-loop turn per token
                if self._abort_generation != generation:
                    finish = {"type": "abort"}
                    break
                out.append(answer)
                if already + len(out) >= target:
                    finish = {"type": "stop", "matched": answer}
                elif len(out) >= budget:
                    finish = {"type": "length", "length": budget}
        finally:
            self.in_flight -= 1
        self.finishes.append((prompt_id, finish["type"]))
        meta = {"output_token_logprobs": [[-(i + 1) / 10, t, None] for i, t in enumerate(out)],
                "finish_reason": finish, "weight_version": "v1", "prompt_tokens": len(ids),
                "completion_tokens": len(out)}  # fmt: skip
        return {"text": "".join(chr(t) for t in out), "output_ids": out, "meta_info": meta}

    async def abort_all(self):
        self.abort_calls += 1
        self._abort_generation += 1
        while self.in_flight:
            await asyncio.sleep(0.001)


class ListDataSource:
    """Groups of n copies of `Sample(tokens=[prompt_id])` for prompt ids 0, 1, 2, ... with a buffer."""

    def __init__(self, n, num_prompts=1000):
        from slime_core.sample import Sample

        self.n, self.num_prompts, self.next_prompt, self.next_index = n, num_prompts, 0, 0
        self.buffer, self._sample = [], Sample

    def get_samples(self, num_groups):
        out = self.buffer[:num_groups]
        self.buffer = self.buffer[num_groups:]
        while len(out) < num_groups and self.next_prompt < self.num_prompts:
            p, first = self.next_prompt, self.next_index
            out.append([self._sample(prompt=f"p{p}", tokens=[p], group_index=p, index=first + j, label="A")
                        for j in range(self.n)])  # fmt: skip
            self.next_index += self.n
            self.next_prompt += 1
        return out

    def add_samples(self, groups):
        self.buffer.extend(groups)


from slime_core.config import PluginArgs, SlimeArgs  # noqa: E402


def reward_is_a(args, sample):
    """Test reward: 1.0 if the response ends with 'A'; a list (a fan-out generate's samples) gets a list, as the
    original documents a reward `(args, sample | list[Sample]) -> float | list[float]`."""
    if isinstance(sample, list):
        return [reward_is_a(args, s) for s in sample]
    return 1.0 if sample.response.endswith("A") else 0.0


def rollout_args(**kw):
    """The plugin view the rollout gets: a validated config (+ writable, as plugins expect)."""
    fields = dict(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=1, custom_rm_path=f"{__name__}.reward_is_a",
                  rollout_max_response_len=8, sglang_server_concurrency=64, rollout_num_gpus=1,
                  rollout_num_gpus_per_engine=1)  # fmt: skip
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


_JOIN = """
import sys, time
from slime_rollout.engines.wire import init_custom_process_group
backend, init_method, world_size, rank, group_name = sys.argv[1:]
init_custom_process_group(backend=backend, init_method=init_method, world_size=int(world_size), rank=int(rank),
                          group_name=group_name)
print("joined", flush=True)
time.sleep(600)
"""


def join_weights_group_in_child(body: dict):
    """The engine's end of `/init_weights_update_group` `body` in a child process that joins the group for real
    (c10d keeps one group of a name per process, and the trainer's end is this one). Returns the child (`Popen`,
    sleeping; kill it) once it joined."""
    import subprocess
    import sys

    init_method = f"tcp://{body['master_address']}:{body['master_port']}"
    argv = [body["backend"], init_method, str(body["world_size"]), str(body["rank_offset"]), body["group_name"]]
    child = subprocess.Popen([sys.executable, "-c", _JOIN, *argv], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "joined"
    return child

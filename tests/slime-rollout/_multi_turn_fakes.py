"""Multi-turn test doubles: a scripted engine returning real Qwen3 tokenizations, and the helpers the multi-turn
tests share (importable as module `slime_multi_turn_fakes`, registered by conftest.py)."""

import json

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_envs.calculator import CalculatorEnv
from slime_rollout.generation import generate as single_turn

QWEN_OBS_42 = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
TOOL_TURN = (
    "<think>\nI should compute.\n</think>\n\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
)
FINAL_TURN = "<think>\nok\n</think>\n\nThe answer is 42.<|im_end|>"


class ScriptedEngine:
    """Returns scripted turns as (token ids, log-probs) in SGLang's reply format."""

    def __init__(self, tokenizer, turns, *, finish_types=None, token_overrides=None):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.finish_types = list(finish_types or [])
        self.token_overrides = dict(token_overrides or {})
        self.payloads = []

    async def generate(self, payload):
        self.payloads.append(json.loads(json.dumps(payload)))
        i = len(self.payloads) - 1
        ids = self.token_overrides.get(i) or self.tokenizer.encode(self.turns[i], add_special_tokens=False)
        limit = payload["sampling_params"]["max_new_tokens"]
        finish = self.finish_types[i] if i < len(self.finish_types) else "stop"
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        lps = [-(k + 1) / 100 for k in range(len(ids))]
        return {
            "text": self.tokenizer.decode(ids),
            "output_ids": ids,
            "meta_info": {
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids, strict=True)],
                "finish_reason": {"type": finish},
                "weight_version": "3",
            },
        }


def make_args(tok_dir, **kw):
    """The plugin view a custom generate function gets."""
    fields = dict(rollout_batch_size=1, num_rollout=1, hf_checkpoint=str(tok_dir), max_turns=4)
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


def install(monkeypatch, engine):
    monkeypatch.setattr(single_turn, "get_client", lambda args: engine)


def params(max_new_tokens=512):
    return {"temperature": 1.0, "max_new_tokens": max_new_tokens, "stop": None, "no_stop_trim": True}


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def calc_sample(**kw):
    return Sample(prompt=[{"role": "user", "content": "What is 6*7?"}], metadata={"env": "calculator"}, index=0, **kw)


def prompt_ids(tok, sample):
    text = tok.apply_chat_template(
        sample.prompt, tools=CalculatorEnv.tool_specs, tokenize=False, add_generation_prompt=True
    )
    return enc(tok, text)

"""The reference engine finishes a request, and trims its text, as SGLang 0.5.16 does (issue 27, hostile pass).

Not recorded on the GPU (`tests/fixtures/sglang-wire` sends `ignore_eos` and no stop strings): each case follows
the 0.5.16 wheel's `Req.update_finish_state` (managers/schedule_batch.py), `BatchedMinNewTokensPenalizer`
(sampling/penaltylib/min_new_tokens.py) and `DetokenizerManager.trim_matched_stop` (managers/detokenizer_manager.py).
Before the fixes the engine called eos drawn as the last allowed token a stop (slime: COMPLETED, on SGLang
TRUNCATED), stopped on `stop_token_ids` under `ignore_eos`, held stop strings back until `min_new_tokens`, masked
every config eos id under `min_new_tokens`, dropped empty stop strings, checked stop tokens before stop strings, kept
the text past a stop string under `no_stop_trim`, and trimmed a matched id 0.

A `logit_bias` of +100 makes the biased token certain on the tiny random model (its logits span well under 1).
"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi (absent on the GPU trainer path)")
from fastapi.testclient import TestClient  # noqa: E402

from slime_core.sample import Status, status_from_finish_reason  # noqa: E402
from slime_rollout.engines.reference.finish import extra_stop_token_ids  # noqa: E402
from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402

PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]  # "The answer to 2+2=", as recorded
EOS = 151645  # <|im_end|>: the tiny model's eos and the tokenizer's
ENDOFTEXT = 151643  # <|endoftext|>: a second eos of Qwen3's generation config, not the tokenizer's
TWO = 17  # "2"
GT_NEWLINE = 397  # ">\n", one token


def _client(model_dir):
    app = build_app(ReferenceModel(str(model_dir)), max_running_requests=2, random_seed=0, server_args={})
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def engine_client(tiny_qwen3_dir):
    with _client(tiny_qwen3_dir) as client:
        yield client


def generate(client: TestClient, bias: dict[int, float] | None = None, **sampling) -> dict:
    sp = {"temperature": 0.0, "max_new_tokens": 3, **sampling}
    if bias:
        sp["logit_bias"] = {str(t): v for t, v in bias.items()}
    reply = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": sp})
    assert reply.status_code == 200, reply.text
    out = reply.json()
    return {"ids": out["output_ids"], "text": out["text"], "finish": out["meta_info"]["finish_reason"]}


@pytest.mark.parametrize(
    ("bias", "sampling"),
    [({EOS: 100.0}, {}), ({GT_NEWLINE: 100.0}, {"stop": ">"}), ({5: 100.0}, {"stop_token_ids": [5]})],
    ids=["eos", "stop string", "stop token"],
)
def test_the_budget_wins_over_a_stop_on_the_last_allowed_token(engine_client, bias, sampling):
    # update_finish_state checks len(output_ids) >= max_new_tokens first: slime then marks the sample TRUNCATED.
    out = generate(engine_client, bias, max_new_tokens=1, **sampling)
    assert out["finish"] == {"type": "length", "length": 1}
    assert status_from_finish_reason(out["finish"]) is Status.TRUNCATED
    assert out["ids"] == list(bias)


def test_ignore_eos_turns_stop_token_ids_off_too(engine_client):
    # _check_token_based_finish returns at once under ignore_eos, before looking at stop_token_ids.
    out = generate(engine_client, {5: 100.0}, ignore_eos=True, stop_token_ids=[5])
    assert (out["ids"], out["finish"]) == ([5, 5, 5], {"type": "length", "length": 3})
    # Without ignore_eos the same id stops the request (kept in the ids, trimmed from the text).
    out = generate(engine_client, {5: 100.0}, stop_token_ids=[5])
    assert (out["ids"], out["finish"], out["text"]) == ([5], {"type": "stop", "matched": 5}, "")


def test_a_stop_string_ends_a_request_before_min_new_tokens(engine_client):
    # min_new_tokens only masks stop ids in the logits; update_finish_state checks stop strings whatever the length.
    out = generate(engine_client, {TWO: 100.0}, max_new_tokens=5, min_new_tokens=3, stop="2")
    assert (out["ids"], out["finish"], out["text"]) == ([TWO], {"type": "stop", "matched": "2"}, "")


def test_min_new_tokens_masks_the_tokenizers_eos_not_every_config_eos(private_tmp, make_tiny_qwen3):
    # The penalizer masks stop_token_ids | tokenizer.eos_token_id | extra stop ids; <|endoftext|>, an eos of the
    # config only (as in Qwen3's generation config), stays drawable and ends the request at once.
    model_dir = make_tiny_qwen3(private_tmp / "two-eos-qwen3", eos_token_id=[EOS, ENDOFTEXT])
    with _client(model_dir) as client:
        out = generate(client, {ENDOFTEXT: 100.0}, max_new_tokens=5, min_new_tokens=3)
        assert (out["ids"], out["finish"]) == ([ENDOFTEXT], {"type": "stop", "matched": ENDOFTEXT})
        masked = generate(client, {EOS: 100.0}, max_new_tokens=5, min_new_tokens=3)
        assert masked["ids"][3:] == [EOS] and EOS not in masked["ids"][:3]  # masked for tokens 1-3


def test_an_empty_stop_string_stops_at_the_first_token(engine_client):
    # "" is in any decoded tail: SGLang stops after one token with matched "", and trims nothing (falsy match).
    plain = generate(engine_client, ignore_eos=True)
    out = generate(engine_client, ignore_eos=True, stop=["", "never"])
    assert (out["ids"], out["finish"]) == (plain["ids"][:1], {"type": "stop", "matched": ""})


def test_a_stop_string_wins_over_a_stop_token_of_the_same_step(engine_client):
    # Stop strings are checked before stop tokens; the tail is decoded with special tokens, so eos's text matches.
    out = generate(engine_client, {EOS: 100.0}, stop=["<|im_end|>"])
    assert (out["ids"], out["finish"], out["text"]) == ([EOS], {"type": "stop", "matched": "<|im_end|>"}, "")


def test_no_stop_trim_keeps_the_text_up_to_the_end_of_the_stop_string(engine_client):
    # trim_matched_stop: output[:end] with no_stop_trim, output[:pos] without; the "\n" the token carried past the
    # stop string is dropped either way (slime asks no_stop_trim, so this is a sample's response text).
    kept = generate(engine_client, {GT_NEWLINE: 100.0}, stop=">", no_stop_trim=True)
    assert (kept["ids"], kept["finish"], kept["text"]) == ([GT_NEWLINE], {"type": "stop", "matched": ">"}, ">")
    assert generate(engine_client, {GT_NEWLINE: 100.0}, stop=">")["text"] == ""


def test_a_matched_stop_token_zero_is_not_trimmed(engine_client, tok):
    # trim_matched_stop returns early on a falsy `matched`: id 0 stays in the text.
    out = generate(engine_client, {0: 100.0}, stop_token_ids=[0])
    assert (out["finish"], out["text"]) == ({"type": "stop", "matched": 0}, tok.decode([0]))


def test_stop_must_be_strings(engine_client):
    reply = engine_client.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"stop": ["a", 5]}})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"].startswith("sampling_params.stop must be a string or a list of strings")


def test_extra_stop_token_ids_are_sglangs_turn_markers():
    vocab = {"<|eom_id|>": 7, "<|im_end|>": 8, "<|content_model_end_sampling|>": 9}
    assert extra_stop_token_ids(types.SimpleNamespace(get_added_vocab=lambda: vocab)) == {7, 9}
    assert extra_stop_token_ids(types.SimpleNamespace(get_added_vocab=dict)) == set()

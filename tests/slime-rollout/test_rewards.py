"""Rule-based rewards: real GSM8K labels, tricky answer formats, every rm_type, custom/group RM."""

import json

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, batched_async_rm, rule_based_reward
from slime_rollout.rewards.checks import RewardFunctionError
from slime_rollout.rewards.dapo import dapo_reward
from slime_rollout.rewards.f1 import f1_reward
from slime_rollout.rewards.gpqa import extract_choice_letter, gpqa_reward
from slime_rollout.rewards.math import deepscaler_reward, math_reward
from slime_rollout.rewards.math_utils import extract_boxed, extract_label_answer, normalize_answer


def _gsm8k_rows(fixtures_dir):
    with open(fixtures_dir / "gsm8k" / "test-50.jsonl") as f:
        return [json.loads(line) for line in f]


def test_gsm8k_labels_own_answer_is_correct_and_wrong_answer_is_not(fixtures_dir):
    rows = _gsm8k_rows(fixtures_dir)
    assert len(rows) == 50
    for row in rows:
        # An independent parse of the label: the text after the last '####'.
        answer = row["answer"].split("####")[-1].strip()
        assert math_reward(f"The answer is \\boxed{{{answer}}}.", row["answer"]) == 1.0, row["answer"]
        wrong = str(int(answer.replace(",", "")) + 1)
        assert math_reward(f"\\boxed{{{wrong}}}", row["answer"]) == 0.0, row["answer"]
        assert math_reward(f"The answer is {answer}.", row["answer"]) == 0.0  # no box -> 0


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{1000}", "#### 1,000", 1.0),
        ("\\boxed{\\$18}", "18", 1.0),
        ("\\boxed{$18.00$}", "18", 1.0),
        ("\\boxed{18.}", "18", 1.0),
        ("\\boxed{50\\%}", "50", 1.0),
        ("\\boxed{\\text{18 dollars}}", "18", 1.0),
        # Two different boxed answers offered together: a hedge, wrong (issue 17), unless they are the label's parts;
        # a box after more text supersedes the earlier one (issue 27).
        ("first \\boxed{3} then \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}", 1.0),  # superseded (issue 27)
        ("\\boxed{3} and \\boxed{\\frac{\\sqrt{2}}{2}}", "3, \\frac{\\sqrt{2}}{2}", 1.0),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("no box here 18", "18", 0.0),
        ("\\boxed{18", "18", 0.0),  # unclosed box (cut off): no answer, as the original (issue 27)
        ("\\boxed{17", "18", 0.0),
        ("\\boxed{}", "18", 0.0),
        ("\\boxed{__import__('os').system('true')}", "0", 0.0),  # never evaluated
    ],
)
def test_math_reward_formats(response, label, expected):
    assert math_reward(response, label) == expected


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        # geo3k labels are LaTeX numbers: integers, decimals, fractions, surds; the original grades them with the
        # default math RM (examples/geo3k_vlm/README.md). Degrees, "x =" and equivalent forms count as right.
        ("so the length is \\boxed{2\\sqrt{221}}", "2\\sqrt{221}", 1.0),
        ("\\boxed{\\sqrt{884}}", "2\\sqrt{221}", 1.0),
        ("\\boxed{12\\sqrt{3}}", "12 \\sqrt { 3 }", 1.0),
        ("\\boxed{60^\\circ}", "60", 1.0),
        ("\\boxed{x=12}", "12", 1.0),
        ("\\boxed{15/2}", "7.5", 1.0),
        ("\\boxed{\\frac{40}{3}}", "\\frac{40}{3}", 1.0),
        ("\\boxed{13.33}", "\\frac{40}{3}", 0.0),  # rounded: wrong (the original found a tolerance changes nothing)
        ("\\boxed{5}", "6", 0.0),
        ("\\boxed{B}", "6", 0.0),  # a choice letter is not the number
    ],
)
async def test_geo3k_style_answers_through_rm_type_math(response, label, expected):
    assert math_reward(response, label) == expected
    assert await async_rm(_args(rm_type="math"), Sample(response=response, label=label)) == expected


def test_extract_boxed_nested_and_last():
    assert extract_boxed("a \\boxed{1} b \\boxed{\\frac{a}{\\sqrt{b}}} c") == "\\frac{a}{\\sqrt{b}}"
    assert extract_boxed("\\boxed 5 apples") == "5"
    assert extract_boxed("\\fbox{7}") == "7"
    assert extract_boxed("nothing") is None
    assert extract_label_answer("work\n#### 1,234") == "1,234"
    assert extract_label_answer(42) == "42"
    with pytest.raises(ValueError, match="label"):
        extract_label_answer(None)
    assert normalize_answer("\\$1,234.") == "1234"


def test_deepscaler_only_reads_after_think():
    assert deepscaler_reward("<think>\\boxed{5}</think> so \\boxed{4}", "4") == 1.0
    assert deepscaler_reward("<think>\\boxed{4}</think> so \\boxed{5}", "4") == 0.0
    assert deepscaler_reward("\\boxed{4}", "4") == 0.0  # no </think> nor ###Response
    assert deepscaler_reward("###Response \\boxed{4}", "\\boxed{4}") == 1.0


def test_dapo_score_dict():
    assert dapo_reward("blah\nAnswer: 18", "18") == {"score": 1.0, "acc": True, "pred": "18"}
    out = dapo_reward("Answer: 17\n", "18")
    assert out["score"] == -1.0 and out["acc"] is False
    assert dapo_reward("no answer line", "18")["score"] == -1.0
    # Only the last 300 characters are read.
    assert dapo_reward("Answer: 18" + "x" * 400, "18")["score"] == -1.0


def test_f1_reward():
    # pred tokens {paris, france}; gold {paris}: P=1/2, R=1 -> F1=2/3.
    assert f1_reward("Paris, France", "paris") == pytest.approx(2 / 3, abs=1e-12)
    assert f1_reward("The Paris.", "paris") == 1.0
    assert f1_reward("yes", "no") == 0.0
    assert f1_reward("yes it is", "yes") == 0.0  # yes/no must match exactly
    assert f1_reward("london", ["rome", "london"]) == 1.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        # The last box was read whatever the text said of it: each of these scored 1.0 (the original reads the whole
        # text, "boxedparis is wrong", and scored them 0; `boxed_f1` and math score them 0 by the final-answer rule).
        (r"\boxed{Paris} is wrong.", 0.0),
        (r"It is not \boxed{Paris}.", 0.0),
        (r"\boxed{Paris}. Wait, that is wrong; it is London.", 0.0),
        (r"\boxed{London} or \boxed{Paris}", 0.0),
        # A final box, a corrected one and one restated still count.
        (r"The answer is \boxed{Paris}.", 1.0),
        (r"First \boxed{London}, but correcting: \boxed{Paris}", 1.0),
        (r"\boxed{Paris}, i.e. \boxed{\text{Paris}}", 1.0),
        (r"<think>\boxed{Rome}</think> \boxed{The Paris}", 1.0),
        ("Paris, France", 2 / 3),  # no box: the text after the reasoning
    ],
)
def test_f1_reads_the_final_box_by_the_final_answer_rule(response, expected):
    assert rule_based_reward("f1", response, "Paris") == pytest.approx(expected, abs=1e-12)
    assert f1_reward(response, "Paris") == pytest.approx(expected, abs=1e-12)


def test_gpqa_reward():
    assert extract_choice_letter("<think>maybe A</think> The answer is (C).") == "C"
    assert gpqa_reward("The answer is C", "C") == 1.0
    assert gpqa_reward("The answer is B", "C") == 0.0
    assert gpqa_reward("Final answer: B", 1) == 1.0  # 0-based index label
    meta = {"choices": ["red", "blue", "green", "pink"], "valid_letters": "ABCD"}
    assert gpqa_reward("I think C is correct", "green", meta) == 1.0
    assert gpqa_reward("so it's D", "x", {"correct_letter": "D"}) == 1.0


def _args(**fields):
    """The plugin view a reward function gets."""
    return PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields}))


async def test_async_rm_dispatch_override_and_boxed_prefix():
    args = _args(rm_type="math")
    s = Sample(response="\\boxed{4}", label="4")
    assert await async_rm(args, s) == 1.0
    # metadata rm_type overrides --rm-type
    s2 = Sample(response="Answer: 4", label="4", metadata={"rm_type": "dapo"})
    assert (await async_rm(args, s2))["score"] == 1.0
    assert rule_based_reward("boxed_f1", "text \\boxed{paris}", "paris") == 1.0
    with pytest.raises(KeyError, match="known"):
        rule_based_reward("nope", "", "")
    with pytest.raises(ValueError, match="--rm-type"):
        await async_rm(_args(rm_type=None), s)


async def custom_rm(args, sample):
    return float(len(sample.response))


async def group_rm(args, samples):
    return [float(i) for i, _ in enumerate(samples)]


async def test_custom_and_group_rm():
    samples = [Sample(response="ab", index=0), Sample(response="abc", index=1)]
    args = _args(custom_rm_path=f"{__name__}.group_rm", group_rm=True)
    assert await batched_async_rm(args, samples) == [0.0, 1.0]
    # Without --group-rm too, as the original's batched_async_rm: a custom function is called once with the list
    # (the rollout does so for a fan-out generate function's samples). It was called per sample here.
    args = _args(custom_rm_path=f"{__name__}.group_rm", group_rm=False)
    assert await batched_async_rm(args, samples) == [0.0, 1.0]
    args = _args(custom_rm_path=f"{__name__}.custom_rm", group_rm=False)
    message = (
        r"custom_rm \(batch mode\) raised AttributeError on samples \[0, 1\]: .*has no attribute 'response'; a "
        r"generate function that returns a list of samples has them scored in one call fn\(args, samples\) -> list"
    )
    with pytest.raises(RewardFunctionError, match=message):
        await batched_async_rm(args, samples)
    assert await async_rm(args, samples[1]) == 3.0  # one sample: one call with the sample


def nan_rm(args, sample):
    return float("nan")


async def raising_rm(args, sample):
    raise KeyError("answer")


def text_rm(args, sample):
    return "1.0"


def dict_inf_rm(args, sample):
    return {"score": float("inf"), "pred": "x"}


def bad_group_rm(args, samples):
    return [1.0, None]


def exiting_rm(args, sample):
    raise SystemExit(3)


async def exiting_async_rm(args, sample):
    raise SystemExit("bye")


def huge_rm(args, sample):
    return 10**400


def nested_nan_rm(args, sample):
    return {"score": {"x": float("nan")}, "pred": "x"}


def nested_list_rm(args, sample):
    return {"scores": [1.0, {"y": 10**400}]}


def nested_ok_rm(args, sample):
    return {"score": {"x": 1.0, "tags": ["a", True]}, "pred": "x"}


def exiting_group_rm(args, samples):
    raise SystemExit(4)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("nan_rm", r"--custom-rm-path .*\.nan_rm returned a non-finite reward \(nan\) for sample 5"),
        ("raising_rm", r"--custom-rm-path .*\.raising_rm raised KeyError on sample 5: 'answer'"),
        ("text_rm", r"\.text_rm returned str '1\.0', not a number or a dict of scores for sample 5"),
        ("dict_inf_rm", r"\.dict_inf_rm returned a non-finite score \(inf\) at 'score' for sample 5"),
        # Issue 28: SystemExit ended the process with no word of the function; 10**400 was a bare OverflowError;
        # a NaN one level down in the dict passed.
        ("exiting_rm", r"\.exiting_rm raised SystemExit on sample 5: 3$"),
        ("exiting_async_rm", r"\.exiting_async_rm raised SystemExit on sample 5: bye$"),
        ("huge_rm", r"\.huge_rm returned a reward too large for a float \(1000.*401 digits\) for sample 5"),
        ("nested_nan_rm", r"\.nested_nan_rm returned a non-finite score \(nan\) at 'score'\['x'\] for sample 5"),
        ("nested_list_rm", r"returned a score too large for a float .* at 'scores'\[1\]\['y'\] for sample 5"),
    ],
)
async def test_bad_reward_function_output_names_the_plugin_and_the_sample(fn, message):
    # Issue 17: these surfaced later (or never) as "reward nan is not finite" in training, without the plugin.
    from slime_rollout.rewards.checks import RewardFunctionError

    sample = Sample(response="r", label="1", index=5)
    with pytest.raises(RewardFunctionError, match=message):
        await async_rm(_args(custom_rm_path=f"{__name__}.{fn}"), sample)
    sample.custom_rm_path = f"{__name__}.{fn}"  # a per-sample reward function is named by its field
    with pytest.raises(RewardFunctionError, match=r"sample\.custom_rm_path"):
        await async_rm(_args(rm_type="math"), sample)


async def test_nested_finite_reward_dict_is_accepted():
    out = await async_rm(_args(custom_rm_path=f"{__name__}.nested_ok_rm"), Sample(response="r", index=1))
    assert out == {"score": {"x": 1.0, "tags": ["a", True]}, "pred": "x"}


async def test_bad_group_reward_names_the_sample():
    from slime_rollout.rewards.checks import RewardFunctionError

    samples = [Sample(response="a", index=3), Sample(response="b", index=4)]
    args = _args(custom_rm_path=f"{__name__}.bad_group_rm", group_rm=True)
    with pytest.raises(RewardFunctionError, match=r"bad_group_rm \(--group-rm\) returned NoneType None.*sample 4"):
        await batched_async_rm(args, samples)
    args = _args(custom_rm_path=f"{__name__}.raising_rm", group_rm=True)
    with pytest.raises(RewardFunctionError, match=r"raised KeyError on samples \[3, 4\]: 'answer'"):
        await batched_async_rm(args, samples)
    args = _args(custom_rm_path=f"{__name__}.exiting_group_rm", group_rm=True)
    with pytest.raises(RewardFunctionError, match=r"exiting_group_rm \(--group-rm\) raised SystemExit on samples"):
        await batched_async_rm(args, samples)


async def test_remote_rm_retries_then_succeeds(monkeypatch):
    import httpx

    from slime_rollout.rewards import remote

    calls = []

    def handler(request):
        calls.append(json.loads(request.content))
        if len(calls) < 3:
            return httpx.Response(503)
        return httpx.Response(200, json={"score": 0.25})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    monkeypatch.setattr(remote, "_client", lambda: client)
    out = await remote.remote_reward(
        "http://rm/score", {"prompt": "p", "response": "r", "label": "l"}, base_delay_s=0.0
    )
    assert out == {"score": 0.25}
    assert len(calls) == 3 and calls[0] == {"prompt": "p", "response": "r", "label": "l"}
    with pytest.raises(ValueError, match="--rm-url"):
        await remote.remote_reward("", {})


async def test_remote_rm_html_reply_is_retried_then_named(monkeypatch):
    # A gateway's HTML page sent with status 200: the original's `resp.json()` raises and it retries; here it was
    # not retried and surfaced as "raised JSONDecodeError ...: Expecting value: line 1 column 1 (char 0)", showing
    # neither the body nor its type.
    import httpx

    from slime_rollout.rewards import remote

    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(200, content=page, headers={"content-type": "text/html"})
        return httpx.Response(200, json=0.75)

    monkeypatch.setattr(remote, "_client", lambda: httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    assert await remote.remote_reward("http://rm/score", {"prompt": "p"}, base_delay_s=0.0) == 0.75
    assert len(calls) == 2

    def html_only(request):
        return httpx.Response(200, content=page, headers={"content-type": "text/html"})

    monkeypatch.setattr(remote, "_client", lambda: httpx.AsyncClient(transport=httpx.MockTransport(html_only)))
    args = _args(rm_type="remote_rm", rm_url="http://rm/score")
    monkeypatch.setattr(remote.remote_reward, "__kwdefaults__", {"max_retries": 2, "base_delay_s": 0.0})
    expected = (
        r"--rm-type remote_rm \(http://rm/score\) raised NotJSONReply on sample 7: --rm-url http://rm/score replied "
        r"200 with a body that is not JSON \(text/html, 50 bytes\): '<html><body><h1>502 Bad Gateway"
    )
    with pytest.raises(RewardFunctionError, match=expected):
        await async_rm(args, Sample(prompt="p", response="r", label="l", index=7))


async def test_remote_rm_client_errors_fail_at_once_with_the_services_reason(monkeypatch):
    # A 422 (the service wants other fields) or a 404 (a wrong path) was sent again ten times over about 150 s, and
    # the error then said "Client error '422 Unprocessable Entity'" without the service's reason.
    import httpx

    from slime_rollout.rewards import remote

    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(422, json={"detail": [{"loc": ["body", "question"], "msg": "Field required"}]})

    monkeypatch.setattr(remote, "_client", lambda: httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(RewardFunctionError) as raised:
        await async_rm(_args(rm_type="remote_rm", rm_url="http://rm/score"), Sample(prompt="p", response="r", index=2))
    assert len(calls) == 1
    assert str(raised.value) == (
        "--rm-type remote_rm (http://rm/score) raised RefusedRequest on sample 2: --rm-url http://rm/score refused the "
        "request with HTTP 422 Unprocessable Entity (not retried: the same request would be refused again): "
        '\'{"detail":[{"loc":["body","question"],"msg":"Field required"}]}\''
    )
    # A rate limit is retried, as the 5xx are.
    statuses = iter([429, 200])
    monkeypatch.setattr(
        remote,
        "_client",
        lambda: httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(next(statuses), json=1.0))),
    )
    assert await remote.remote_reward("http://rm/score", {}, base_delay_s=0.0) == 1.0


async def test_remote_rm_server_errors_end_with_the_services_last_reply(monkeypatch):
    # After the retries the error was httpx's "Server error '500 Internal Server Error' for url ...\nFor more
    # information check: https://developer.mozilla.org/...", without what the service said.
    import httpx

    from slime_rollout.rewards import remote

    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(500, text="CUDA out of memory while scoring")

    monkeypatch.setattr(remote, "_client", lambda: httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    monkeypatch.setattr(remote.remote_reward, "__kwdefaults__", {"max_retries": 3, "base_delay_s": 0.0})
    with pytest.raises(RewardFunctionError) as raised:
        await async_rm(_args(rm_type="remote_rm", rm_url="http://rm/score"), Sample(prompt="p", response="r", index=5))
    assert len(calls) == 3
    assert str(raised.value) == (
        "--rm-type remote_rm (http://rm/score) raised ServiceError on sample 5: --rm-url http://rm/score answered "
        "HTTP 500 Internal Server Error to all 3 attempts; the last reply: 'CUDA out of memory while scoring'"
    )


async def test_remote_rm_goes_straight_to_rm_url_and_bounds_each_attempt(monkeypatch, http_server):
    # Issue 27 leftover: httpx trusts HTTP(S)_PROXY/ALL_PROXY by default, so a cluster-internal reward model was
    # called through the user's proxy (here a dead one: every attempt failed); the original's aiohttp session does
    # not read the environment. An attempt whose reply never comes is cut at the attempt deadline and retried.
    import asyncio

    from aiohttp import web

    from slime_rollout.rewards import remote

    calls = []

    async def score(request):
        calls.append(await request.json())
        if len(calls) == 1:
            await asyncio.sleep(3)  # the first reply does not come within the 0.5 s attempt
        return web.json_response({"score": 0.5})

    url = await http_server(score)
    dead_proxy = "http://127.0.0.1:9"  # discard port: nothing listens
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead_proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(remote, "_ATTEMPT_S", 0.5)
    out = await remote.remote_reward(f"{url}/score", {"prompt": "p"}, base_delay_s=0.0)
    assert out == {"score": 0.5}
    assert calls == [{"prompt": "p"}, {"prompt": "p"}]


async def test_remote_rm_follows_a_redirect_with_the_request(monkeypatch, http_server):
    # Issue 27 pass 60: a FastAPI reward model routed at "/score/" answers "--rm-url .../score" with 307 to the slashed
    # path (as does an http -> https or moved-service redirect with 307/308). The original's aiohttp session follows
    # it, re-posting the same JSON; httpx does not follow by default, so every attempt failed on the 307 and the run
    # ended after ten retries with "answered HTTP 307 Temporary Redirect".
    from aiohttp import web

    from slime_rollout.rewards import remote

    seen = []

    async def route(request):
        if request.path == "/score":
            raise web.HTTPTemporaryRedirect("/score/")
        if request.path == "/v1/score":
            raise web.HTTPPermanentRedirect("/score/")
        seen.append(await request.json())
        return web.json_response({"score": 0.5})

    url = await http_server(route)
    monkeypatch.setattr(remote.remote_reward, "__kwdefaults__", {"max_retries": 2, "base_delay_s": 0.0})
    first = await remote.remote_reward(f"{url}/score", {"prompt": "p", "label": "1"})
    second = await remote.remote_reward(f"{url}/v1/score", {"prompt": "q", "label": "2"})
    assert (first, second) == ({"score": 0.5}, {"score": 0.5})
    assert seen == [{"prompt": "p", "label": "1"}, {"prompt": "q", "label": "2"}]


async def test_remote_rm_backoff_is_jittered_as_the_original(monkeypatch):
    # Issue 27 pass 60: the original waits min(2**attempt, 30) + random.random() s between attempts; ours waited the
    # bare 1, 2, 4, ... s, so the hundreds of samples of a rollout that met one RM outage all retried in the same
    # instant, again and again, hitting the recovering service with the whole burst each time.
    import httpx

    from slime_rollout.rewards import remote

    replies = iter([503, 503, 503, 200])

    def handler(request):
        status = next(replies)
        return httpx.Response(status, json={"score": 1.0} if status == 200 else None)

    waits = []

    async def sleep(seconds):
        waits.append(seconds)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    monkeypatch.setattr(remote, "_client", lambda: client)
    monkeypatch.setattr(remote.asyncio, "sleep", sleep)
    monkeypatch.setattr(remote.random, "random", lambda: 0.25)
    assert await remote.remote_reward("http://rm/score", {"prompt": "p"}) == {"score": 1.0}
    assert waits == [1.25, 2.25, 4.25]

r"""Issue 27, fresh hostile pass (round 7): answer forms a careful grader accepts that scored 0, and missing labels.

Each case scored the opposite before this pass: `\log_2 8` was "two numbers side by side" (the space after a
subscript), `\pm 2` was one part against the two-part label `2, -2`, "x = 2 or x = 3" was cleaned to `2orx=3`,
`\varnothing` was not `\emptyset`, `30^\circ C` was cleaned to `30C`; f1 compared a missing label as the text
"None" (a response "None" scored 1), gpqa and deepscaler scored it 0 without a word.
"""

import pytest

from slime_rollout.rewards import async_rm, rule_based_reward


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        # A digit that is a LaTeX argument is not a number of its own; two plain numbers still are.
        (r"\log_2 8", "3", 1.0),
        (r"\log_{2} 8", "3", 1.0),
        (r"\log_2 9", "3", 0.0),
        (r"2 3", "23", 0.0),
        (r"2 3", "6", 0.0),
        # `a \pm b` names two values, as the label's two parts do (`\mp` the other way round); one sign alone
        # against a one-value label stays wrong.
        (r"\pm 2", "2, -2", 1.0),
        (r"2, -2", r"\pm 2", 1.0),
        (r"x = \pm 2", "-2, 2", 1.0),
        (r"\mp 2", "2, -2", 1.0),
        (r"\frac{-1 \pm \sqrt{5}}{2}", r"\frac{-1+\sqrt5}{2}, \frac{-1-\sqrt5}{2}", 1.0),
        (r"\pm 3", "2, -2", 0.0),
        (r"\pm 2", "2", 0.0),
        (r"2", r"\pm 2", 0.0),
        # "or" inside one box lists the solutions; against a one-value label it is two parts: wrong.
        (r"x = 2 \text{ or } x = 3", "2, 3", 1.0),
        (r"2 \text{ or } 3", "3, 2", 1.0),
        (r"two or three", "2, 3", 1.0),
        (r"x = 2 \text{ or } x = 3", "3", 0.0),
        (r"3 or 5", "5", 0.0),
        # `\frac` with unbraced one-token arguments, as TeX reads it (only digit pairs were read: `\frac ab` was 0).
        (r"\frac ab", r"\frac{a}{b}", 1.0),
        (r"\dfrac ab", "a/b", 1.0),
        (r"\frac 1x", "1/x", 1.0),
        (r"\frac ab", r"\frac{b}{a}", 0.0),
        # A unary plus is no part of the value.
        (r"+\infty", r"\infty", 1.0),
        (r"\infty", r"+\infty", 1.0),
        (r"+5", "5", 1.0),
        (r"+5", "-5", 0.0),
        # Two spellings of the empty set.
        (r"\varnothing", r"\emptyset", 1.0),
        (r"\emptyset", r"\varnothing", 1.0),
        (r"\varnothing", "0", 0.0),
        # A temperature's scale is its unit: dropped when one side has none, compared when both do.
        (r"30^\circ \text{C}", "30", 1.0),
        (r"30^{\circ}\mathrm{F}", "30", 1.0),
        ("30 °C", "30", 1.0),
        (r"-5^\circ C", "-5", 1.0),
        (r"30^\circ C", r"30 \text{ degrees Celsius}", 1.0),
        (r"30^\circ C", r"30^\circ F", 0.0),
        (r"31^\circ C", "30", 0.0),
    ],
)
def test_answer_forms(answer, label, expected):
    assert rule_based_reward("math", rf"The answer is \boxed{{{answer}}}.", label) == expected


def test_two_boxes_are_the_two_values_of_a_plus_minus_label():
    assert rule_based_reward("math", r"The roots are \boxed{2} and \boxed{-2}.", r"\pm 2") == 1.0
    assert rule_based_reward("math", r"The roots are \boxed{2} and \boxed{-3}.", r"\pm 2") == 0.0


@pytest.mark.parametrize(
    ("rm_type", "response"),
    [
        ("f1", "None"),
        ("f1", r"\boxed{None}"),
        ("boxed_f1", r"\boxed{None}"),
        ("gpqa", "Answer: None"),
        ("boxed_gpqa", r"\boxed{B}"),
        ("deepscaler", r"\boxed{6}"),  # no </think>: scored 0 before the label was looked at
        ("deepscaler", r"<think></think>\boxed{6}"),
        ("math", r"\boxed{6}"),
        ("dapo", "Answer: 6"),
    ],
)
def test_a_missing_label_is_an_error_for_every_grader_that_compares_with_it(rm_type, response):
    with pytest.raises(ValueError, match=r"needs a label \(set --label-key\)"):
        rule_based_reward(rm_type, response, None, {})


def test_gpqa_without_a_label_grades_by_the_metadatas_letter():
    assert rule_based_reward("gpqa", "Answer: B", None, {"correct_letter": "B"}) == 1.0
    assert rule_based_reward("gpqa", "Answer: C", None, {"correct_letter": "B"}) == 0.0


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{6} (I'm not sure)",
        r"Maybe \boxed{6}?",
        r"The answer is \boxed{6}, but I'm not sure.",
        r"I'm not confident, but I get \boxed{6}.",
    ],
)
def test_doubt_about_the_one_value_offered_is_graded_by_that_value(response):
    # A hedge offers several answers; doubt about one is graded by it (as the original, which reads the last box):
    # marking it wrong would reward hiding doubt, not being right (MIGRATION.md, "Values").
    assert rule_based_reward("math", response, "6") == 1.0
    assert rule_based_reward("math", response, "5") == 0.0
    assert rule_based_reward("math", response + r" It might be \boxed{5}.", "6") == 0.0


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        # A percent restates its value (and its number): no second answer. Before, "or 50%" after \boxed{\frac12}
        # was read as the other answer 50, a hedge.
        (r"The probability is \boxed{\frac{1}{2}}, or 50%.", "1/2", 1.0),
        (r"\boxed{50\%}, or 0.5.", r"50\%", 1.0),
        (r"\boxed{50\%}, or 50.", "50", 1.0),
        (r"\boxed{50}, or maybe 0.5.", "50", 0.0),  # no percent sign: two different numbers
        (r"\boxed{\frac12}, or maybe 40%.", "1/2", 0.0),
    ],
)
def test_a_percent_after_the_box_restates_its_value(response, label, expected):
    assert rule_based_reward("math", response, label) == expected


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        # An inequality is its solution set whichever side is the label (math-verify's default compared them only
        # when the label was the inequality: `[1,3)` for `1 \le x < 3` scored 1, the other way round 0).
        (r"1 \le x < 3", "[1,3)", 1.0),
        (r"x \geq 1", r"[1,\infty)", 1.0),
        (r"x > 2", r"(2,\infty)", 1.0),
        ("[1,3)", r"1 \le x < 3", 1.0),
        (r"1 \le x < 3", "(1,3)", 0.0),
        (r"x < 2", r"(2,\infty)", 0.0),
        (r"x > 5", "5", 0.0),
    ],
)
def test_an_inequality_is_its_solution_set(answer, label, expected):
    assert rule_based_reward("math", rf"\boxed{{{answer}}}", label) == expected


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        # A fraction counts a scale word as a decimal does ("0.5 million" was 500000, "1/2 million" no number).
        ("1/2 million", "500000", 1.0),
        (r"\frac{1}{2} million", "500,000", 1.0),
        (r"\dfrac{3}{4} \text{ billion}", "750000000", 1.0),
        ("1/2 million", "1/2", 0.0),
        ("1/2 million", "5000000", 0.0),
    ],
)
def test_a_fraction_of_a_scale_word_is_its_value(answer, label, expected):
    assert rule_based_reward("math", rf"\boxed{{{answer}}}", label) == expected


def test_deepscaler_says_when_responses_score_0_for_lack_of_a_marker(monkeypatch, caplog):
    # A model that does not reason in <think> tags scored 0 on every sample without a word (as in the original).
    from slime_rollout.rewards import math as math_rewards

    monkeypatch.setattr(math_rewards, "_num_without_marker", 0)
    with caplog.at_level("WARNING", logger="slime_rollout.rewards.math"):
        scores = [rule_based_reward("deepscaler", r"\boxed{6}", "6") for _ in range(12)]
        assert rule_based_reward("deepscaler", r"<think>x</think>\boxed{6}", "6") == 1.0
    assert scores == [0.0] * 12
    warnings = [r.getMessage() for r in caplog.records]
    assert [w.split(" response(s)")[0] for w in warnings] == ["--rm-type deepscaler: 1", "--rm-type deepscaler: 10"]
    assert "had no </think> (or ###Response) and scored 0" in warnings[0]


@pytest.mark.parametrize("rm_type", ["math", "deepscaler", "dapo", "f1", "gpqa", "boxed_f1"])
@pytest.mark.parametrize("response", [None, 5, b"\\boxed{5}"])
def test_a_response_that_is_not_text_is_one_error_for_every_grader(rm_type, response):
    # None scored 0 in most graders and failed in deepscaler as "argument of type 'NoneType' is not iterable".
    with pytest.raises(TypeError, match=rf"^--rm-type {rm_type}: the response to grade must be text, got "):
        rule_based_reward(rm_type, response, "5", {})


def test_async_rm_names_the_sample_whose_response_is_not_text():
    import asyncio

    from slime_core.config import PluginArgs, SlimeArgs
    from slime_core.sample import Sample

    args = PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "math"}))
    sample = Sample(prompt="1+1=", response=None, label="2", index=7)
    with pytest.raises(TypeError, match=r"^--rm-type math on sample 7: the response to grade must be text, got None"):
        asyncio.run(async_rm(args, sample))


@pytest.mark.parametrize(
    ("label", "metadata"),
    [
        ("E", {"choices": ["40 J", "42 J", "44 J", "46 J"]}),
        ("C", {"valid_letters": ["A", "B"]}),
        (4, {"choices": ["a", "b", "c", "d"]}),
        (None, {"correct_letter": "F", "valid_letters": "ABCD"}),
    ],
)
def test_a_gpqa_label_that_names_no_option_is_an_error(label, metadata):
    # No response can pick it: every sample of the row scored 0 without a word.
    with pytest.raises(ValueError, match=r"^gpqa label .* names no option: the options are A, B"):
        rule_based_reward("gpqa", "Answer: A", label, metadata)
    options = {key: value for key, value in metadata.items() if key != "correct_letter"}
    assert rule_based_reward("gpqa", "Answer: B", "B", options) == 1.0


def test_async_rm_names_the_sample_whose_data_a_grader_refuses():
    import asyncio

    from slime_core.config import PluginArgs, SlimeArgs
    from slime_core.sample import Sample

    args = PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "gpqa"}))
    sample = Sample(prompt="q", response="Answer: A", label="E", index=3, metadata={"choices": ["a", "b", "c", "d"]})
    with pytest.raises(ValueError, match=r"^--rm-type gpqa on sample 3 \(label 'E'\): gpqa label 'E' .* names no"):
        asyncio.run(async_rm(args, sample))


def test_a_command_whose_name_starts_with_frac_is_not_a_fraction():
    from slime_rollout.rewards.normalize import normalize_answer

    assert normalize_answer(r"\frac abc") == r"\frac{a}{b}c"  # TeX: \frac takes one token per argument
    assert normalize_answer(r"\fraction") == r"\fraction"

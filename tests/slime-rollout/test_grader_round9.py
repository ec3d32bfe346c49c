r"""Issue 27, fresh hostile pass (round 9): cut-off boxes, and what the probes of this pass found.

A response cut at `--rollout-max-response-len` inside its final `\boxed{18` has given no answer: the original's
`last_boxed_only_string` returns None and every grader scores it 0 (dapo -1); here it scored 1 against 18.
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.answers import extract_boxed, final_boxed_answers
from slime_rollout.rewards.math_utils import extract_label_answer

_CUT = [
    r"The answer is \boxed{18",
    r"<think>ok</think>The answer is $\boxed{18$.",
    r"</think>First \boxed{17}, then fixing the sign: \boxed{18",
    r"</think>Answer: \boxed{18",
    r"</think>\boxed{\frac{3}{4}",
]


@pytest.mark.parametrize("response", _CUT)
@pytest.mark.parametrize("rm_type", ["math", "deepscaler", "boxed_math", "boxed_f1", "f1"])
def test_a_cut_off_final_box_is_no_answer(rm_type, response):
    label = r"\frac34" if "frac" in response else "18"
    assert rule_based_reward(rm_type, response, label) == 0.0


@pytest.mark.parametrize("rm_type", ["dapo", "boxed_dapo"])
@pytest.mark.parametrize("response", _CUT)
def test_a_cut_off_final_box_is_no_answer_for_dapo(rm_type, response):
    label = r"\frac34" if "frac" in response else "18"
    assert rule_based_reward(rm_type, response, label)["score"] == -1.0


@pytest.mark.parametrize("rm_type", ["math", "deepscaler", "boxed_math", "boxed_f1", "f1", "boxed_dapo"])
def test_an_earlier_cut_box_neither_answers_nor_hides_the_final_one(rm_type):
    # The original's rfind reads the last box only; the unclosed one before it swallowed it here.
    response = r"</think>I wrote \boxed{17 by mistake; the answer is \boxed{18}"
    reward = rule_based_reward(rm_type, response, "18")
    assert (reward["score"] if isinstance(reward, dict) else reward) == 1.0
    assert final_boxed_answers(response).answers == ["18"]
    assert final_boxed_answers(response.replace("{18}", "{17}")).answers == ["17"]


def test_closed_boxes_still_score_and_labels_keep_their_typo():
    assert rule_based_reward("math", r"The answer is \boxed{18}", "18") == 1.0
    assert rule_based_reward("math", r"The answer is \boxed{18}", "17") == 0.0
    assert extract_boxed(r"so \boxed{18") is None
    assert extract_boxed(r"so \boxed{18", unclosed=True) == "18"
    # A label's missing brace is a typo in the data, not a cut-off answer: it is still read.
    assert extract_label_answer(r"\boxed{18") == "18"
    assert rule_based_reward("math", r"\boxed{18}", r"\boxed{18") == 1.0
    assert final_boxed_answers(r"\boxed{18").reason == "unclosed box"


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        # A choice letter named as one ("Option B", "Choice (B)"), in brackets, or in lower case against a letter
        # label: each scored 0 against "B".
        (r"\text{Option B}", "B", 1.0),
        (r"\text{option (B)}", "B", 1.0),
        (r"\text{Choice B}", "(B)", 1.0),
        (r"\textbf{Option (B)} 15", "B", 1.0),
        ("[B]", "B", 1.0),
        ("b", "B", 1.0),
        (r"\text{(b)}", "B", 1.0),
        ("B", "b", 1.0),
        # Near misses stay wrong: another letter, a letter outside the choices, a word that starts like one.
        (r"\text{Option C}", "B", 0.0),
        ("c", "B", 0.0),
        ("x", "B", 0.0),
        (r"\text{Optional}", "B", 0.0),
        (r"\text{Option B}", "C", 0.0),
        (r"\textbf{Option (C)} 15", "(B) 15", 0.0),
    ],
)
def test_choice_letters_in_odd_formats(answer, label, expected):
    assert rule_based_reward("math", f"So the answer is $\\boxed{{{answer}}}$.", label) == expected


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        # A set is not a pair or an interval (math-verify said equal; the original's tuple check requires the same
        # brackets): both scored 1.
        (r"\{1, 2\}", "(1, 2)", 0.0),
        ("(1, 2)", r"\{1, 2\}", 0.0),
        (r"\{(1,2),(3,4)\}", r"((1,2),(3,4))", 0.0),
        # The same brackets, an unwrapped list, or one element in any brackets still count.
        (r"\{2, 1\}", r"\{1, 2\}", 1.0),
        (r"\left\{1,2\right\}", r"\{1, 2\}", 1.0),
        (r"\{1, 2\}", "1, 2", 1.0),
        ("1, 2", "(1, 2)", 1.0),
        ("(5)", r"\{5\}", 1.0),
        ("x = 1, y = 2", "(1, 2)", 1.0),
    ],
)
def test_a_set_is_not_a_pair(answer, label, expected):
    assert rule_based_reward("math", f"So the answer is $\\boxed{{{answer}}}$.", label) == expected


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        # Named parts are matched by name: swapped values scored 1 (compared as one list, i.e. the set {5, 6})...
        (r"\boxed{x = 6, y = 5}", "x=5, y=6", 0.0),
        (r"\boxed{y = 5, x = 6}", "x=5, y=6", 0.0),
        (r"\boxed{a_1 = 3, a_2 = 2}", "a_2 = 3, a_1 = 2", 0.0),
        (r"\boxed{y=5}, \boxed{x=6}", "x=5, y=6", 0.0),
        # ... and the right values in another order scored 0.
        (r"\boxed{y = 6, x = 5}", "x=5, y=6", 1.0),
        (r"\boxed{y=6}, \boxed{x=5}", "x=5, y=6", 1.0),
        (r"\boxed{a_1 = 2, a_2 = 3}", "a_2 = 3, a_1 = 2", 1.0),
        (r"\boxed{x = \frac{1}{2}, y = 0.5}", r"x=0.5, y=\frac12", 1.0),
        (r"\boxed{x = 5, y = 6}", "x=5, y=6", 1.0),
        (r"\boxed{x=5}, \boxed{x=6}", "x=5, y=6", 0.0),
    ],
)
def test_named_parts_are_matched_by_name(response, label, expected):
    assert rule_based_reward("math", f"So {response}", label) == expected


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        # Unnamed values against a label naming each part read in its order: (x, y) = (2, 1) scored 1 as the set {1, 2}
        # (while `x = 2, y = 1` against the label `(1, 2)` scored 0).
        (r"\boxed{2, 1}", "x=1, y=2", 0.0),
        (r"\boxed{(2, 1)}", "x=1, y=2", 0.0),
        (r"\boxed{2}, \boxed{1}", "a = 1, b = 2", 0.0),
        (r"\boxed{1, 2}", "x=1, y=2", 1.0),
        (r"\boxed{(1, 2)}", "x=1, y=2", 1.0),
        (r"\boxed{1}, \boxed{2}", "a = 1, b = 2", 1.0),
        (r"\boxed{\frac12, 3}", "x=0.5, y=3", 1.0),
        # One variable named twice is a set of solutions: any order.
        (r"\boxed{2, 1}", "x=1, x=2", 1.0),
    ],
)
def test_unnamed_parts_follow_the_order_of_a_label_naming_them(response, label, expected):
    assert rule_based_reward("math", f"So {response}", label) == expected


def test_gpqa_reads_numpy_metadata_separated_letters_and_an_index_correct_letter():
    import numpy as np

    # A numpy array of choices / letters (a plugin's or a pandas-read row) raised "truth value ... ambiguous".
    choices = {"choices": np.array(["12", "15", "18", "20"])}
    assert rule_based_reward("gpqa", "Answer: B", "15", choices) == 1.0
    assert rule_based_reward("gpqa", "Answer: C", "15", choices) == 0.0
    assert rule_based_reward("gpqa", "Answer: B", 1, {"valid_letters": np.array(["A", "B", "C"])}) == 1.0
    # "A,B,C" made "," an option: the index label 1 named "," and every response scored 0.
    assert rule_based_reward("gpqa", "Answer: B", 1, {"valid_letters": "A,B,C"}) == 1.0
    assert rule_based_reward("gpqa", "Answer: C", 1, {"valid_letters": "A, B, C"}) == 0.0
    # An integer correct_letter is a 0-based index (it was the text "1", which names no option: an error).
    assert rule_based_reward("gpqa", "Answer: B", None, {"correct_letter": 1}) == 1.0
    assert rule_based_reward("gpqa", "Answer: A", None, {"correct_letter": np.int64(0)}) == 1.0
    assert rule_based_reward("gpqa", "Answer: B", None, {"correct_letter": 0}) == 0.0
    with pytest.raises(ValueError, match=r"correct_letter 7\) names no option: the options are A, B"):
        rule_based_reward("gpqa", "Answer: B", None, {"correct_letter": 7, "choices": ["1", "2"]})


async def test_a_rows_rm_type_is_read_stripped_as_in_the_original():
    # `(metadata.get("rm_type") or args.rm_type or "").strip()` in the original; " math" was an unknown reward here.
    from slime_core.config import PluginArgs, SlimeArgs
    from slime_core.sample import Sample
    from slime_rollout.preflight import check_prompt_rows
    from slime_rollout.rewards import async_rm

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "f1", "rm_num_workers": 0})
    sample = Sample(response=r"\boxed{18}", label="18", metadata={"rm_type": " math\n"})
    assert await async_rm(PluginArgs.from_config(cfg), sample) == 1.0
    row = {"input": "q", "label": "18", "metadata": {"rm_type": " boxed_math "}}
    check_prompt_rows([row], cfg.model_copy(update={"label_key": "label"}), where="--prompt-data x.jsonl")
    with pytest.raises(ValueError, match=r"metadata rm_type 'maths' is not a registered reward function"):
        check_prompt_rows([{**row, "metadata": {"rm_type": "maths"}}], cfg, where="--prompt-data x.jsonl")

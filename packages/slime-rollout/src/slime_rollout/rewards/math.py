"""Rule-based math graders: `--rm-type math` and `--rm-type deepscaler` (see `math_utils`)."""

from __future__ import annotations

from slime_rollout.rewards.math_utils import extract_boxed, extract_label_answer, grade_answer

__all__ = ["deepscaler_reward", "math_reward"]


def math_reward(response: str, label: object) -> float:
    r"""1.0 if the last `\boxed{}` of `response` equals the label's final answer, else 0.0.

    Args:
        response: model output.
        label: ground truth: a bare answer, a boxed answer or a GSM8K solution ending in `#### x`.

    Raises:
        ValueError: if `label` is None.
    """
    gold = extract_label_answer(label)
    return 1.0 if grade_answer(extract_boxed(response), gold) else 0.0


def deepscaler_reward(response: str, label: object) -> float:
    r"""DeepScaleR grading: only the text after the last `</think>` (else after `###Response`) counts.

    Returns:
        1.0 if that region's last `\boxed{}` equals the label's answer; 0.0 otherwise, including when
        neither marker is present.
    """
    if "</think>" in response:
        region = response.rsplit("</think>", 1)[1]
    elif "###Response" in response:
        region = response.rsplit("###Response", 1)[1]
    else:
        return 0.0
    return math_reward(region, label)

"""Early warning of training instability: rules over the metric stream of a run.

What tends to precede a collapse or reward hacking in RL post-training, each watched by one rule with a
threshold flag (0 turns the rule off):

| rule | metric(s) | fires when (x: the flag) | flag `--instability-...` |
|---|---|---|---|
| `entropy_collapse` | `train/entropy_loss` | below x × its warm-up median | `entropy-collapse` |
| `entropy_blowup` | `train/entropy_loss` | above x × its warm-up median | `entropy-blowup` |
| `kl_spike` | `train/{ppo_kl,kl_loss,train_rollout_logprob_abs_diff}` | above x × rolling median | `kl-spike` |
| `grad_norm_spike` | `train/grad_norm` | above x × rolling median | `grad-norm-spike` |
| `response_len_limit` | `rollout/response_len/mean` | at x × `--rollout-max-response-len` | `response-len-frac` |
| `truncation` | `rollout/truncated_ratio` | above x | `truncated-ratio` |
| `zero_advantage_groups` | `rollout/zero_std/count_*` | sum / `--rollout-batch-size` above x | `zero-adv-group-frac` |
| `clip_fraction` | `train/pg_clipfrac` | above x | `clipfrac` |
| `reward_up_eval_down` | `rollout/raw_reward`, `eval/<name>` | between evals reward +x, eval −x | `reward-eval-gap` |

Relative rules wait for `--instability-warmup` observations (their baseline); spike rules compare with the median
of the previous `--instability-window` values and ignore values under a small absolute floor (a KL of 1e-5
jumping to 1e-4 is noise, not a jump). A rule warns when it starts firing and again only after it cleared, so
a lasting condition is one warning, not one per rollout. `--stop-on-instability` turns the first warning into
a stop (`slime_app.guards.RunStopped`). `zero_advantage_groups` applies to group-wise estimators only (GRPO, RLOO,
...), where equal rewards in a group zero its advantages, and not where the loss reads no advantage (`--loss-type
sft_loss`, `--disable-compute-advantages-and-returns`) or on-policy distillation adds its term to every advantage
(`--use-opd` with `--opd-kl-coef` > 0).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from slime_app.tracking import is_eval_score
from slime_core.config import SlimeArgs
from slime_core.estimators import get_estimator

logger = logging.getLogger(__name__)

__all__ = ["Finding", "InstabilityMonitor"]

# Absolute floors under which a spike rule does not fire (units of the metric).
_SPIKE_FLOORS = {
    "train/ppo_kl": 1e-3,
    "train/kl_loss": 1e-3,
    "train/train_rollout_logprob_abs_diff": 1e-2,
    "train/grad_norm": 0.0,
}
# Rollouts of train reward averaged on each side of the reward-vs-eval comparison.
_REWARD_SPAN = 3
# The metrics whose past a rule reads (`InstabilityMonitor.history`); the others are checked as they arrive only.
_READ = ("train/entropy_loss", *_SPIKE_FLOORS, "rollout/raw_reward")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One fired rule.

    Attributes:
        rule: the rule's name (see the module table).
        metric: the metric that crossed its threshold.
        rollout_id: where it happened.
        value: the metric's value there.
        threshold: the limit it crossed (in the metric's units, the flag's factor already applied).
        message: one line naming all of the above and the flag.
    """

    rule: str
    metric: str
    rollout_id: int
    value: float
    threshold: float
    message: str


class InstabilityMonitor:
    """Watches the metrics of a run and reports `Finding`s.

    Args:
        cfg: the run config: the `--instability-*` thresholds, `rollout_max_response_len`, `rollout_batch_size`.
    """

    def __init__(self, cfg: SlimeArgs):
        self.cfg = cfg
        # What the rules read of the past, trimmed after every observation to what they can still read (`_kept`):
        # every metric of every rollout was kept for the whole run (7 kB a rollout at 90 keys: 70 MB over 10k
        # rollouts), and each spike check copied its whole series to read the last window.
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.active: set[str] = set()  # rules firing at the last observation (warned once per episode)
        self._last_eval: dict[str, tuple[int, float]] = {}
        self._rules: list[Callable[[int, Mapping[str, float]], list[tuple[str, str, float, float, str]]]] = [
            self._entropy,
            self._spikes,
            self._limits,
            self._zero_advantage_groups,
        ]

    # ---- public ---------------------------------------------------------------------------------------------

    def observe(self, rollout_id: int, metrics: Mapping[str, float]) -> list[Finding]:
        """Checks one rollout's metrics, then adds them to the history; returns the rules that started firing.

        Args:
            rollout_id: the rollout the metrics belong to.
            metrics: its `rollout/*`, `train/*` metrics; NaN and infinite values are checked but not kept.
        """
        hits = [hit for rule in self._rules for hit in rule(rollout_id, metrics)]
        for key in _READ:
            value = metrics.get(key)
            # A NaN or infinite value (the tracker warns about it) stays out of the baselines: one NaN grad norm made
            # the rolling median NaN for the next --instability-window rollouts, and one in the warm-up made the
            # entropy baseline NaN for the whole run, each rule then silently unable to fire.
            if value is not None and math.isfinite(float(value)):
                self.history[key].append((rollout_id, float(value)))
        self.history = defaultdict(list, self._kept())
        return self._report(rollout_id, hits, scope="rollout")

    def observe_eval(self, rollout_id: int, metrics: Mapping[str, float]) -> list[Finding]:
        """Checks an evaluation against the previous one (reward hacking); returns the rules that started firing.

        Args:
            rollout_id: the rollout id the eval is logged at (after `rollout_id` rollouts of training).
            metrics: `eval/<name>` scores (higher is better).
        """
        gap = self.cfg.instability_reward_eval_gap
        hits = []
        for key, score in metrics.items():
            if not is_eval_score(key):
                continue
            previous = self._last_eval.get(key)
            self._last_eval[key] = (rollout_id, float(score))
            if not gap or previous is None:
                continue
            reward_then, reward_now = self._reward_before(previous[0]), self._reward_before(rollout_id)
            if reward_then is None or reward_now is None:
                continue
            rise, drop = reward_now - reward_then, previous[1] - float(score)
            if rise >= gap and drop >= gap:
                hits.append((
                    "reward_up_eval_down", key, float(score), previous[1] - gap,
                    f"{key} fell {previous[1]:.4g} -> {float(score):.4g} while rollout/raw_reward rose "
                    f"{reward_then:.4g} -> {reward_now:.4g} (both by >= {gap:g}: reward hacking?) "
                    "[--instability-reward-eval-gap]",
                ))  # fmt: skip
        self.history = defaultdict(list, self._kept())  # the rewards before an older eval are no longer read
        return self._report(rollout_id, hits, scope="eval")

    # ---- resume ---------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What the rules read of the past, for a checkpoint (`slime_app.run_state`): baselines, windows, evals.

        The entropy warm-up values, the last `--instability-window` values of each spike metric, the train rewards
        from the last ones before the oldest remembered eval, the last eval scores and the rules firing. Without it a
        resumed run took its warm-up baseline from its own first rollouts: an entropy collapse under way at the
        resume became the baseline, and every rule waited out a new warm-up.
        """
        return {
            "history": {key: [list(entry) for entry in entries] for key, entries in self._kept().items()},
            "last_eval": {key: list(entry) for key, entry in self._last_eval.items()},
            "active": sorted(self.active),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues from `state()` of a checkpoint.

        Raises:
            KeyError, TypeError, ValueError: `state` is not what `state()` returns.
        """
        history = {key: [(int(r), float(v)) for r, v in entries] for key, entries in dict(state["history"]).items()}
        last_eval = {key: (int(r), float(v)) for key, (r, v) in dict(state["last_eval"]).items()}
        active = {str(key) for key in state["active"]}
        self.history = defaultdict(list, history)
        self._last_eval, self.active = last_eval, active

    def _kept(self) -> dict[str, list[tuple[int, float]]]:
        """The part of `history` the rules can still read (what `observe` keeps and `state` saves).

        The entropy warm-up values, the last `--instability-window` values of each spike metric, and the train
        rewards from the last `_REWARD_SPAN` before the oldest remembered eval on (the reward-vs-eval rule compares
        the rewards before the last eval with those before the next one); keys without values are left out.
        """
        warmup, window = self.cfg.instability_warmup, self.cfg.instability_window
        kept = {"train/entropy_loss": self.history.get("train/entropy_loss", [])[:warmup]}
        kept |= {key: self.history.get(key, [])[-window:] for key in _SPIKE_FLOORS}
        rewards = self.history.get("rollout/raw_reward", [])
        oldest_eval = min((r for r, _ in self._last_eval.values()), default=None)
        before = sum(1 for r, _ in rewards if oldest_eval is None or r < oldest_eval)
        kept["rollout/raw_reward"] = rewards[max(before - _REWARD_SPAN, 0) :]
        return {key: entries for key, entries in kept.items() if entries}

    # ---- reporting ------------------------------------------------------------------------------------------

    def _report(self, rollout_id: int, hits: list, *, scope: str) -> list[Finding]:
        firing = {f"{rule}:{metric}" for rule, metric, *_ in hits}
        stale = {key for key in self.active if key.startswith(_SCOPES[scope])} - firing
        self.active -= stale
        new = []
        for rule, metric, value, threshold, text in hits:
            key = f"{rule}:{metric}"
            if key in self.active:
                continue
            self.active.add(key)
            message = f"INSTABILITY at rollout {rollout_id}: {rule}: {text}"
            finding = Finding(
                rule=rule, metric=metric, rollout_id=rollout_id, value=value, threshold=threshold, message=message
            )
            logger.warning(message)
            new.append(finding)
        return new

    @staticmethod
    def metrics_of(findings: list[Finding]) -> dict[str, float]:
        """`instability/<rule>` = 1.0 for every finding (what the tracker logs)."""
        return {f"instability/{f.rule}": 1.0 for f in findings}

    # ---- rules ----------------------------------------------------------------------------------------------

    def _values(self, key: str) -> list[float]:
        return [v for _, v in self.history.get(key, [])]

    def _entropy(self, rollout_id: int, metrics: Mapping[str, float]) -> list:
        key = "train/entropy_loss"
        value, past = metrics.get(key), self._values(key)
        warmup = self.cfg.instability_warmup
        if value is None or len(past) < warmup:
            return []
        base = statistics.median(past[:warmup])
        collapse, blowup = self.cfg.instability_entropy_collapse, self.cfg.instability_entropy_blowup
        if collapse and value < collapse * base:
            limit = collapse * base
            text = f"{key} = {value:.4g} < {collapse:g} x warm-up median {base:.4g} [--instability-entropy-collapse]"
            return [("entropy_collapse", key, value, limit, text)]
        if blowup and value > blowup * base:
            text = f"{key} = {value:.4g} > {blowup:g} x warm-up median {base:.4g} [--instability-entropy-blowup]"
            return [("entropy_blowup", key, value, blowup * base, text)]
        return []

    def _spikes(self, rollout_id: int, metrics: Mapping[str, float]) -> list:
        hits = []
        window, warmup = self.cfg.instability_window, self.cfg.instability_warmup
        for key, floor in _SPIKE_FLOORS.items():
            rule, flag = (
                ("grad_norm_spike", "grad-norm-spike") if key == "train/grad_norm" else ("kl_spike", "kl-spike")
            )
            factor = (
                self.cfg.instability_grad_norm_spike if rule == "grad_norm_spike" else self.cfg.instability_kl_spike
            )
            value, past = metrics.get(key), self._values(key)[-window:]
            if not factor or value is None or len(past) < warmup:
                continue
            median = statistics.median(past)
            limit = factor * median
            if median > 0 and value > limit and value > floor:
                text = (
                    f"{key} = {value:.4g} > {factor:g} x median of the previous {len(past)} rollouts "
                    f"({median:.4g}) [--instability-{flag}]"
                )
                hits.append((rule, key, value, limit, text))
        return hits

    def _limits(self, rollout_id: int, metrics: Mapping[str, float]) -> list:
        cfg = self.cfg
        hits = []
        length = metrics.get("rollout/response_len/mean")
        frac, max_len = cfg.instability_response_len_frac, cfg.rollout_max_response_len
        # No response limit (an SFT rollout generates nothing): no rule to apply.
        if frac and max_len and length is not None and length >= frac * max_len:
            limit = frac * max_len
            text = (
                f"rollout/response_len/mean = {length:.4g} >= {frac:g} x --rollout-max-response-len "
                f"{cfg.rollout_max_response_len} [--instability-response-len-frac]"
            )
            hits.append(("response_len_limit", "rollout/response_len/mean", length, limit, text))
        for rule, key, limit, flag in (
            ("truncation", "rollout/truncated_ratio", cfg.instability_truncated_ratio, "truncated-ratio"),
            ("clip_fraction", "train/pg_clipfrac", cfg.instability_clipfrac, "clipfrac"),
        ):
            value = metrics.get(key)
            if limit and value is not None and value > limit:
                hits.append((rule, key, value, limit, f"{key} = {value:.4g} > {limit:g} [--instability-{flag}]"))
        return hits

    def _zero_advantage_groups(self, rollout_id: int, metrics: Mapping[str, float]) -> list:
        limit = self.cfg.instability_zero_adv_group_frac
        counts = [v for k, v in metrics.items() if k.startswith("rollout/zero_std/count_")]
        # Equal rewards in a group mean zero advantage only where rewards are normalized within the group (GRPO,
        # RLOO, ...): REINFORCE++ without a baseline trains on them, and a group of one sample (counted, as the
        # original counts it) is normal there.
        if not limit or not counts or not get_estimator(self.cfg.advantage_estimator).group_wise:
            return []
        if self.cfg.loss_type == "sft_loss" or self.cfg.disable_compute_advantages_and_returns:
            # No loss term reads an advantage (the SFT recipe's reward is 0 in every group of one): equal rewards
            # leave nothing untrained.
            return []
        if self.cfg.use_opd and self.cfg.opd_kl_coef > 0:
            # On-policy distillation adds -λ·(log p_student - log p_teacher) to every token's advantage: a group of
            # equal rewards still trains (the OPD demo has no task reward at all).
            return []
        frac = sum(counts) / self.cfg.rollout_batch_size
        if frac <= limit:
            return []
        text = (
            f"rollout/zero_std/count_* = {sum(counts):g} of {self.cfg.rollout_batch_size} groups ({frac:.1%}) have "
            f"equal rewards (zero advantage) > {limit:g} [--instability-zero-adv-group-frac]"
        )
        return [("zero_advantage_groups", "rollout/zero_std/count_*", frac, limit, text)]

    def _reward_before(self, rollout_id: int) -> float | None:
        """Mean `rollout/raw_reward` of the last few rollouts before `rollout_id` (None without any)."""
        values = [v for r, v in self.history.get("rollout/raw_reward", []) if r < rollout_id][-_REWARD_SPAN:]
        return statistics.fmean(values) if values else None


# Which active keys an observation of each scope may clear (an eval does not clear a rollout rule).
_SCOPES = {"rollout": ("entropy", "kl_", "grad_", "response_", "truncation", "clip_", "zero_"), "eval": ("reward_",)}

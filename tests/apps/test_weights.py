"""The weight-content check around a push: its schedule (first sync, then every N), the stop on a mismatch, and the
machine check of tensor sync."""

import pytest
import torch

from slime_app import weights
from slime_core.config import SlimeArgs
from slime_rollout.engines.weight_checksum import sglang_param_name
from slime_rollout.weight_sync import check as weight_check
from slime_rollout.weight_sync.check import WeightCheckEmpty, WeightCheckReport, WeightSyncMismatch


def _cfg(**fields):
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})


@pytest.fixture(autouse=True)
def engine_names(monkeypatch):
    """The engine's parameter names, as `/weights_checker` lists them before a push (no engine runs here)."""

    async def fake(engine):
        return [{sglang_param_name(n)[0]: "0" * 16 for n in ("a", "b")}]

    monkeypatch.setattr(weight_check, "engine_checksums", fake)


def test_schedule_first_sync_then_every_n():
    checker = weights.SyncChecker(_cfg(check_weight_sync_interval=3), ["http://e:1"])
    assert [checker.start() is not None for _ in range(8)] == [True, False, False, True, False, False, True, False]
    first_only = weights.SyncChecker(_cfg(), ["http://e:1"])
    assert [first_only.start() is not None for _ in range(4)] == [True, False, False, False]
    assert weights.make_sync_checker(_cfg(check_weight_sync=False), ["http://e:1"], rank=0) is None
    assert weights.make_sync_checker(_cfg(), ["http://e:1"], rank=1) is None  # only rank 0 talks to engines


class _Backend:
    def named_hf_weights(self, bucket_bytes):
        yield [("a", torch.ones(3, 2)), ("b", torch.zeros(4))]


class _Updater:
    def __init__(self):
        self.pushed = []

    def update(self, buckets, version):
        self.pushed += [name for bucket in buckets for name, _ in bucket]


def test_push_checks_the_drawn_checksums_and_stops_on_a_mismatch(monkeypatch):
    seen = {}

    async def fake_check(engines, checksums):
        seen["urls"] = [e.url for e in engines]
        seen["checksums"] = dict(checksums)
        return WeightCheckReport(checked=2)

    monkeypatch.setattr(weight_check, "check_engines", fake_check)
    cfg = _cfg(check_weight_sync_tensors=2, rollout_engine="reference")
    checker = weights.SyncChecker(cfg, ["http://e:1"])
    updater = _Updater()
    metrics = weights.push_weights(_Backend(), updater, cfg, 1, rank=0, checker=checker)
    assert updater.pushed == ["a", "b"] and seen["urls"] == ["http://e:1"] and sorted(seen["checksums"]) == ["a", "b"]
    assert metrics["weight_check/tensors_checked"] == 2.0 and metrics["perf/weight_check_time"] >= 0.0
    # Not due on the second sync: no check, no weight_check metrics.
    seen.clear()
    assert "weight_check/tensors_checked" not in weights.push_weights(_Backend(), _Updater(), cfg, 2, rank=0,
                                                                      checker=checker)  # fmt: skip
    assert seen == {}

    async def mismatch(engines, checksums):
        return WeightCheckReport(checked=2, mismatches=["http://e:1 a: engine checksum 1, trainer pushed 2", "b"])

    monkeypatch.setattr(weight_check, "check_engines", mismatch)
    with pytest.raises(WeightSyncMismatch, match=r"weight sync v3: .*http://e:1 a: engine checksum 1.* \(\+1 more\)"):
        weights.push_weights(_Backend(), _Updater(), cfg, 3, rank=0, checker=weights.SyncChecker(cfg, ["http://e:1"]))


def test_a_check_that_compares_nothing_stops_the_run(monkeypatch):
    """Issue 25: on SGLang every read-back answered 400 and the check logged "0 tensor reads equal" as a pass."""

    async def nothing(engines, checksums):
        return WeightCheckReport(checked=0, unsupported=1)

    monkeypatch.setattr(weight_check, "check_engines", nothing)
    cfg = _cfg(rollout_engine="reference")
    with pytest.raises(WeightCheckEmpty, match=r"compared no tensor on 1 engine\(s\): 1 without /weights_checker.*"
                                               r"--no-check-weight-sync"):  # fmt: skip
        weights.push_weights(_Backend(), _Updater(), cfg, 0, rank=0, checker=weights.SyncChecker(cfg, ["http://e:1"]))


def test_an_engine_whose_check_compared_nothing_stops_the_run(monkeypatch):
    """One engine listing none of the drawn tensors passed on the other engine's comparisons."""

    async def one_blind(engines, checksums):
        return WeightCheckReport(checked=2, missing=2, blind=["http://e:2"])

    monkeypatch.setattr(weight_check, "check_engines", one_blind)
    cfg = _cfg(rollout_engine="reference", check_weight_sync_tensors=2)
    checker = weights.SyncChecker(cfg, ["http://e:1", "http://e:2"])
    with pytest.raises(WeightCheckEmpty, match=r"1 engine\(s\) list none of the 2 drawn tensors.*http://e:2"):
        weights.push_weights(_Backend(), _Updater(), cfg, 0, rank=0, checker=checker)


def test_tensor_sync_is_refused_towards_an_engine_on_another_machine():
    from slime_app.weights import check_same_machine

    # This node's address and loopback (two Ray nodes of one machine) share memory with the trainer.
    check_same_machine(["http://10.0.0.7:15000", "http://127.0.0.2:15010", "http://localhost:1"], "10.0.0.7")
    with pytest.raises(ValueError, match=r"engine http://10.0.0.8:15010 is not on trainer rank 0's machine"):
        check_same_machine(["http://10.0.0.7:15000", "http://10.0.0.8:15010"], "10.0.0.7")


def test_delta_mode_builds_the_delta_updater_and_reports_what_each_push_sent(tmp_path):
    from slime_rollout.engines.weight_delta import DeltaBase
    from slime_rollout.weight_sync.delta_sync import DeltaDiskWeightUpdater

    cfg = _cfg(update_weight_mode="delta", weight_sync="disk", update_weight_disk_dir=str(tmp_path))
    assert isinstance(weights.make_weight_updater(cfg, ["http://e:1"], rank=0), DeltaDiskWeightUpdater)

    class _DeltaUpdater(_Updater):
        """Sends like a delta updater: the first push whole, then only what changed."""

        def __init__(self):
            super().__init__()
            self.base = DeltaBase(encoding="xor", algorithm="xxh3-128")

        @property
        def delta_stats(self):
            return self.base.stats

        def update(self, buckets, version):
            delta = self.base.begin()
            for bucket in buckets:
                if delta:
                    self.base.encode_bucket(bucket)
                else:
                    self.base.record_full(bucket)
            self.base.commit(version)

    updater = _DeltaUpdater()
    first = weights.push_weights(_Backend(), updater, _cfg(check_weight_sync=False), 1, rank=0)
    assert first["perf/update_weights_full"] == 1.0 and first["perf/update_weights_sent_fraction"] == 1.0
    again = weights.push_weights(_Backend(), updater, _cfg(check_weight_sync=False), 2, rank=0)
    # _Backend pushes the same tensors again: nothing changed, nothing sent.
    assert again["perf/update_weights_full"] == 0.0 and again["perf/update_weights_sent_fraction"] == 0.0
    assert again["perf/update_weights_wire_bytes"] == 0.0 and again["perf/update_weights_density"] == 0.0
    assert first["perf/update_weights_wire_bytes"] == (6 + 4) * 4  # fp32, whole
    assert again["perf/update_weights_delta_base_gb"] == (6 + 4) * 4 / 1e9  # the trainer's copy of the last push


def test_a_moe_checkpoints_expert_count_puts_per_expert_pushes_into_sglangs_expert_parameters(monkeypatch, tmp_path):
    """A Qwen3-MoE H100 run logged "4 tensor checksums equal (0 sharded, 48 unmatched names)": the checker was never
    told the expert count, so no pushed expert matrix matched SGLang's `experts.w13_weight` / `w2_weight`."""
    from slime_rollout.engines.weight_checksum import tensor_checksum

    p = "model.layers.0.mlp.experts"
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe", "num_experts": 2, "dtype": "float32"}')

    async def engine_names(engine):
        return [{f"{p}.w13_weight": "0" * 16, f"{p}.w2_weight": "0" * 16}]

    seen = {}

    async def fake_check(engines, checksums):
        seen.update(checksums)
        return WeightCheckReport(checked=len(checksums))

    g = torch.Generator().manual_seed(0)
    projs = ("gate_proj", "up_proj", "down_proj")
    mats = {(e, proj): torch.randn(3, 4, generator=g) for e in range(2) for proj in projs}

    class MoeBackend:
        def named_hf_weights(self, bucket_bytes):
            yield [(f"{p}.{e}.{proj}.weight", t) for (e, proj), t in mats.items()]

    monkeypatch.setattr(weight_check, "engine_checksums", engine_names)
    monkeypatch.setattr(weight_check, "check_engines", fake_check)
    cfg = _cfg(rollout_engine="reference", hf_checkpoint=str(tmp_path), check_weight_sync_tensors=2)
    checker = weights.SyncChecker(cfg, ["http://e:1"])
    assert checker.num_experts == 2
    weights.push_weights(MoeBackend(), _Updater(), cfg, 0, rank=0, checker=checker)
    w13 = torch.cat([mats[0, "gate_proj"], mats[0, "up_proj"], mats[1, "gate_proj"], mats[1, "up_proj"]])
    w2 = torch.cat([mats[0, "down_proj"], mats[1, "down_proj"]])
    assert seen == {f"{p}.w13_weight": tensor_checksum(w13), f"{p}.w2_weight": tensor_checksum(w2)}
    # No config.json (a dense run's checker is unchanged): no expert count.
    assert weights.SyncChecker(_cfg(hf_checkpoint=str(tmp_path / "none")), ["http://e:1"]).num_experts is None
    # DeepSeek-style shared experts may be fused into SGLang's w13_weight as extra experts: not claimed, not compared.
    (tmp_path / "config.json").write_text('{"model_type": "deepseek_v3", "n_routed_experts": 8, "n_shared_experts": 1}')
    assert weights.SyncChecker(_cfg(hf_checkpoint=str(tmp_path)), ["http://e:1"]).num_experts is None

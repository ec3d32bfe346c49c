"""The reference engine's body table (`routes.bodies.SGLANG_BODIES`) against the wire records it parses into."""

import dataclasses
from typing import ClassVar

import pytest

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi (absent on the GPU trainer path)")

from slime_rollout.engines import wire  # noqa: E402
from slime_rollout.engines.reference.routes import bodies  # noqa: E402

WIRE_RECORDS = [
    wire.UpdateWeightsFromDiskReq,
    wire.UpdateWeightsFromTensorReq,
    wire.InitWeightsUpdateGroupReq,
    wire.UpdateWeightsFromDistributedReq,
    wire.DestroyWeightsUpdateGroupReq,
    wire.UpdateWeightVersionReq,
    wire.LoadLoRAAdapterReq,
    wire.UnloadLoRAAdapterReq,
    wire.AbortReq,
]


@pytest.mark.parametrize("record", WIRE_RECORDS, ids=lambda r: r.__name__)
def test_every_wire_record_fits_its_sglang_body(record):
    assert record.endpoint in bodies.SGLANG_BODIES
    bodies._adapter(record)  # builds: every field of the record is one of SGLang's


def test_a_record_field_sglangs_body_lacks_is_refused_when_the_validator_is_built():
    # Was: such a field was silently never filled from the body (the table and the record were not compared).
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MismatchedLoad(wire.WeightUpdateRequest):
        endpoint: ClassVar[str] = "/load_lora_adapter"
        lora_name: str
        lora_path: str
        lora_rank: int = 8

    with pytest.raises(
        TypeError,
        match=r"MismatchedLoad \(/load_lora_adapter\) has field\(s\) lora_rank that SGLang's LoadLoRAAdapterReqInput "
        r"lacks: add them to SGLANG_BODIES in slime_rollout\.engines\.reference\.routes\.bodies",
    ):
        bodies._adapter(MismatchedLoad)

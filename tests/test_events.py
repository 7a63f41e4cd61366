"""The event contract (docs/EVENTS.md): every rule refuses with the check it names, and valid events round-trip."""

import json

import pytest
from demo_events import epoch_events

from streams import EVENT_TYPES, EventDecodeError, RewardScored, TaskGenerated, decode
from streams.events import MAX_EVENT_BYTES

pytestmark = pytest.mark.unit


def test_every_kind_round_trips_through_json():
    events = epoch_events(tasks=2, group=2)
    assert {e.KIND for e in events} == {"task", "rollout", "reward", "batch"}
    for event in events:
        assert decode(event.to_json()) == event


def test_event_ids_are_deterministic_and_ignore_time_and_text():
    a = RewardScored(run_id="r", epoch=1, rollout_id="x", task_id="t", reward=1.0, success=True, produced_at=1.0)
    b = RewardScored(run_id="r", epoch=1, rollout_id="x", task_id="t", reward=0.0, success=False, produced_at=2.0)
    c = RewardScored(run_id="r", epoch=2, rollout_id="x", task_id="t", reward=1.0, success=True)
    assert a.event_id == b.event_id != c.event_id
    assert a.schema == "genenv.reward/1"


GOOD = json.loads(epoch_events(tasks=1, group=1)[1].to_json())  # a RolloutCompleted
assert GOOD["schema"] == "genenv.rollout/1"
TEXT = json.dumps(GOOD, separators=(",", ":"))


@pytest.mark.parametrize(
    "raw, check",
    [
        (b"", "empty"),
        (b"\xff\xfe not json", "not_utf8"),
        (json.dumps(GOOD).encode("utf-16"), "not_utf8"),
        (b"\xef\xbb\xbf" + TEXT.encode(), "not_utf8"),
        (json.dumps({**GOOD, "prompt": "\ud800"}).encode(), "not_utf8"),  # a lone surrogate, escaped
        (json.dumps({**GOOD, "prompt": "x" * MAX_EVENT_BYTES}).encode(), "too_large"),
        (TEXT[:-1].encode() + b',"x":' + b"[" * 600 + b"]" * 600 + b"}", "too_nested"),
        (b"[1, 2]", "not_object"),
        (b"{this is not json", "not_json"),
        (TEXT.replace('"epoch":0', '"epoch":' + "9" * 5000).encode(), "not_json"),  # past Python's int digit limit
        (b'{"schema": "genenv.reward/9"}', "unknown_schema"),
        (b'{"schema": "genenv.nonsense/1"}', "unknown_schema"),
        (b'{"no": "schema"}', "unknown_schema"),
        (json.dumps({**GOOD, "extra": 1}).encode(), "unknown_field"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "task_id"}).encode(), "missing_field:task_id"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "event_id"}).encode(), "missing_field:event_id"),
        (json.dumps({**GOOD, "epoch": True}).encode(), "type:epoch"),  # a bool is not an int ...
        (json.dumps({**GOOD, "behaviour_logprobs": [True]}).encode(), "type:behaviour_logprobs"),  # ... nor a float
        (json.dumps({**GOOD, "run_id": {"a": 1}}).encode(), "type:run_id"),
        (json.dumps({**GOOD, "prompt": None}).encode(), "type:prompt"),  # null only where the field is optional
        (json.dumps({**GOOD, "epoch": 2**63}).encode(), "int_range:epoch"),
        (json.dumps({**GOOD, "completion_token_ids": [-(2**63) - 1]}).encode(), "int_range:completion_token_ids"),
        (TEXT.replace('"behaviour_logprobs":[', '"behaviour_logprobs":[NaN,').encode(), "not_finite"),
        (
            TEXT.replace('"behaviour_logprobs":[', '"behaviour_logprobs":[1e999,').encode(),
            "not_finite:behaviour_logprobs",
        ),
        (json.dumps({**GOOD, "event_id": ""}).encode(), "empty_id:event_id"),
        (json.dumps({**GOOD, "task_id": ""}).encode(), "empty_id:task_id"),
        (json.dumps({**GOOD, "event_id": "forged"}).encode(), "event_id"),
        (json.dumps({**GOOD, "rollout_id": "another"}).encode(), "event_id"),  # identity changed, id kept
    ],
)
def test_each_rule_refuses_with_its_check(raw, check):
    with pytest.raises(EventDecodeError) as info:
        decode(raw)
    assert info.value.check == check
    assert str(info.value).startswith(check)


def test_what_the_contract_accepts():
    assert decode(json.dumps({**GOOD, "prompt": "\ud83d\ude00 [{"}).encode()).prompt == "\U0001f600 [{"  # a pair
    assert decode(json.dumps({**GOOD, "behaviour_logprobs": [-1, 0]}).encode()).behaviour_logprobs == [-1.0, 0.0]
    reward = RewardScored(run_id="r", epoch=0, rollout_id="x", task_id="t", reward=1.0, success=True)
    optional_absent = {k: v for k, v in json.loads(reward.to_json()).items() if k != "checker_detail"}
    assert decode(json.dumps(optional_absent)).checker_detail == ""


def test_a_refused_payload_keeps_its_parsed_object_for_the_quarantine():
    with pytest.raises(EventDecodeError) as info:
        decode(json.dumps({**GOOD, "epoch": "zero"}))
    assert info.value.payload["event_id"] == GOOD["event_id"]


def test_task_key_keeps_a_tasks_events_together():
    task = TaskGenerated(
        run_id="r",
        epoch=0,
        task_id="t1",
        batch_id="b",
        domain="arith",
        env_model_version="v",
        sim_prompt="p",
        raw_generation="g",
    )
    assert task.key == "t1"
    assert set(EVENT_TYPES) == {"task", "rollout", "reward", "batch", "checkpoint", "restart", "reassign"}

import json

import pytest

from streams import EVENT_TYPES, EventDecodeError, RewardScored, TaskGenerated, decode, parse_envelope
from engine.demo import epoch_events


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


@pytest.mark.parametrize("raw, check", [
    (b"\xff\xfe not json", "not_json"),
    (b"[1, 2]", "not_json_object"),
    (b'{"schema": "genenv.reward/9"}', "unknown_schema"),
    (b'{"schema": "genenv.nonsense/1"}', "unknown_schema"),
    (b'{"no": "schema"}', "unknown_schema"),
])
def test_envelope_errors_name_the_check(raw, check):
    with pytest.raises(EventDecodeError) as info:
        parse_envelope(raw)
    assert info.value.check == check
    assert check in str(info.value)


def test_strict_decode_names_missing_and_mistyped_fields():
    good = json.loads(RewardScored(run_id="r", epoch=0, rollout_id="x", task_id="t", reward=1.0, success=True).to_json())
    missing = {k: v for k, v in good.items() if k != "task_id"}
    with pytest.raises(EventDecodeError, match="missing_field:task_id"):
        decode(json.dumps(missing))
    with pytest.raises(EventDecodeError, match="type:reward"):
        decode(json.dumps({**good, "reward": "high"}))
    with pytest.raises(EventDecodeError, match="event_id"):
        decode(json.dumps({**good, "event_id": "forged"}))


def test_task_key_keeps_a_tasks_events_together():
    task = TaskGenerated(run_id="r", epoch=0, task_id="t1", batch_id="b", domain="arith", env_model_version="v",
                         sim_prompt="p", raw_generation="g")
    assert task.key == "t1"
    assert set(EVENT_TYPES) == {"task", "rollout", "reward", "batch", "checkpoint"}

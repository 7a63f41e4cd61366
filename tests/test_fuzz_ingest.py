"""No record can stop the pipeline: a hostile producer's corpus through the real broker, `genenv ingest` and the UI.

Hypothesis draws at least 1,500 mutations of valid events of every kind (the classes that crashed the ingestor
or slipped into silver before, and more: bit flips, truncation, huge strings, deep nesting, wrong types, NaN,
non-UTF-8, redeliveries, conflicting duplicates, forged ids and forged checkpoints). They are produced with ~600
valid events interleaved, each mutation after its original and on its partition (the original's key), and
ingested by `genenv ingest` in a child process. Then:

- the ingestor exits 0, with a peak RSS under 1 GiB;
- silver holds exactly the valid events, once each;
- every mutated record is in the quarantine with a reason, except those whose content equals their original's
  (every field but produced_at, compared as canonical JSON here, not by the ingestor's code), which are counted
  as redeliveries: nothing is in neither;
- every page of the web view of that lake, and every link on it, answers 200 or 404, never 500.
"""

from __future__ import annotations

import dataclasses
import html.parser
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from urllib.parse import parse_qs, urljoin, urlsplit

import polars as pl
import pytest
from conftest import ROOT
from demo_events import epoch_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peak_rss import wait_with_peak_rss

from lake import CHECKPOINTS, QUARANTINE, VALIDATIONS, WEIGHTS, Lake, checkpoint_path, file_sha256, read_table, silver
from streams import TOPICS, CheckpointPublished, EventProducer, TaskGenerated
from streams.events import field_types

pytestmark = pytest.mark.e2e

MUTATIONS = 1_600


def valid_events(lake_root) -> list:
    """~600 events of every kind: eight epochs of a run, tasks with odd ids and difficulty fields, a checkpoint."""
    events = []
    for epoch in range(8):
        events += epoch_events(run_id="fuzz", epoch=epoch, tasks=8, group=4, seed=epoch)
    odd = dict(
        batch_id="odd-b",
        domain="toolcall",
        env_model_version="1",
        sim_prompt="p",
        raw_generation="g",
        task_prompt="<script>alert(1)</script>",
        produced_at=0.0,
    )
    events += [
        TaskGenerated(run_id='odd/run "1"', epoch=0, task_id="a/b/../c?x=1#frag%20", difficulty_json="not json", **odd),
        TaskGenerated(run_id='odd/run "1"', epoch=0, task_id="/leading", difficulty_json='{"level": "hard"}', **odd),
        TaskGenerated(run_id='odd/run "1"', epoch=1, task_id="ünï ☃", difficulty_json='{"other": 3, "$x$": 1}', **odd),
        TaskGenerated(run_id='odd/run "1"', epoch=1, task_id="deep", difficulty_json="[" * 900 + "]" * 900, **odd),
        TaskGenerated(
            run_id="empty-run", epoch=0, task_id="invalid-only", valid=False, invalid_reason="unparseable", **odd
        ),
    ]
    # Real checkpoint folders in the lake: v1's CheckpointPublished may be registered; v2 is never published.
    for version in (1, 2):
        folder = lake_root / checkpoint_path("agent", version)
        folder.mkdir(parents=True)
        (folder / WEIGHTS).write_bytes(os.urandom(4096))
    folder = lake_root / checkpoint_path("agent", 1)
    events.append(
        CheckpointPublished(
            run_id="fuzz",
            epoch=0,
            model_kind="agent",
            version=1,
            parent_version=0,
            path=checkpoint_path("agent", 1),
            sha256=file_sha256(folder / WEIGHTS),
            pool_table="gold/d_train",
            pool_version=1,
            config_hash="c",
            seed=0,
            produced_at=0.0,
        )
    )
    return events


# -- mutations -------------------------------------------------------------------------------------------
def fields_of(event, *types_) -> list[str]:
    return [n for n, t in field_types(type(event)).items() if t in types_ and n not in ("schema",)]


def with_value(payload: dict, field: str, literal: str) -> bytes:
    """The payload's JSON with `field`'s value replaced by a raw JSON literal (what json.dumps cannot write)."""
    marker = "\u0000MARK\u0000"
    return json.dumps({**payload, field: marker}).replace(json.dumps(marker), literal).encode()


def rehashed(event, **changes) -> dict:
    """The event with changed fields and the event_id its new identity hashes to (a contract-valid event)."""
    changed = dataclasses.replace(event, event_id="", **changes)
    return json.loads(changed.to_json())


CLASSES = [
    "deep",
    "int_range",
    "bool_number",
    "lone_surrogate",
    "run_id_object_or_bool",
    "unknown_field",
    "forged_id",
    "empty_id",
    "non_finite",
    "utf16_or_bom",
    "non_utf8",
    "null_field",
    "missing_field",
    "bit_flip",
    "truncate",
    "huge_string",
    "wrong_type",
    "redelivery",
    "conflict",
    "identity_changed",
    "wrong_topic",
    "out_of_range",
    "bad_schema",
    "not_object",
    "empty",
    "forged_checkpoint",
]


@st.composite
def mutation(draw, originals: list, cls: str) -> tuple[int, str, bytes, str]:
    """(index of the original, topic, value, class): a mutation of class `cls` of a drawn original."""
    index = draw(st.integers(0, len(originals) - 1))
    event = originals[index]
    payload = json.loads(event.to_json())
    raw = event.to_json()
    strings, ints, floats = fields_of(event, str), fields_of(event, int), fields_of(event, float)
    topic = event.TOPIC
    if cls == "deep":
        depth = draw(st.integers(200, 20_000))
        value = with_value(payload, draw(st.sampled_from(list(payload))), "[" * depth + "]" * depth)
    elif cls == "int_range":
        big = draw(st.integers(2**63, 2**80)) * draw(st.sampled_from([1, -1]))
        value = json.dumps({**payload, draw(st.sampled_from(ints)): big}).encode()
    elif cls == "bool_number":
        value = json.dumps({**payload, draw(st.sampled_from(ints + floats)): draw(st.booleans())}).encode()
    elif cls == "lone_surrogate":
        name = draw(st.sampled_from(strings))
        value = json.dumps({**payload, name: payload[name] + chr(draw(st.integers(0xD800, 0xDFFF)))}).encode()
    elif cls == "run_id_object_or_bool":
        value = json.dumps(
            {
                **payload,
                "run_id": draw(
                    st.one_of(
                        st.booleans(),
                        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
                        st.lists(st.integers(), max_size=3),
                    )
                ),
            }
        ).encode()
    elif cls == "unknown_field":
        name = draw(st.text(min_size=1, max_size=20).filter(lambda n: n not in payload))
        value = json.dumps({**payload, name: draw(st.one_of(st.integers(), st.text(max_size=10), st.none()))}).encode()
    elif cls == "forged_id":
        value = json.dumps(
            {
                **payload,
                "event_id": draw(
                    st.text("0123456789abcdef", min_size=32, max_size=32).filter(lambda i: i != event.event_id)
                ),
            }
        ).encode()
    elif cls == "empty_id":
        name = draw(
            st.sampled_from([n for n in ("event_id", "run_id", "task_id", "rollout_id", "batch_id") if n in payload])
        )
        value = json.dumps({**payload, name: ""}).encode()
    elif cls == "non_finite":
        value = with_value(
            payload, draw(st.sampled_from(floats)), draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"]))
        )
    elif cls == "utf16_or_bom":
        text = raw.decode()
        value = draw(
            st.sampled_from(
                [text.encode("utf-16"), text.encode("utf-16-le"), text.encode("utf-32"), b"\xef\xbb\xbf" + raw]
            )
        )
    elif cls == "non_utf8":
        at = draw(st.integers(0, len(raw)))
        value = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"])) + raw[at:]
    elif cls == "null_field":
        name = draw(
            st.sampled_from(
                [
                    n
                    for n, t in field_types(type(event)).items()
                    if n != "schema" and type(None) not in getattr(t, "__args__", ())
                ]
            )
        )
        value = json.dumps({**payload, name: None}).encode()
    elif cls == "missing_field":
        name = draw(
            st.sampled_from(["schema", "event_id", *[n for n in payload if n in ("run_id", "epoch", "task_id")]])
        )
        value = json.dumps({k: v for k, v in payload.items() if k != name}).encode()
    elif cls == "bit_flip":
        flipped = bytearray(raw)
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(raw) - 1))
            flipped[at] ^= 1 << draw(st.integers(0, 7))
        value = bytes(flipped)
    elif cls == "truncate":
        value = raw[: draw(st.integers(1, len(raw) - 1))]
    elif cls == "huge_string":
        value = json.dumps(
            {**payload, draw(st.sampled_from(strings)): "x" * draw(st.integers(200_001, 900_000))}
        ).encode()
    elif cls == "wrong_type":
        name = draw(st.sampled_from([n for n in payload if n != "schema"]))
        current = payload[name]
        wrong = {str: 7, int: "7", float: "0.5", bool: 1, list: "[]", type(None): "x"}[type(current)]
        value = json.dumps({**payload, name: wrong}).encode()
    elif cls == "redelivery":
        value = json.dumps({**payload, "produced_at": draw(st.floats(0, 2e9))}).encode() if draw(st.booleans()) else raw
    elif cls == "conflict":
        name = draw(
            st.sampled_from(
                [
                    n
                    for n in strings
                    if n not in (*type(event).IDENTITY, "run_id", "event_id", "task_id", "model_kind", "path")
                ]
            )
        )
        value = json.dumps({**payload, name: payload[name] + draw(st.text(min_size=1, max_size=30))}).encode()
    elif cls == "identity_changed":
        name = draw(st.sampled_from(["run_id", "epoch", *type(event).IDENTITY]))
        new = payload[name] + 1 if isinstance(payload[name], int) else payload[name] + "-x"
        value = json.dumps({**payload, name: new}).encode()
    elif cls == "wrong_topic":
        topic = draw(st.sampled_from([t for t in TOPICS.values() if t != event.TOPIC]))
        value = raw
    elif cls == "out_of_range":
        name, bad = draw(
            st.sampled_from(
                [
                    ("epoch", -1),
                    *[(n, 1.5) for n in ("reward", "p_hat", "env_reward") if n in payload],
                    *[
                        (n, -3)
                        for n in ("group_index", "n_tasks", "n_rollouts", "n_success", "version")
                        if n in payload
                    ],
                ]
            )
        )
        value = json.dumps(rehashed(event, **{name: bad})).encode()
    elif cls == "bad_schema":
        value = json.dumps(
            {**payload, "schema": draw(st.sampled_from([f"genenv.{event.KIND}/2", "genenv.nope/1", 5, None, "task"]))}
        ).encode()
    elif cls == "not_object":
        value = draw(st.sampled_from([b"[]", b"[1, 2]", b"42", b'"a string"', b"null", b"true", b"{this is not json"]))
    elif cls == "empty":
        value = b""
    else:  # forged_checkpoint
        checkpoint = next(e for e in originals if isinstance(e, CheckpointPublished))
        index = originals.index(checkpoint)
        topic = checkpoint.TOPIC
        forged = draw(
            st.sampled_from(
                [
                    {"version": 3, "path": "../../../../../../etc"},
                    {"version": 3, "path": "a\u0000b\u0000"},
                    {"version": 3, "path": "/etc"},
                    {"version": 3, "path": checkpoint_path("agent", 3) + "/../../../.."},
                    {"version": 3, "path": checkpoint_path("agent", 1)},  # another version's real files
                    {"version": 3, "path": checkpoint_path("agent", 3)},  # no such folder
                    {
                        "version": 2,
                        "path": checkpoint_path("agent", 2),
                        "sha256": "0" * 64,
                    },  # real files, not that hash
                    {"run_id": "other-run"},
                    {"epoch": 5, "sha256": "0" * 64},  # a second agent v1
                    {"model_kind": "env", "path": checkpoint_path("env", 1)},  # no such folder
                ]
            )
        )
        value = json.dumps(rehashed(checkpoint, **forged)).encode()
    return index, topic, value, cls


def same_content(value: bytes, original) -> bool:
    """The oracle for "a redelivery": strict UTF-8 JSON whose fields, but produced_at, equal the original's as
    canonical JSON, with produced_at a finite number. Written apart from the ingestor's own rules on purpose."""
    try:
        text = value.decode("utf-8")
        payload = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    if text.startswith("\ufeff") or not isinstance(payload, dict):
        return False
    produced_at = payload.pop("produced_at", None)
    if type(produced_at) not in (int, float) or not math.isfinite(produced_at):
        return False
    expected = json.loads(original.to_json())
    expected.pop("produced_at")
    return json.dumps(payload, sort_keys=True) == json.dumps(expected, sort_keys=True)


# -- the corpus, produced and ingested once for the module ----------------------------------------------
@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    from streams import LocalBroker, ensure_topics

    root = tmp_path_factory.mktemp("fuzz") / "lake"
    lake = Lake(root)
    originals = valid_events(root)
    corpus: list[tuple[int, str, bytes, str]] = []

    # One hypothesis run per class, each its share of the mutations, so every class is well represented
    # however hypothesis explores the drawn originals and values.
    for cls in CLASSES:

        @settings(
            max_examples=MUTATIONS // len(CLASSES) + 1,
            database=None,
            derandomize=True,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(mutation(originals, cls))
        def collect(drawn):
            corpus.append(drawn)

        collect()
    assert len(corpus) >= 1_500, f"hypothesis drew only {len(corpus)} mutations"

    # Interleave: each mutation somewhere after its original, on the original's partition (its key).
    rng = random.Random(0)
    order = [(i, 0, None) for i in range(len(originals))]
    order += [(rng.randint(m[0], len(originals)), 1, m) for m in corpus]
    order.sort(key=lambda o: (o[0], o[1]))
    coordinates: dict[tuple[str, int, int], tuple[int, str, bytes, str]] = {}
    with LocalBroker() as broker:
        ensure_topics(broker.bootstrap)
        with EventProducer(broker.bootstrap, client_id="fuzz") as producer:
            sent = []
            for position, is_mutation, m in order:
                if not is_mutation:
                    sent.append((producer.send(originals[position]), None))
                else:
                    key = originals[m[0]].key.encode()
                    sent.append((producer.send_raw(m[1], m[2], key=key), m))
            producer.flush()
            for future, m in sent:
                meta = future.get(timeout=60)
                if m is not None:
                    coordinates[(meta.topic, meta.partition, meta.offset)] = m
        log = root.parent / "ingest.log"
        with open(log, "wb") as out:  # a file, not a pipe: a child never blocks on a full pipe
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "engine.cli",
                    "ingest",
                    "--lake",
                    str(root),
                    "--bootstrap",
                    broker.bootstrap,
                    "--idle-exit",
                    "3",
                    "--max-wait",
                    "3",
                    "--max-batch-ms",
                    "500",
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            returncode, peak_rss = wait_with_peak_rss(process)
        stderr = log.read_text(errors="replace")
    return {
        "lake": lake,
        "originals": originals,
        "corpus": corpus,
        "coordinates": coordinates,
        "returncode": returncode,
        "stderr": stderr,
        "peak_rss": peak_rss,
    }


def test_the_ingestor_survives_the_corpus_within_its_memory_bound(fuzzed):
    assert fuzzed["returncode"] == 0, fuzzed["stderr"][-3000:]
    assert 0 < fuzzed["peak_rss"] < 1 << 30, f"peak RSS {fuzzed['peak_rss'] / 2**20:.0f} MiB"
    classes = Counter(m[3] for m in fuzzed["corpus"])
    assert len(classes) == 26 and min(classes.values()) >= 20, classes


def test_every_valid_event_lands_once_and_every_mutation_is_quarantined_or_a_counted_redelivery(fuzzed):
    lake, originals = fuzzed["lake"], fuzzed["originals"]
    landed = []
    for kind in ("task", "rollout", "reward", "batch", "checkpoint"):
        landed += read_table(lake, silver(kind))["event_id"].to_list()
    assert len(landed) == len(set(landed))
    assert set(landed) == {e.event_id for e in originals}
    registry = read_table(lake, CHECKPOINTS)
    assert registry.select("model_kind", "version").rows() == [("agent", 1)]
    assert registry["run_id"].to_list() == ["fuzz"]

    quarantine = read_table(lake, QUARANTINE)
    assert quarantine.filter(pl.col("reason").str.len_chars() == 0).height == 0
    quarantined = set(quarantine.select("topic", "kafka_partition", "kafka_offset").rows())
    redelivered = {
        c
        for c, m in fuzzed["coordinates"].items()
        if m[1] == originals[m[0]].TOPIC and same_content(m[2], originals[m[0]])
    }
    assert quarantined == set(fuzzed["coordinates"]) - redelivered  # nothing is in neither
    counted = sum(json.loads(c).get("redelivery", 0) for c in read_table(lake, VALIDATIONS)["unexpected_counts"])
    assert counted == len(redelivered)
    by_class = Counter(fuzzed["coordinates"][c][3] for c in quarantined)
    checks = Counter(quarantine["failed_checks"].list.first())
    assert (
        checks["registry_path"]
        and checks["registry_files"]
        and checks["registry_sha256"]
        and checks["registry_version_taken"]
    ), checks
    assert by_class["redelivery"] == 0 and by_class["conflict"] == Counter(m[3] for m in fuzzed["corpus"])["conflict"]


# -- the web view of that lake --------------------------------------------------------------------------
class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


def test_every_link_of_the_web_view_answers_200_or_404(fuzzed):
    from engine.lineage import create_app

    client = create_app(fuzzed["lake"]).test_client()
    queue = [
        "/",
        "/quarantine",
        "/evals",
        "/tasks?q=a/",
        "/run?id=nope",
        "/task?id=nope",
        "/plot?run=fuzz&name=x",
        "/checkpoints/nope/1",
        "/task",
        "/run",
    ]
    seen, statuses = set(), Counter()
    while queue and len(seen) < 2_000:
        url = queue.pop()
        if url in seen:
            continue
        seen.add(url)
        response = client.get(url)
        statuses[response.status_code] += 1
        assert response.status_code in (200, 302, 404), f"{url} answered {response.status_code}"
        if response.status_code == 302:
            queue.append(response.headers["Location"])
        if response.mimetype == "text/html":
            parser = Links()
            parser.feed(response.get_data(as_text=True))
            queue += [link for link in (urljoin(url, x) for x in parser.links) if not urlsplit(link).netloc]
    tasks = {e.task_id for e in fuzzed["originals"] if isinstance(e, TaskGenerated)}
    reached = {parse_qs(urlsplit(u).query)["id"][0] for u in seen if u.startswith("/task?id=")}
    assert tasks <= reached, f"task pages never linked: {sorted(tasks - reached)[:5]}"
    assert any(u.startswith("/plot?") for u in seen) and statuses[200] > len(tasks), statuses
    odd_task = client.get("/task", query_string={"id": "a/b/../c?x=1#frag%20"})
    assert odd_task.status_code == 200 and "&lt;script&gt;" in odd_task.get_data(as_text=True)

import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import ROOT, _tansu_children
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from streams import TOPICS, BrokerError, LocalBroker, TopicLayoutError, ensure_topics, kafka_bootstrap
from streams.broker import broker_answers
from streams.kafka import partition_counts

pytestmark = pytest.mark.integration


def test_local_broker_starts_answers_and_stops_cleanly():
    broker = LocalBroker().start()
    pid = broker.process.pid
    assert broker_answers(broker.bootstrap)
    broker.stop()
    assert not broker.running
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not broker_answers(broker.bootstrap, timeout_s=0.5)


def test_broker_stops_when_the_body_raises():
    try:
        with kafka_bootstrap(None) as bootstrap:
            assert broker_answers(bootstrap)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert not broker_answers(bootstrap, timeout_s=0.5)


def test_configured_bootstrap_starts_nothing(monkeypatch, broker):
    monkeypatch.setenv("GENENV_KAFKA_BOOTSTRAP", broker.bootstrap)
    before = len(_tansu_children())
    with kafka_bootstrap(None) as bootstrap:
        assert bootstrap == broker.bootstrap
        assert len(_tansu_children()) == before


def test_kafka_clients_take_their_security_options_from_the_environment(monkeypatch, broker):
    from streams import ensure_topics
    from streams.kafka import security

    monkeypatch.setenv("GENENV_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")  # what the local broker speaks
    monkeypatch.setenv("GENENV_KAFKA_SASL_MECHANISM", "")  # empty: unset
    assert security() == {"security_protocol": "PLAINTEXT"}
    ensure_topics(broker.bootstrap)  # a client built with them still reaches the broker
    monkeypatch.setenv("GENENV_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("GENENV_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("GENENV_KAFKA_SASL_PLAIN_USERNAME", "ingest")
    monkeypatch.setenv("GENENV_KAFKA_SASL_PLAIN_PASSWORD", "secret")
    assert security() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "ingest",
        "sasl_plain_password": "secret",
    }


def test_a_configured_broker_that_does_not_answer_is_one_error_within_the_stated_wait(monkeypatch):
    monkeypatch.setenv("GENENV_BROKER_WAIT_S", "1")
    with pytest.raises(BrokerError, match="no Kafka broker answered at 127.0.0.1:1 within 1s"):
        with kafka_bootstrap("127.0.0.1:1"):
            pass
    with pytest.raises(BrokerError, match="not host:port"):
        with kafka_bootstrap("127.0.0.1:99999"):
            pass


def genenv_broker() -> tuple[subprocess.Popen, str, list[psutil.Process]]:
    """`genenv broker` started as a user starts it: the process, the address it printed, its Tansu children."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "broker"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and address is None:
        line = proc.stdout.readline()
        if line.startswith("127.0.0.1:"):
            address = line.strip()
    brokers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "tansu" in c.name()]
    return proc, address, brokers


@pytest.mark.parametrize("how", ["ctrl_c", "sigkill"])
def test_genenv_broker_stops_its_broker_on_ctrl_c_and_when_killed(how):
    """Ctrl-C: the command stops its broker. SIGKILL gives it no chance: the kernel's parent-death signal does."""
    proc, address, brokers = genenv_broker()
    try:
        assert address and broker_answers(address) and brokers
        if how == "ctrl_c":
            proc.send_signal(signal.SIGINT)
        else:
            proc.kill()
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(brokers, timeout=30)
        assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive), [p.pid for p in alive]
        assert not broker_answers(address, timeout_s=0.5)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_new_topics_take_the_existing_partition_count_and_a_mixed_layout_is_one_error(monkeypatch):
    """Every genenv topic is keyed by task id and the reward worker reads a task's events from one partition
    number in each: new topics join the count that is there, and topics that disagree stop the command."""
    with LocalBroker() as local:
        admin = KafkaAdminClient(bootstrap_servers=local.bootstrap, client_id="test")
        try:
            admin.create_topics([NewTopic(TOPICS["task"], num_partitions=2, replication_factor=1)])
            ensure_topics(local.bootstrap, partitions=3)
            assert set(partition_counts(admin, list(TOPICS.values())).values()) == {2}
        finally:
            admin.close()
    with LocalBroker() as local:
        admin = KafkaAdminClient(bootstrap_servers=local.bootstrap, client_id="test")
        try:
            admin.create_topics(
                [
                    NewTopic(TOPICS["task"], num_partitions=2, replication_factor=1),
                    NewTopic(TOPICS["rollout"], num_partitions=4, replication_factor=1),
                ]
            )
        finally:
            admin.close()
        with pytest.raises(TopicLayoutError, match=r"different partition counts .*genenv\.rollouts 4.*genenv\.tasks 2"):
            ensure_topics(local.bootstrap)
        monkeypatch.setenv("GENENV_KAFKA_REPLICATION_FACTOR", "two")
        with pytest.raises(BrokerError, match="GENENV_KAFKA_REPLICATION_FACTOR must be a whole number"):
            ensure_topics(local.bootstrap)

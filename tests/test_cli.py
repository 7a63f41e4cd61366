"""The command line as a user runs it: ingest, lake status, and one-line errors (the main job: test_engine.py)."""

from engine.demo import epoch_events, publish
from lake import Lake, read_pool

from conftest import genenv_cli


def test_ingest_lands_published_epochs_then_status_reports_them(tmp_path, broker):
    lake = tmp_path / "lake"
    publish(broker.bootstrap, epoch_events(epoch=0, tasks=4, group=2) + epoch_events(epoch=1, tasks=4, group=2))
    result = genenv_cli("ingest", "--lake", str(lake), "--bootstrap", broker.bootstrap, "--idle-exit", "2", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_pool(Lake(lake, create=False), "d_train").height == 2 * 4 * 2
    assert read_pool(Lake(lake, create=False), "d_env").height == 2 * 4
    status = genenv_cli("lake", "status", "--lake", str(lake), timeout=120)
    assert status.returncode == 0 and "gold/d_train" in status.stdout


def test_bad_paths_and_values_stop_with_one_line(tmp_path):
    missing = genenv_cli("lake", "status", "--lake", str(tmp_path / "nowhere"), timeout=120)
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "no lake at" in missing.stderr
    a_file = tmp_path / "file"
    a_file.write_text("x")
    not_dir = genenv_cli("ingest", "--lake", str(a_file), timeout=120)
    assert not_dir.returncode == 2 and "not a directory" in not_dir.stderr
    zero = genenv_cli("ingest", "--lake", str(tmp_path / "l"), "--partitions", "0", timeout=120)
    assert zero.returncode == 2 and "--partitions must be >= 1" in zero.stderr
    assert not (tmp_path / "l").exists(), "a bad value must stop before any work"

"""``minibroker broker`` refuses bad flags and an unusable meta.properties with one readable line, before it starts.

Each case once ended in a traceback (a '²' port), a silent wrong value (a '٣' port read as 3) or a broker
that started and then retried something hopeless every second forever (``--controller HOST:0``, a node id
beyond Kafka's int32 that the controller refuses at registration); a garbage meta.properties was reported
as "belongs to node.id=None".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.process import DEFAULT_CLUSTER_ID, DataDirError, check_meta, record_cluster_id
from tests.procs import REPO


def broker(data_dir: Path, *flags: str, node_id: str = "1", listen: str = "127.0.0.1:0",
           controller: str = "127.0.0.1:1") -> subprocess.CompletedProcess[str]:
    """Run the broker command; every case here must end at once (the timeout fails the test otherwise)."""
    argv = [sys.executable, "-m", "cli.main", "broker", "--node-id", node_id, "--listen", listen,
            "--controller", controller, "--data-dir", str(data_dir), *flags]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30)


def assert_one_line(r: subprocess.CompletedProcess[str], *wanted: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("minibroker: error: "), r.stderr
    for text in wanted:
        assert text in r.stderr, r.stderr


@pytest.mark.parametrize("port", ["²", "٣"])
@pytest.mark.parametrize("flag", ["--listen", "--controller", "--advertise"])
def test_a_port_that_is_not_ascii_digits_is_refused(tmp_path: Path, flag: str, port: str) -> None:
    d = tmp_path / "b"
    address = f"127.0.0.1:{port}"
    r = (broker(d, "--advertise", address) if flag == "--advertise"
         else broker(d, listen=address) if flag == "--listen" else broker(d, controller=address))
    assert_one_line(r, f"{flag}: expected HOST:PORT, got '{address}'")
    assert not d.exists(), "refused before the data dir is touched"


def test_controller_port_zero_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "b"
    r = broker(d, controller="127.0.0.1:0")
    assert_one_line(r, "--controller: port must be 1-65535, got '127.0.0.1:0'")
    assert not d.exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--listen", "127.0.0.1:65536", "port must be 0-65535"),
    ("--controller", ":9", "expected HOST:PORT"),
    ("--controller", "h:", "expected HOST:PORT"),
    ("--advertise", "h:-1", "expected HOST:PORT"),
])
def test_other_bad_addresses(tmp_path: Path, flag: str, value: str, message: str) -> None:
    d = tmp_path / "b"
    r = (broker(d, flag, value) if flag == "--advertise"
         else broker(d, listen=value) if flag == "--listen" else broker(d, controller=value))
    assert_one_line(r, f"{flag}: {message}, got {value!r}")
    assert not d.exists()


@pytest.mark.parametrize(("flag", "value"), [("--advertise", "a+b:9092"), ("--advertise", "h/x:9092"),
                                             ("--listen", "a@b:0")])
def test_a_host_the_controller_would_refuse_is_refused_at_start(tmp_path: Path, flag: str, value: str) -> None:
    # it started, served, and retried its registration for ever (HTTP 400 each time; found by a review)
    d = tmp_path / "b"
    r = broker(d, flag, value) if flag == "--advertise" else broker(d, listen=value)
    host = value.rsplit(":", 1)[0]
    assert_one_line(r, f"{flag}: the host must be a host name or IP address (")
    assert f"got {host!r}" in r.stderr
    assert not d.exists()


@pytest.mark.parametrize(("node_id", "message"), [
    ("2147483648", "--node-id must be at most 2147483647, got 2147483648"),
    (str(2**40), "--node-id must be at most 2147483647, got 1099511627776"),
    ("-1", "--node-id must be >= 0, got -1"),
    ("٣", "--node-id must be an integer, got '٣'"),
])
def test_node_id_out_of_int32_range_is_a_usage_error(tmp_path: Path, node_id: str, message: str) -> None:
    d = tmp_path / "b"
    r = broker(d, node_id=node_id)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("usage: minibroker broker")
    assert r.stderr.strip().splitlines()[-1] == f"minibroker broker: error: argument --node-id: {message}"
    assert not d.exists(), "no meta.properties is written for a node id the controller would refuse"


@pytest.mark.parametrize(("content", "shown"), [
    ("garbage text\nmore garbage\n", "(it holds 'garbage text\\nmore garbage')"),
    ("", "(the file is empty)"),
    ("\n\n  \n", "(the file is empty)"),
    ("x" * 200, "(it holds '" + "x" * 40 + "...')"),
    ("version=1\n", "(it holds 'version=1')"),
    ("node.id=abc\n", "(node.id='abc' is not an integer in [0, 2147483647])"),
    ("node.id=2147483648\n", "(node.id='2147483648' is not an integer in [0, 2147483647])"),
])
def test_meta_properties_without_a_usable_node_id(tmp_path: Path, content: str, shown: str) -> None:
    d = tmp_path / "b"
    d.mkdir()
    meta = d / "meta.properties"
    meta.write_text(content)
    r = broker(d)
    assert_one_line(r, f"{meta} has no usable node.id {shown}",
                    f"if {d} is not another broker's data dir, remove {meta} and start again")
    assert "node.id=None" not in r.stderr
    assert meta.read_text() == content, "left as it was"
    assert not (d / "endpoint").exists()


def test_meta_properties_that_is_not_utf8(tmp_path: Path) -> None:
    d = tmp_path / "b"
    d.mkdir()
    (d / "meta.properties").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataDirError, match=r"has no usable node\.id \(it is not UTF-8 text\); if .* remove "):
        check_meta(d, 1)


def test_meta_properties_of_this_node_is_kept(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("# written by hand\nversion=1\nnode.id=0007\ncluster.id=c\n")
    assert check_meta(tmp_path, 7) == "c"
    assert "node.id=7\n" in (tmp_path / "meta.properties").read_text()
    with pytest.raises(DataDirError, match=r"belongs to node\.id=0007, not 8$"):
        (tmp_path / "meta.properties").write_text("node.id=0007\n")
        check_meta(tmp_path, 8)


def test_meta_properties_already_as_wanted_is_not_written_again(tmp_path: Path) -> None:
    # as Kafka: a restart on a full disk then gets as far as the logs (it failed here at once, and a broker
    # that had just started registering held its session from the next start)
    assert check_meta(tmp_path, 3) is None  # a new dir: no cluster until the first registration records one
    path = tmp_path / "meta.properties"
    assert path.read_text() == "version=1\nnode.id=3\n"
    before = path.stat().st_ino
    assert check_meta(tmp_path, 3) is None
    assert path.stat().st_ino == before  # not replaced (a write goes through a temp file and a rename)
    record_cluster_id(tmp_path, 3, "Zx9-abc_DEF")
    assert path.read_text() == "version=1\nnode.id=3\ncluster.id=Zx9-abc_DEF\n"
    before = path.stat().st_ino
    assert check_meta(tmp_path, 3) == "Zx9-abc_DEF"
    assert path.stat().st_ino == before


def test_the_controllers_data_dir_is_refused_as_such(tmp_path: Path) -> None:
    # its meta.properties has a cluster.id and no node.id; the hint to remove the file would have removed a copy
    # of the cluster id (the controller writes it again from its journal, but the dir is still not the broker's)
    (tmp_path / "meta.properties").write_text("version=1\ncluster.id=Zx9-abc_DEF\n")
    with pytest.raises(DataDirError, match=r"looks like the controller's data dir; give the broker a --data-dir"):
        check_meta(tmp_path, 3)


def test_a_meta_properties_from_before_cluster_ids_names_no_cluster(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text(f"version=1\nnode.id=3\ncluster.id={DEFAULT_CLUSTER_ID}\n")
    assert check_meta(tmp_path, 3) is None
    (tmp_path / "meta.properties").write_text("version=1\nnode.id=3\ncluster.id=not one!\n")
    with pytest.raises(DataDirError, match=r"has an unusable cluster\.id \('not one!'\)"):
        check_meta(tmp_path, 3)

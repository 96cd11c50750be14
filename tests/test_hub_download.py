"""The downloader against a local stand-in of the hub endpoints, over real HTTP on loopback."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hub_standin import HubStandIn  # tests/ is on sys.path (pytest rootdir conftest)

from app.hub.download import (
    ChecksumMismatch,
    DownloadCancelled,
    Downloader,
    HubError,
    InsufficientDisk,
    OfflineError,
    Progress,
    UnverifiedDownload,
)
from app.hub.paths import UnsafeFilename

REPO = "z-lab/Tiny-DFlash"
MiB = 1 << 20


@pytest.fixture
def hub():
    h = HubStandIn().start()
    yield h
    h.stop()


@pytest.fixture
def data() -> bytes:
    return os.urandom(3 * MiB + 12345)


def _models(tmp_path: Path) -> Path:
    return tmp_path / "data" / "models"


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_full_download_is_verified_and_lands_in_the_models_folder(hub: HubStandIn, data: bytes,
                                                                    tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    events: list[Progress] = []
    path = dl.fetch(REPO, "drafter.gguf", progress=events.append)
    assert path == _models(tmp_path) / "drafter.gguf" and path.read_bytes() == data
    stages = [e.stage for e in events]
    assert stages[0] == "download" and "verify" in stages and stages[-1] == "done"
    downloads = [e.done for e in events if e.stage == "download"]
    assert downloads == sorted(downloads) and downloads[-1] == len(data) and len(downloads) >= 3
    assert [(r.method, r.range) for r in hub.log] == [("HEAD", None), ("GET", None)]
    assert _listing(_models(tmp_path)) == ["drafter.gguf"]
    assert dl.partial_bytes(REPO, "drafter.gguf") == 0
    # a second fetch finds it and asks nothing
    assert dl.fetch(REPO, "drafter.gguf") == path and len(hub.log) == 2


def _cancel_after_first_chunk(hub: HubStandIn, dl: Downloader, name: str) -> None:
    """Pause the server after 1 MiB, cancel once it arrived: a deterministic interruption."""
    hub.pause_after = MiB
    cancel = threading.Event()

    def progress(p: Progress) -> None:
        if p.stage == "download" and p.done >= MiB:
            cancel.set()
            hub.release.set()

    with pytest.raises(DownloadCancelled, match=f"{REPO}/{name}: download cancelled"):
        dl.fetch(REPO, name, progress=progress, cancel=cancel)
    hub.pause_after = None


def test_cancelled_download_leaves_nothing_in_the_models_folder(hub: HubStandIn, data: bytes,
                                                                tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    _cancel_after_first_chunk(hub, dl, "drafter.gguf")
    assert _listing(_models(tmp_path)) == []
    assert dl.partial_bytes(REPO, "drafter.gguf") == MiB  # kept outside, for a resume
    assert not str(dl.staging).startswith(str(_models(tmp_path)) + os.sep)
    dl.discard_partial(REPO, "drafter.gguf")
    assert dl.partial_bytes(REPO, "drafter.gguf") == 0


def test_resumed_download_asks_only_for_the_rest(hub: HubStandIn, data: bytes, tmp_path: Path) -> None:
    sha = hub.add(REPO, "drafter.gguf", data)
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    _cancel_after_first_chunk(hub, dl, "drafter.gguf")
    hub.log.clear()
    events: list[Progress] = []
    path = Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(REPO, "drafter.gguf", sha256=sha,
                                                                       progress=events.append)
    assert path.read_bytes() == data
    assert [(r.method, r.range) for r in hub.log] == [("HEAD", None), ("GET", f"bytes={MiB}-")]
    assert [e.done for e in events if e.stage == "download"][0] > MiB  # counted from the resume point


def test_partial_of_a_changed_file_is_not_resumed(hub: HubStandIn, data: bytes, tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    _cancel_after_first_chunk(hub, dl, "drafter.gguf")
    new = os.urandom(len(data))
    hub.add(REPO, "drafter.gguf", new)  # republished: another sha256
    hub.log.clear()
    assert dl.fetch(REPO, "drafter.gguf").read_bytes() == new
    assert hub.gets()[0].range is None


def test_checksum_mismatch_rejects_the_file(hub: HubStandIn, data: bytes, tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    hub.corrupt.add((REPO, "drafter.gguf"))
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(ChecksumMismatch, match=f"{REPO}/drafter.gguf: sha256 mismatch") as ei:
        dl.fetch(REPO, "drafter.gguf")
    assert "deleted" in str(ei.value)
    assert _listing(_models(tmp_path)) == []
    assert dl.partial_bytes(REPO, "drafter.gguf") == 0  # nothing half-written anywhere


def test_catalog_sha256_wins_over_the_hubs(hub: HubStandIn, data: bytes, tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(ChecksumMismatch, match="expected " + "0" * 64):
        dl.fetch(REPO, "drafter.gguf", sha256="0" * 64)
    assert _listing(_models(tmp_path)) == []


@pytest.mark.parametrize("name", ["../evil.gguf", "a/../../evil.gguf", "/etc/passwd", "..\\evil.gguf",
                                  "sub/./x.gguf", ""])
def test_path_traversal_filename_is_rejected_before_any_request(hub: HubStandIn, tmp_path: Path,
                                                                name: str) -> None:
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(UnsafeFilename):
        dl.fetch(REPO, name)
    with pytest.raises(UnsafeFilename):
        dl.fetch(REPO, "ok.gguf", dest_name=name)
    assert hub.log == []
    assert not (tmp_path / "data" / "evil.gguf").exists() and not (tmp_path / "evil.gguf").exists()


def test_a_file_in_a_subfolder_is_fine(hub: HubStandIn, tmp_path: Path) -> None:
    hub.add(REPO, "sub/dir/x.gguf", b"x" * 1000)
    p = Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(REPO, "sub/dir/x.gguf")
    assert p == _models(tmp_path) / "sub/dir/x.gguf" and p.read_bytes() == b"x" * 1000


def test_free_disk_is_checked_before_downloading(hub: HubStandIn, tmp_path: Path) -> None:
    hub.add(REPO, "huge.gguf", b"x" * 1000)
    hub.announce_size[(REPO, "huge.gguf")] = 10 ** 16  # 10 PB
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(InsufficientDisk, match=f"{REPO}/huge.gguf: needs 10000000.00 GB"):
        dl.fetch(REPO, "huge.gguf")
    assert hub.gets() == [] and _listing(_models(tmp_path)) == []


def test_offline_mode_never_touches_the_network(hub: HubStandIn, data: bytes, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add(REPO, "drafter.gguf", data)
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint, offline=True)
    with pytest.raises(OfflineError, match="offline mode is on"):
        dl.fetch(REPO, "drafter.gguf")
    monkeypatch.setenv("FLASHDESK_OFFLINE", "1")
    with pytest.raises(OfflineError):
        Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(REPO, "drafter.gguf")
    assert hub.log == []
    # once downloaded (online), offline mode serves it from the folder
    Downloader(_models(tmp_path), endpoint=hub.endpoint, offline=False).fetch(REPO, "drafter.gguf")
    n = len(hub.log)
    assert Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(REPO, "drafter.gguf").read_bytes() == data
    assert len(hub.log) == n


def test_missing_file_and_unreachable_hub_are_clear_errors(hub: HubStandIn, tmp_path: Path) -> None:
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(HubError, match=f"{REPO}/nope.gguf"):
        dl.fetch(REPO, "nope.gguf")
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HubError, match="cannot reach the hub"):
        Downloader(_models(tmp_path), endpoint=f"http://127.0.0.1:{port}").fetch(REPO, "x.gguf")
    assert _listing(_models(tmp_path)) == []


# --- issue 16, point 5: nothing unverified reaches the models folder ---------------------------------------


def test_without_a_checksum_in_the_etag_the_lfs_sha256_comes_from_the_hubs_api(hub: HubStandIn, data: bytes,
                                                                               tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    hub.opaque_etag.add((REPO, "drafter.gguf"))  # as a proxy in front of the hub may answer
    path = Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(REPO, "drafter.gguf")
    assert path == _models(tmp_path) / "drafter.gguf" and path.read_bytes() == data
    assert [r.method for r in hub.log] == ["HEAD", "POST", "GET"]
    assert hub.log[1].path == f"/api/models/{REPO}/paths-info/main"


def test_a_corrupted_download_is_refused_against_the_apis_sha256(hub: HubStandIn, data: bytes,
                                                                 tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    hub.opaque_etag.add((REPO, "drafter.gguf"))
    hub.corrupt.add((REPO, "drafter.gguf"))
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(ChecksumMismatch, match=r"sha256 mismatch: expected [0-9a-f]{64} \(the hub's LFS metadata\)"):
        dl.fetch(REPO, "drafter.gguf")
    assert _listing(_models(tmp_path)) == [] and dl.unverified(REPO, "drafter.gguf") is None


def test_a_file_kept_in_git_is_checked_against_its_git_blob_id(hub: HubStandIn, tmp_path: Path) -> None:
    config = b'{"architectures": ["DFlashDraftModel"], "block_size": 16}\n'
    hub.add(REPO, "config.json", config)
    hub.in_git.add((REPO, "config.json"))  # no LFS, so no sha256 anywhere: git's id is the checksum
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    assert dl.fetch(REPO, "config.json").read_bytes() == config
    hub.add(REPO, "other.json", config)
    hub.in_git.add((REPO, "other.json"))
    hub.corrupt.add((REPO, "other.json"))
    with pytest.raises(ChecksumMismatch, match=r"other.json: git-sha1 mismatch: .* \(the hub's git blob id\)"):
        dl.fetch(REPO, "other.json")
    assert _listing(_models(tmp_path)) == ["config.json"]


def test_a_file_with_no_checksum_anywhere_waits_outside_the_models_folder_until_accepted(
        hub: HubStandIn, data: bytes, tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    hub.opaque_etag.add((REPO, "drafter.gguf"))
    hub.no_api = True  # a bare mirror: no paths-info either
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint)
    with pytest.raises(UnverifiedDownload) as ei:
        dl.fetch(REPO, "drafter.gguf")
    held = dl.unverified(REPO, "drafter.gguf")
    assert held is not None and held.read_bytes() == data and ei.value.path == held
    assert str(ei.value).startswith(f"{REPO}/drafter.gguf: neither the catalog nor the hub gives a checksum")
    assert f"kept in {held}, outside the models folder" in str(ei.value)
    assert _listing(_models(tmp_path)) == [] and not str(held).startswith(str(_models(tmp_path)))
    # asked again: still waiting, and nothing is downloaded twice
    n = len(hub.log)
    with pytest.raises(UnverifiedDownload):
        dl.fetch(REPO, "drafter.gguf")
    assert len(hub.log) == n
    # the user accepts it: it moves in, without the network
    dl.accept(REPO, "drafter.gguf")
    assert dl.fetch(REPO, "drafter.gguf").read_bytes() == data
    assert _listing(_models(tmp_path)) == ["drafter.gguf"] and dl.unverified(REPO, "drafter.gguf") is None
    assert len(hub.log) == n


def test_accept_unverified_puts_a_file_with_no_checksum_in_place(hub: HubStandIn, data: bytes,
                                                                 tmp_path: Path) -> None:
    hub.add(REPO, "drafter.gguf", data)
    hub.opaque_etag.add((REPO, "drafter.gguf"))
    hub.no_api = True
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint, accept_unverified=True)  # --accept-unverified
    assert dl.fetch(REPO, "drafter.gguf").read_bytes() == data


def test_a_server_that_keeps_dropping_the_connection_ends_in_a_bounded_retry_error(hub: HubStandIn,
                                                                                   tmp_path: Path) -> None:
    big = os.urandom(8 * MiB)
    sha = hub.add(REPO, "drafter.gguf", big)
    # every GET is cut after 1.5 MiB (huggingface_hub alone retried ~100 times); its 1 MiB reads keep 1 MiB each time
    hub.drop_after = 3 * MiB // 2
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint, retries=3, retry_wait_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(HubError, match=rf"{REPO}/drafter.gguf: the connection kept failing \(RemoteProtocolError\); "
                                       r"gave up after 3 attempts in \d+ s\. 3,145,728 bytes are kept"):
        dl.fetch(REPO, "drafter.gguf", sha256=sha)
    assert time.monotonic() - t0 < 10
    assert [r.range for r in hub.gets()] == [None, f"bytes={MiB}-", f"bytes={2 * MiB}-"]  # each attempt resumes
    assert _listing(_models(tmp_path)) == [] and dl.partial_bytes(REPO, "drafter.gguf") == 3 * MiB
    # the time bound: no attempt starts past the window, whatever the count allows
    hub.log.clear()
    dl = Downloader(_models(tmp_path), endpoint=hub.endpoint, retries=1000, retry_window_s=1.0, retry_wait_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(HubError, match="gave up after [1-5] attempts"):
        dl.fetch(REPO, "drafter.gguf", sha256=sha)
    assert time.monotonic() - t0 < 5 and 1 <= len(hub.gets()) <= 5
    # the connection recovers: the next fetch resumes and verifies
    hub.drop_after = None
    assert Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(REPO, "drafter.gguf", sha256=sha).read_bytes() \
        == big


@pytest.mark.parametrize("repo", ["../../..", "a/../b", "owner/name/extra", "owner/na me", "", "x" * 5000])
def test_a_bad_repo_id_is_a_hub_error_before_any_request(hub: HubStandIn, tmp_path: Path, repo: str) -> None:
    with pytest.raises(HubError, match="is not a Hugging Face repository id") as ei:
        Downloader(_models(tmp_path), endpoint=hub.endpoint).fetch(repo, "x.gguf")
    assert len(str(ei.value)) < 300
    assert hub.log == [] and not (tmp_path / "data").exists()

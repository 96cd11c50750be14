"""Downloads from Hugging Face: progress, resume, cancel, a checksum before use.

Through huggingface_hub: `hf_hub_url` and `get_hf_file_metadata` (the HEAD
call that gives size, commit and, for an LFS file, its sha256), then a GET
through its HTTP session (redirects, auth headers) with Range requests into a
partial file that this module keeps between attempts, so a cancelled or
interrupted download resumes where it stopped. (`hf_hub_download` deletes its
partial file on any error, so it cannot resume across calls; its `http_get`
retries without bound against a server that keeps dropping the connection.)

The order of a fetch: repo id and file name checked (no path traversal),
offline refusal, HEAD, the checksum to expect, free-disk check, GET into
`<staging>/<repo>/<file>.part` (a bounded number of attempts within a bounded
time, each resuming the last), the checksum of the whole file, then one rename
into the models folder. The checksum is the catalog's sha256, else the hub's
LFS sha256 (the HEAD's ETag, else the paths-info API's `lfs.oid`), else the
git blob id the API gives for a file kept in git (config.json). A mismatch
deletes the staged file. A file with no checksum anywhere is not put in the
models folder: it waits in `<staging>/unverified/` until the user accepts it
as unverified (`accept_unverified`, or `accept()` for one file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.errors import FlashDeskError
from app.hub.paths import check_safe_name, inside, models_dir, staging_dir_for
from gguf_tools.errors import excerpt

DISK_MARGIN = 64 * 1024 * 1024  # kept free beyond the file itself
_CHUNK = 1 << 20  # progress and cancel granularity
_HEX = set("0123456789abcdef")
UNVERIFIED = "unverified"  # the staging subfolder where files with no checksum wait for the user
RETRIES = 5  # GET attempts per fetch, each resuming where the last stopped
RETRY_WINDOW_S = 120.0  # no new attempt starts later than this after the first
RETRY_WAIT_S = 2.0


class HubError(FlashDeskError):
    """The hub could not be reached or refused a request; names the repo and file."""


class OfflineError(HubError):
    """Offline mode is on and the file is not in the models folder."""


class DownloadCancelled(FlashDeskError):
    """The user cancelled; the partial file stays in the staging folder for a resume."""


class ChecksumMismatch(FlashDeskError):
    """The downloaded bytes are not the published file; they were deleted."""


class InsufficientDisk(FlashDeskError):
    """Not enough free disk for the file; checked before downloading anything."""


class UnverifiedDownload(FlashDeskError):
    """A complete file with no checksum anywhere: kept outside the models folder until accepted."""

    def __init__(self, repo: str, filename: str, path: Path):
        self.repo, self.filename, self.path = repo, filename, path
        super().__init__(f"{repo}/{filename}: neither the catalog nor the hub gives a checksum for this file, so "
                         f"it could not be verified; it is kept in {path}, outside the models folder, until you "
                         f"accept it as unverified (Accept unverified in the Models dialog, or "
                         f"`flashdesk models download ... --accept-unverified`)")


@dataclass(frozen=True)
class Checksum:
    kind: str  # "sha256" | "git-sha1" (git's blob id: sha1 of "blob <size>\0" + the bytes)
    hex: str
    source: str  # where it came from, for messages

    def of(self, path: Path, progress: ProgressFn | None = None, cancel: threading.Event | None = None,
           label: str | None = None) -> str:
        if self.kind == "sha256":
            return sha256_file(path, progress, cancel, label)
        h = hashlib.sha1()
        h.update(b"blob %d\0" % path.stat().st_size)
        return _digest(h, path, progress, cancel, label)


@dataclass
class Progress:
    stage: str  # "download" | "verify" | "convert" | "done"
    file: str
    done: int
    total: int | None

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


ProgressFn = Callable[[Progress], None]


def offline_default() -> bool:
    """FLASHDESK_OFFLINE=1 or HF_HUB_OFFLINE=1 turn the network off."""
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes") for k in ("FLASHDESK_OFFLINE", "HF_HUB_OFFLINE"))


def _is_hex(s: str | None, n: int) -> bool:
    return bool(s) and len(s) == n and set(s) <= _HEX


def sha256_file(path: Path, progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                label: str | None = None) -> str:
    """sha256 of a file, streamed, with progress and cancel."""
    return _digest(hashlib.sha256(), path, progress, cancel, label)


def _digest(h, path: Path, progress: ProgressFn | None, cancel: threading.Event | None,  # noqa: ANN001 - a hashlib
            label: str | None) -> str:
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 * _CHUNK):
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"{label or path.name}: cancelled while verifying")
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(Progress("verify", label or path.name, done, total))
    return h.hexdigest()


def check_repo_id(repo: str) -> str:
    """A Hugging Face repo id (owner/name), else HubError: it becomes part of URLs and folder names."""
    # huggingface_hub (~0.2 s to import) loads when the hub is first used, not with the app
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise HubError(f"{excerpt(repo)} is not a Hugging Face repository id (owner/name: letters, digits, "
                       f"'-', '_' and '.', no '..' or '--')") from None
    return repo


class Downloader:
    """Fetches files of Hugging Face repos into the models folder (see module doc)."""

    def __init__(self, models: str | Path | None = None, *, staging: str | Path | None = None,
                 endpoint: str | None = None, offline: bool | None = None, token: str | bool | None = None,
                 accept_unverified: bool = False, retries: int = RETRIES, retry_window_s: float = RETRY_WINDOW_S,
                 retry_wait_s: float = RETRY_WAIT_S):
        self.models = Path(models).expanduser() if models else models_dir()
        self.staging = Path(staging).expanduser() if staging else staging_dir_for(self.models)
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.offline = offline_default() if offline is None else offline
        self.token = token
        self.accept_unverified = accept_unverified  # the user said yes to every file with no checksum
        self.accepted: set[tuple[str, str]] = set()  # (repo, filename) the user said yes to, one by one
        self.retries, self.retry_window_s, self.retry_wait_s = max(1, retries), retry_window_s, retry_wait_s

    # --- where things are ------------------------------------------------------------------------
    def installed(self, name: str) -> Path | None:
        """The file in the models folder, if it is there."""
        p = inside(self.models, name)
        return p if p.is_file() else None

    def _partial(self, repo: str, filename: str) -> Path:
        return inside(self.staging, f"{repo.replace('/', '--')}/{filename}.part")

    def unverified(self, repo: str, filename: str) -> Path | None:
        """A complete download with no checksum, waiting for the user to accept it."""
        p = self._held(repo, filename)
        return p if p.is_file() else None

    def _held(self, repo: str, filename: str) -> Path:
        return inside(self.staging, f"{UNVERIFIED}/{repo.replace('/', '--')}/{filename}")

    def accept(self, repo: str, filename: str) -> None:
        """The user accepts this file unverified: the next fetch of it moves it into place."""
        self.accepted.add((repo, filename))

    def partial_bytes(self, repo: str, filename: str) -> int:
        """Bytes of an interrupted download waiting for a resume."""
        p = self._partial(repo, filename)
        return p.stat().st_size if p.exists() else 0

    def discard_partial(self, repo: str, filename: str) -> None:
        p = self._partial(repo, filename)
        p.unlink(missing_ok=True)
        p.with_name(p.name + ".json").unlink(missing_ok=True)

    # --- the fetch ---------------------------------------------------------------------------------
    def fetch(self, repo: str, filename: str, *, dest_dir: Path | None = None, dest_name: str | None = None,
              revision: str = "main", sha256: str | None = None, progress: ProgressFn | None = None,
              cancel: threading.Event | None = None) -> Path:
        """Download `repo`/`filename` to dest_dir/dest_name (default: the models folder, same name),
        verified; returns the path. Raises UnsafeFilename, OfflineError, HubError, InsufficientDisk,
        DownloadCancelled, ChecksumMismatch or UnverifiedDownload, each naming the file."""
        check_repo_id(repo)
        check_safe_name(filename, f"{repo}")
        label = f"{repo}/{filename}"
        base = dest_dir if dest_dir is not None else self.models
        dest = inside(base, filename if dest_name is None else dest_name)
        if dest.is_file():
            return dest  # only verified (or accepted) files ever get there
        held = self._held(repo, filename)
        if held.is_file():  # downloaded before, no checksum: the user's decision, no network needed
            if not self._is_accepted(repo, filename):
                raise UnverifiedDownload(repo, filename, held)
            return self._into_place(held, dest, label, progress)
        if self.offline:
            raise OfflineError(f"{label}: not downloaded yet, and offline mode is on (nothing was requested "
                               f"from the network)")
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled(f"{label}: download cancelled")
        meta = self._metadata(repo, filename, revision)
        expected = self._checksum(repo, filename, revision, meta, sha256)
        part = self._partial(repo, filename)
        resume = self._resume_point(part, meta)
        self._check_disk(label, base, (meta.size or 0) - resume)
        self._get(label, meta, part, resume, progress, cancel)
        if expected is not None:
            got = expected.of(part, progress, cancel, label)
            if got != expected.hex:
                self.discard_partial(repo, filename)
                raise ChecksumMismatch(f"{label}: {expected.kind} mismatch: expected {expected.hex} "
                                       f"({expected.source}), got {got}; the download was corrupted or is not the "
                                       f"published file, so it was deleted")
        elif not self._is_accepted(repo, filename):
            held.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, held)  # same folder tree: a rename
            part.with_name(part.name + ".json").unlink(missing_ok=True)
            raise UnverifiedDownload(repo, filename, held)
        part.with_name(part.name + ".json").unlink(missing_ok=True)
        return self._into_place(part, dest, label, progress)

    def _is_accepted(self, repo: str, filename: str) -> bool:
        return self.accept_unverified or (repo, filename) in self.accepted

    def _into_place(self, src: Path, dest: Path, label: str, progress: ProgressFn | None) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _move_into_place(src, dest)
        if progress:
            progress(Progress("done", label, dest.stat().st_size, dest.stat().st_size))
        return dest

    def _metadata(self, repo: str, filename: str, revision: str):  # noqa: ANN202 - HfFileMetadata
        # huggingface_hub (~0.2 s to import) loads when the hub is first used, not with the app
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

        url = hf_hub_url(repo, filename, revision=revision, endpoint=self.endpoint)
        try:
            return get_hf_file_metadata(url, token=self.token)
        except RepositoryNotFoundError:
            raise HubError(f"{repo}: no such repository on {self.endpoint or 'the hub'} (or it is private)") from None
        except EntryNotFoundError:
            raise HubError(f"{repo}/{filename}: no such file in the repository") from None
        except Exception as e:  # network boundary: DNS, refused connection, HTTP errors
            raise HubError(f"{repo}/{filename}: cannot reach the hub ({type(e).__name__}: {str(e)[:300]})") from None

    def _checksum(self, repo: str, filename: str, revision: str, meta,  # noqa: ANN001 - HfFileMetadata
                  sha256: str | None) -> Checksum | None:
        """What the bytes must hash to: the catalog's sha256, the hub's LFS sha256, or its git blob id."""
        if sha256:
            return Checksum("sha256", sha256.lower(), "the catalog")
        if _is_hex(meta.etag, 64):  # an LFS file's ETag is its sha256
            return Checksum("sha256", meta.etag, "the hub's LFS sha256")
        # huggingface_hub (~0.2 s to import) loads when the hub is first used, not with the app
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        try:
            infos = HfApi(endpoint=self.endpoint, token=self.token).get_paths_info(repo, [filename], revision=revision)
        except HfHubHTTPError as e:
            if e.response.status_code in (404, 405, 501):  # a mirror without the API: no checksum from it
                return None
            raise HubError(f"{repo}/{filename}: the hub did not give the file's checksum ({str(e)[:300]})") from None
        except Exception as e:  # network boundary
            raise HubError(f"{repo}/{filename}: cannot reach the hub for the file's checksum "
                           f"({type(e).__name__}: {str(e)[:300]})") from None
        info = next((i for i in infos if getattr(i, "path", None) == filename), None)
        lfs = getattr(info, "lfs", None)
        if lfs is not None and _is_hex(lfs.sha256, 64):
            return Checksum("sha256", lfs.sha256, "the hub's LFS metadata")
        if lfs is None and _is_hex(getattr(info, "blob_id", None), 40):  # a file kept in git, not LFS
            return Checksum("git-sha1", info.blob_id, "the hub's git blob id")
        return None

    def _resume_point(self, part: Path, meta) -> int:  # noqa: ANN001 - HfFileMetadata
        """Bytes to keep from an earlier attempt: only if it was the same file (etag and size)."""
        info = part.with_name(part.name + ".json")
        want = {"etag": meta.etag, "size": meta.size, "commit": meta.commit_hash}
        if part.exists() and info.exists():
            try:
                same = json.loads(info.read_text()) == want
            except (OSError, json.JSONDecodeError):
                same = False
            size = part.stat().st_size
            if same and (meta.size is None or size <= meta.size):
                return size
        part.parent.mkdir(parents=True, exist_ok=True)
        part.unlink(missing_ok=True)
        info.write_text(json.dumps(want))
        return 0

    def _check_disk(self, label: str, dest_base: Path, need: int) -> None:
        for folder in {self.staging, dest_base}:
            probe = folder
            while not probe.exists():
                probe = probe.parent
            free = shutil.disk_usage(probe).free
            if need + DISK_MARGIN > free:
                raise InsufficientDisk(f"{label}: needs {need / 1e9:.2f} GB (+{DISK_MARGIN >> 20} MB spare) but "
                                       f"{probe} has {free / 1e9:.2f} GB free; nothing was downloaded")

    def _get(self, label: str, meta, part: Path, resume: int, progress: ProgressFn | None,  # noqa: ANN001
             cancel: threading.Event | None) -> None:
        """GET into `part`, each attempt resuming where the last stopped, at most `retries` attempts
        and none starting past `retry_window_s`. (huggingface_hub's http_get retries too, but starts
        its count over whenever a byte arrives: ~100 attempts in 100 s against a server that drops
        every connection.)"""
        import httpx2  # huggingface_hub's HTTP client: its transport errors are the ones worth a new attempt

        if meta.size is not None and resume == meta.size:
            return
        started = time.monotonic()
        with open(part, "ab") as f:
            for attempt in range(1, self.retries + 1):
                try:
                    self._get_once(label, meta, f, progress, cancel)
                    return
                except httpx2.TransportError as e:
                    f.flush()
                    spent = time.monotonic() - started
                    if attempt == self.retries or spent + self.retry_wait_s > self.retry_window_s:
                        raise HubError(f"{label}: the connection kept failing ({type(e).__name__}); gave up "
                                       f"after {attempt} attempts in {spent:.0f} s. {f.tell():,} bytes are kept "
                                       f"and the download resumes from there next time") from None
                    if cancel is not None and cancel.wait(self.retry_wait_s):
                        raise DownloadCancelled(f"{label}: download cancelled") from None
                    if cancel is None:
                        time.sleep(self.retry_wait_s)
                except (DownloadCancelled, HubError):
                    raise
                except Exception as e:  # network boundary: an HTTP error status, a bad redirect
                    raise HubError(f"{label}: download failed ({type(e).__name__}: {str(e)[:300]}); it resumes "
                                   f"from {f.tell():,} bytes next time") from None

    def _get_once(self, label: str, meta, f, progress: ProgressFn | None,  # noqa: ANN001 - HfFileMetadata, file
                  cancel: threading.Event | None) -> None:
        """One GET from the end of `f` (a Range request when it holds bytes already)."""
        # huggingface_hub (~0.2 s to import) loads when the hub is first used, not with the app
        from huggingface_hub import constants
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

        f.seek(0, os.SEEK_END)
        done = f.tell()
        headers = build_hf_headers(token=self.token)
        headers["Accept-Encoding"] = "identity"  # the bytes as stored: the checksum is of them
        if done:
            headers["Range"] = f"bytes={done}-"
        with http_stream_backoff("GET", meta.location, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                 max_retries=2, retry_on_exceptions=(), retry_on_status_codes=(429, 503)) as r:
            hf_raise_for_status(r)
            if done and r.status_code == 200:  # the server ignored the Range: it sends the whole file
                f.seek(0)
                f.truncate()
                done = 0
            for chunk in r.iter_bytes(_CHUNK):
                # checked before writing: a cancel leaves the partial file holding exactly the bytes written
                if cancel is not None and cancel.is_set():
                    raise DownloadCancelled(f"{label}: download cancelled")
                f.write(chunk)
                done += len(chunk)
                if progress:
                    progress(Progress("download", label, done, meta.size))
        if meta.size is not None and done != meta.size:
            f.flush()
            self.discard_partial(*_split_label(label))
            raise HubError(f"{label}: the server sent {done:,} bytes, not the {meta.size:,} it announced; the "
                           f"partial file was discarded, try again")


def _split_label(label: str) -> tuple[str, str]:
    owner, name, filename = label.split("/", 2)
    return f"{owner}/{name}", filename


def _move_into_place(src: Path, dest: Path) -> None:
    """Rename (same disk); across disks copy to a hidden temporary name first, then rename."""
    try:
        os.replace(src, dest)
    except OSError:
        tmp = dest.with_name(f".{dest.name}.partial")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        src.unlink(missing_ok=True)

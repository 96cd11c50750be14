"""Two numbers for the desktop app, printed as JSON:

  time to first window   wall time from launching `flashdesk` to its window being shown
                         (median of --runs launches, offscreen unless a DISPLAY is set)
  UI overhead            tokens/s of a reply generated with the window open (the engine process
                         and its socket, the worker thread, signals, per-step SQLite writes,
                         Markdown rendering) against `flashdesk generate` on the same models,
                         prompt and settings

    python scripts/measure_app.py [--target T] [--drafter D] [--draft-max 4] [--max-tokens 64]
                                  [--reply-window N] [--prompt P] [--no-first-window]

Timings are only meaningful on a quiet machine (docs/design.md, section 6: another job on the second core
makes them worthless); the load average at the start and end is reported with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PROMPT = "List ten fruits, one per line."  # the base model keeps going: a full max-tokens reply


def time_to_first_window(runs: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if not env.get("DISPLAY"):
        env["QT_QPA_PLATFORM"] = "offscreen"
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.time()
            p = subprocess.Popen([sys.executable, "-m", "app.cli", "--data-dir", d, "--report-startup",
                                  "--quit-after", "0.3"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
            shown = None
            for line in p.stdout:
                if line.startswith("first window shown at "):
                    shown = float(line.split()[4])
            p.wait(timeout=600)
            if shown is None:
                raise RuntimeError("the app did not report its first window")
            out.append(shown - t0)
    return out


def ui_tokens_per_s(target: str, drafter: str | None, draft_max: int | None, max_tokens: int,
                    threads: int, reply_window: int | None = None, prompt: str = PROMPT) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.session.models import ModelSpec
    from app.store import Store
    from app.ui.event_wait import wait_until
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("FlashDesk")
    d = Path(tempfile.mkdtemp(prefix="flashdesk-measure-"))
    s = Store(d / Store.FILENAME)
    s.set_setting("generation", {"max_tokens": max_tokens, "draft_length": draft_max or 1,
                                 "speculative": draft_max is not None and drafter is not None})
    s.close()
    win = MainWindow(d / Store.FILENAME, model=ModelSpec(target, drafter, n_ctx=2048, n_threads=threads))
    if reply_window is not None:  # steps the engine process may run ahead of the window (default: the app's)
        win.controller.worker.reply_window = reply_window
    win.show()

    wait_until(lambda: win.model_info is not None and not win.loading)
    win.input.setPlainText(prompt)
    win.send()
    wait_until(lambda: win.busy_conv is None)
    msg = win.store.messages(win.current_conv)[-1]
    g = msg.stats["generation"]
    win.shutdown()
    win.deleteLater()
    return {"tokens_per_s": g["tokens_per_s"], "n_generated": g["n_generated"], "text": msg.content, **_split(g)}


def cli_tokens_per_s(target: str, drafter: str | None, draft_max: int | None, max_tokens: int,
                     threads: int, prompt: str = PROMPT) -> dict:
    cmd = [sys.executable, "-m", "app.cli", "generate", "--chat", "--json", "--prompt", prompt,
           "--max-tokens", str(max_tokens), "--target", target, "--ctx", "2048", "--threads", str(threads)]
    if drafter is None or draft_max is None:
        cmd += ["--no-drafter"] if drafter is None else ["--drafter", drafter, "--no-spec"]
    else:
        cmd += ["--drafter", drafter, "--draft-mode", "fixed", "--draft-max", str(draft_max)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                       check=True)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    return {"tokens_per_s": j["stats"]["tokens_per_s"], "n_generated": j["stats"]["n_generated"], "text": j["text"],
            **_split(j["stats"])}


def _split(g: dict) -> dict:
    """ms per token inside llama.cpp calls and outside them (the Python loop, and in the app the store write,
    the engine process's socket and the wait for the window's ack): the second is what the app adds."""
    n = max(1, g["n_generated"])
    return {"llama_ms": 1000 * g["t_llama_s"] / n, "host_ms": 1000 * (g["t_decode_s"] - g["t_llama_s"]) / n}


def _ratio_outside(ui: list[dict], cli: list[dict]) -> float:
    llama = statistics.median(r["llama_ms"] for r in cli)
    host_ui, host_cli = (statistics.median(r["host_ms"] for r in rs) for rs in (ui, cli))
    return (llama + host_cli) / (llama + host_ui)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="default: the bundled target")
    ap.add_argument("--drafter", help="default: the bundled drafter (none: plain decoding)")
    ap.add_argument("--draft-max", type=int, default=None, help="fixed draft length (default: plain decoding)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores; 1 is steadier "
                    "on a machine shared with other jobs)")
    ap.add_argument("--reply-window", type=int, default=None, help="steps the engine process may decode ahead "
                    "of the window's acks (app.host.protocol.Reply.window; default: the app's REPLY_WINDOW)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--no-first-window", action="store_true", help="skip the time-to-first-window launches")
    args = ap.parse_args()
    from app.bench.info import run_info
    from app.bundled import default_drafter, default_target

    target = args.target or str(default_target())
    drafter = args.drafter or (str(default_drafter()) if default_drafter() else None)
    load0 = os.getloadavg()
    first = None if args.no_first_window else time_to_first_window(args.runs)
    ui, cli = [], []
    for _ in range(args.runs):  # alternate, so a load change hits both alike
        cli.append(cli_tokens_per_s(target, drafter, args.draft_max, args.max_tokens, args.threads, args.prompt))
        ui.append(ui_tokens_per_s(target, drafter, args.draft_max, args.max_tokens, args.threads, args.reply_window,
                                  args.prompt))
    ui_tps = statistics.median(r["tokens_per_s"] for r in ui)
    cli_tps = statistics.median(r["tokens_per_s"] for r in cli)
    print(json.dumps({
        "run": run_info(args.threads),
        # left out with --no-first-window (not measured)
        **({"time_to_first_window_s": {"median": round(statistics.median(first), 3),
                                       "runs": [round(x, 3) for x in first]}} if first else {}),
        "target": target, "drafter": drafter, "threads": args.threads, "draft_max": args.draft_max,
        "max_tokens": args.max_tokens, "reply_window": args.reply_window,
        "ui_tokens_per_s": {"median": round(ui_tps, 2), "runs": [round(r["tokens_per_s"], 2) for r in ui]},
        "cli_tokens_per_s": {"median": round(cli_tps, 2), "runs": [round(r["tokens_per_s"], 2) for r in cli]},
        "ui_over_cli_ratio": round(ui_tps / cli_tps, 3) if cli_tps else None,
        "ms_per_token_outside_llama": {"ui": [round(r["host_ms"], 3) for r in ui],
                                       "cli": [round(r["host_ms"], 3) for r in cli]},
        "ms_per_token_in_llama": {"ui": [round(r["llama_ms"], 3) for r in ui],
                                  "cli": [round(r["llama_ms"], 3) for r in cli]},
        # the ratio the app's extra time outside llama.cpp alone would give at the CLI's llama.cpp time
        # (steadier than the tokens/s ratio on a shared machine, where llama.cpp's own time swings)
        "ratio_from_time_outside_llama": round(_ratio_outside(ui, cli), 3),
        "same_text": ui[0]["text"].strip() == cli[0]["text"].strip(),
        "n_generated": [ui[0]["n_generated"], cli[0]["n_generated"]],
        "loadavg_start_end": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The first reply a new user sees, measured as they see it (issue 29, item 5): `make run` on a machine
without a display prints one short headless reply (app.ui.headless) and a line under it,
"[19 tokens, 84.4 tok/s, tau 1.27, 0.88x vs plain 96.1 tok/s measured, stop]" (its plain speed: the
same prompt answered plain through the same session just before, in the same process). This runs that
reply in --runs fresh processes, each followed by a fresh process answering the same prompt with plain
decoding (the same session, speculation off, after the same plain reply first), and writes JSON: each
run's line as printed and parsed, the ratio the line printed and the one measured against the plain
process next to it, and the medians. The speculative process also answers plain again after its reply
("[plain after: X tok/s]"): the ratio against that is measured in the same process, where a fresh
process's own speed (80-119 tok/s plain on one VM, stop 37) cancels.

    python scripts/first_reply.py --runs 10 --json docs/bench/first-reply-cpu.json
    python scripts/first_reply.py --runs 10 --fresh-cache ...   # each run calibrates first (a new machine)

    python scripts/first_reply.py --runs 10 --window --json docs/bench/first-reply-window-cpu.json

--window measures the window's first reply instead: each fresh process opens the real main window
(offscreen, a throwaway database, the bundled pair as `make run` loads it), sends the same prompt,
waits for the reply and reads the line the chat shows under it ("19 tokens · 120.1 tok/s · τ 1.90 ·
1.23× vs measured plain · ..."; its plain speed is the window's baseline, plain replies through the
session at load: app.session.baseline); then, in the same window, it answers the prompt plain BASELINE_REPLIES
times (new chats, speculation off in the settings) for the same-process check.

A line is truthful when its printed ratio is within --tolerance of the one measured in the same process
(`truthful`); `truthful_across` holds it to the fresh plain process instead. Timings are only
meaningful on a quiet machine (another job on the second core makes them worthless).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.bench.info import run_info  # noqa: E402 - after the path
from app.engine.calibration import CALIBRATION_DIR_ENV  # noqa: E402
from app.session.baseline import BASELINE_REPLIES  # noqa: E402
from app.ui.headless import HEADLESS_MAX_TOKENS, HEADLESS_PROMPT  # noqa: E402

# "[19 tokens, 84.4 tok/s, tau 1.27, 0.88x vs plain 96.1 tok/s measured, stop]"
LINE = re.compile(r"^\[(?P<tokens>\d+) tokens, (?P<tps>[\d.]+) tok/s, tau (?P<tau>[\d.]+)"
                  r"(?:, (?P<speedup>[\d.]+)x vs plain (?P<base>[\d.]+) tok/s measured)?, (?P<finish>\w+)\]$")
# the chat's line under a reply (app.ui.chat_view.message_stats_line):
# "19 tokens · 120.1 tok/s · τ 1.90 · 1.23× vs measured plain · 9/12 drafts accepted · drafted by ..."
WINDOW_LINE = re.compile(r"^(?P<tokens>\d+) tokens · (?P<tps>[\d.]+) tok/s · τ (?P<tau>[\d.]+)"
                         r"(?: · (?P<speedup>[\d.]+)× vs measured plain)?")
WINDOW_RESULT = "first-reply-window: "  # the window child's one line of JSON on stdout


def parse_line(stdout: str) -> dict:
    """The line under the reply, as printed and as numbers (ValueError if the reply printed none)."""
    for line in reversed(stdout.strip().splitlines()):
        m = LINE.match(line.strip())
        if m:
            return {"line": line.strip(), "tokens": int(m["tokens"]), "tokens_per_s": float(m["tps"]),
                    "tau": float(m["tau"]), "speedup_printed": float(m["speedup"]) if m["speedup"] else None,
                    "baseline_printed": float(m["base"]) if m["base"] else None, "finish": m["finish"]}
    raise ValueError(f"no stats line in the headless output:\n{stdout[-2000:]}")


def parse_plain_after(stdout: str) -> float | None:
    """The tokens/s of "[plain after: X tok/s]" (run_headless(plain_after=True)), or None."""
    m = re.search(r"^\[plain after: ([\d.]+) tok/s\]$", stdout, re.MULTILINE)
    return float(m[1]) if m else None


def parse_window_result(stdout: str) -> dict:
    """The window child's result, with its line parsed as the user reads it (ValueError if none)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(WINDOW_RESULT):
            r = json.loads(line[len(WINDOW_RESULT):])
            m = WINDOW_LINE.match(r["line"])
            if m is None:
                raise ValueError(f"the window's line does not parse: {r['line']!r}")
            return {"line": r["line"], "tokens": int(m["tokens"]), "tokens_per_s": float(m["tps"]),
                    "tau": float(m["tau"]), "speedup_printed": float(m["speedup"]) if m["speedup"] else None,
                    "baseline_printed": r["baseline_tokens_per_s"], "baseline_source": r["baseline_source"],
                    "finish": r["status"], "plain_after_tokens_per_s": r["plain_after_tokens_per_s"]}
    raise ValueError(f"no result line from the window:\n{stdout[-2000:]}")


def run_once(speculative: bool, max_tokens: int, prompt: str, cache_dir: str | None,
             window: bool = False) -> dict:
    """One first reply in a new process: headless (the app's own code path, app.ui.headless.run_headless)
    or, `window`, in the real main window (window_child)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["PYTHONPATH"] = str(REPO)
    if cache_dir is not None:
        env["XDG_CACHE_HOME"] = cache_dir
        env.pop(CALIBRATION_DIR_ENV, None)  # a fresh cache means the calibration's too
    if window:
        env["QT_QPA_PLATFORM"] = "offscreen"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--window-child", "--max-tokens", str(max_tokens),
               "--prompt", prompt] + ([] if speculative else ["--plain"])
    else:
        cmd = [sys.executable, "-c", "import sys; from app.ui.headless import run_headless; "
               f"sys.exit(run_headless(prompt={prompt!r}, max_tokens={max_tokens}, speculative={speculative}, "
               f"plain_after={speculative}))"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"the {'window' if window else 'headless'} reply failed ({p.returncode}):\n"
                           f"{p.stderr[-3000:]}")
    if window:
        return parse_window_result(p.stdout)
    return parse_line(p.stdout) | {"plain_after_tokens_per_s": parse_plain_after(p.stdout)}


def window_child(prompt: str, max_tokens: int, speculative: bool) -> int:
    """In this (fresh) process: the main window as `make run` opens it, on a throwaway database; one
    reply to `prompt`; then, when `speculative`, BASELINE_REPLIES plain replies in new chats (the
    same-process check). Prints WINDOW_RESULT + JSON."""
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415 - Qt only in the child

    from app.session.settings import ChatSettings  # noqa: PLC0415
    from app.store import Store  # noqa: PLC0415
    from app.ui.chat_view import message_stats_line  # noqa: PLC0415
    from app.ui.event_wait import wait_until  # noqa: PLC0415
    from app.ui.main_window import K_GENERATION, MainWindow  # noqa: PLC0415

    def reply(win: MainWindow) -> dict:
        win.input.setPlainText(prompt)
        win.send()  # marks the chat busy at once, unless the message could not be sent
        if win.busy_conv is None:
            raise RuntimeError(f"the window did not start a reply: {win.banner.text()}")
        wait_until(lambda: win.busy_conv is None, timeout_s=1500)
        m = [m for m in win.store.messages(win.current_conv) if m.role == "assistant"][-1]
        s = m.stats["summary"]
        return {"line": message_stats_line(m.stats), "status": m.status, "tokens_per_s": s["tokens_per_s"],
                "baseline_tokens_per_s": s["baseline_tokens_per_s"], "baseline_source": s["baseline_source"]}

    app = QApplication([sys.argv[0]])
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / Store.FILENAME)
        store.set_setting(K_GENERATION, {"max_tokens": max_tokens, "speculative": speculative})
        store.close()
        win = MainWindow(Path(tmp) / Store.FILENAME, documents_db=Path(tmp) / "documents.sqlite")
        win.show()
        wait_until(lambda: win.model_info is not None and not win.loading, timeout_s=1500)
        first = reply(win)
        after = None
        if speculative:
            win.global_settings = ChatSettings(max_tokens=max_tokens, speculative=False)
            plain = []
            for _ in range(BASELINE_REPLIES):
                win.new_conversation()
                plain.append(reply(win)["tokens_per_s"])
            after = statistics.median(plain)
        print(WINDOW_RESULT + json.dumps(first | {"plain_after_tokens_per_s": after}), flush=True)
        win.close()  # closeEvent shuts the window down: the worker stops, the database closes
        app.processEvents()
    return 0


def _within(printed: float | None, measured: float | None, tolerance: float) -> bool:
    return printed is not None and measured is not None and abs(printed - measured) <= tolerance * measured


def measure(runs: int, max_tokens: int, prompt: str, fresh_cache: bool, tolerance: float,
            window: bool = False) -> dict:
    out: list[dict] = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            cache = tmp if fresh_cache else None
            spec = run_once(True, max_tokens, prompt, cache, window)
            plain = run_once(False, max_tokens, prompt, cache, window)
        measured = spec["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] > 0 else None
        after = spec["plain_after_tokens_per_s"]
        same = spec["tokens_per_s"] / after if after else None
        printed = spec["speedup_printed"]
        out.append({"run": i, "speculative": spec, "plain": plain,
                    "speedup_measured": round(measured, 4) if measured else None,
                    "speedup_same_process": round(same, 4) if same else None, "speedup_printed": printed,
                    "truthful": _within(printed, same, tolerance),
                    "truthful_across": _within(printed, measured, tolerance)})
        print(f"run {i}: {spec['line']}  |  plain {plain['tokens_per_s']:.1f} tok/s: "
              f"measured {measured:.2f}x" if measured else f"run {i}: {spec['line']}", file=sys.stderr, flush=True)

    def med(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 4) if xs else None

    return {"run_info": run_info(), "where": "window" if window else "headless", "prompt": prompt,
            "max_tokens": max_tokens, "fresh_cache": fresh_cache,
            "tolerance": tolerance, "runs": out,
            "median_tokens_per_s": med([r["speculative"]["tokens_per_s"] for r in out]),
            "median_plain_tokens_per_s": med([r["plain"]["tokens_per_s"] for r in out]),
            "median_speedup_measured": med([r["speedup_measured"] for r in out]),
            "median_speedup_same_process": med([r["speedup_same_process"] for r in out]),
            "median_speedup_printed": med([r["speedup_printed"] for r in out]),
            "all_truthful": all(r["truthful"] for r in out),
            "truthful_runs": sum(r["truthful"] for r in out),
            "truthful_across_runs": sum(r["truthful_across"] for r in out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=HEADLESS_MAX_TOKENS, help="the headless reply's budget")
    ap.add_argument("--prompt", default=HEADLESS_PROMPT)
    ap.add_argument("--fresh-cache", action="store_true",
                    help="each run with an empty cache directory: the reply calibrates first, as on a new machine")
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="a printed ratio within this share of the measured one is truthful")
    ap.add_argument("--window", action="store_true", help="the main window's first reply, not the headless one")
    ap.add_argument("--json", type=Path, help="write the result here (else stdout)")
    ap.add_argument("--window-child", action="store_true", help=argparse.SUPPRESS)  # run_once(window=True)
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.window_child:
        return window_child(args.prompt, args.max_tokens, speculative=not args.plain)
    result = measure(args.runs, args.max_tokens, args.prompt, args.fresh_cache, args.tolerance, args.window)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

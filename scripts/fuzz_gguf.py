"""Hostile GGUFs through inspect, pair and a real load: nothing may abort, hang, or say too much.

    python scripts/fuzz_gguf.py [--n 300] [--out DIR] [--load] [--app-load] [--json report.json]

Copies of the bundled target and drafter (gguf_tools.edit; the target's copies
are sparse, its data is never needed before a refusal) with truncations, byte
flips in the header (KV section and tensor infos), out-of-range metadata, bad
`d2t` ids and bad target layer ids. Each goes through `gguf_tools inspect` and
`gguf_tools pair` (with the other bundled file) in this process.

--load: every one that pair calls compatible (or, for a target, that inspect
accepts: then alone, with no drafter, as the app allows) is loaded by
`flashdesk generate` in a child process, where an abort shows as a signal.
--app-load: each is also loaded as the window loads it (the same pair, or that
target alone): a Load request to the app's engine process (app.host), whose
death shows as EngineCrashed.

The summary counts crashes, hangs, "compatible" verdicts followed by a failed
load, and the longest message.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.bundled import default_drafter, default_target  # noqa: E402
from app.host.process import EngineCrashed, EngineProcess  # noqa: E402
from app.host.protocol import Failed, Load, Loaded  # noqa: E402
from app.session.models import ModelSpec  # noqa: E402
from gguf_tools.__main__ import main as tools  # noqa: E402
from gguf_tools.edit import copy_gguf  # noqa: E402
from gguf_tools.reader import read_gguf  # noqa: E402
from gguf_tools.validate import read_d2t  # noqa: E402

META_TARGET = {
    "gemma3.block_count": [0, 1, 17, 19, 100000, 2**32 - 1],
    "gemma3.attention.head_count": [0, 3, 5000],
    "gemma3.attention.head_count_kv": [0, 3, 8],
    "gemma3.embedding_length": [0, 641, 1 << 20],
    "gemma3.context_length": [0],
    "gemma3.attention.key_length": [0, 7, 1 << 20],
    "gemma3.feed_forward_length": [0, 1],
}
META_DRAFTER = {
    "dflash.block_count": [0, 1, 3, 100000],
    "dflash.attention.head_count": [0, 3],
    "dflash.attention.head_count_kv": [0, 3],
    "dflash.embedding_length": [0, 641],
    "dflash.block_size": [0, 1, 65, 2**31],
    "tokenizer.ggml.mask_token_id": [262144, 2**31],
}


def _quiet(fn, *args):  # noqa: ANN001, ANN002, ANN202
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = fn(*args)
        except Exception as e:  # noqa: BLE001 - an exception here is a finding
            return -1000, f"{type(e).__name__}: {e}"
    return rc, err.getvalue() + out.getvalue()


def _variants(target: Path, drafter: Path, out: Path, n: int, rng: np.random.Generator):  # noqa: ANN202
    """(label, role, path) of hostile copies: role is 'target' or 'drafter'."""
    k = 0

    def name(tag: str) -> Path:
        nonlocal k
        k += 1
        return out / f"{k:04d}-{tag}.gguf"

    for key, values in META_TARGET.items():
        for v in values:
            yield f"{key}={v}", "target", copy_gguf(target, name("t-meta"), meta={key: v}, sparse=True)
    for key, values in META_DRAFTER.items():
        for v in values:
            yield f"{key}={v}", "drafter", copy_gguf(drafter, name("d-meta"), meta={key: v}, sparse=True)
    layers = list(read_gguf(drafter).get("dflash.target_layers"))
    for bad in ([*layers[:-1], 18], [*layers[:-1], 600], [layers[0], layers[0], *layers[2:]], [*layers, 3],
                layers[:1]):
        yield f"target_layers={bad}", "drafter", copy_gguf(drafter, name("d-layers"),
                                                           meta={"dflash.target_layers": bad}, sparse=True)
    d2t = read_d2t(read_gguf(drafter))
    for bad_id in (262144, -1, 2**40, 300000):
        ids = d2t.copy()
        ids[int(rng.integers(0, ids.size))] = bad_id
        yield f"d2t id {bad_id}", "drafter", copy_gguf(drafter, name("d-d2t"), sparse=True,
                                                        tensor_bytes={"d2t": ids.astype(np.int64).tobytes()})
    # truncations and byte flips fill the rest
    # (sparse copies: the header is real, the data a hole of the right length; the d2t keeps its bytes)
    sources = {"target": copy_gguf(target, out / "base-target.gguf", sparse=True),
               "drafter": copy_gguf(drafter, out / "base-drafter.gguf", sparse=True,
                                    tensor_bytes={"d2t": d2t.astype(np.int64).tobytes()})}
    infos = {r: read_gguf(p) for r, p in sources.items()}
    headers = {r: bytearray(p.read_bytes()[:infos[r].data_offset]) for r, p in sources.items()}
    while k < n:
        role = "target" if rng.random() < 0.5 else "drafter"
        info, raw = infos[role], bytearray(headers[role])
        kind = rng.choice(["truncate", "flip-kv", "flip-tensor-info"])
        p = name(f"{role[0]}-{kind}")
        size = info.file_size
        if kind == "truncate":
            size = int(rng.integers(24, info.file_size))
            label = f"truncated at {size}"
        else:
            kv_end = _tensor_info_start(raw)
            lo, hi = (24, kv_end) if kind == "flip-kv" else (kv_end, info.data_offset)
            at = int(rng.integers(lo, max(lo + 1, hi)))
            raw[at] ^= int(rng.integers(1, 256))
            label = f"{kind} at {at}"
        with open(p, "wb") as f:
            f.write(raw[:size])
            f.truncate(size)
        if role == "drafter" and size == info.file_size:  # the d2t's bytes, as in the source
            t = info.tensor("d2t")
            with open(p, "r+b") as f:
                f.seek(info.data_offset + t.offset)
                f.write(d2t.astype(np.int64).tobytes())
        yield label, role, p


def _tensor_info_start(raw: bytearray) -> int:
    """Where the tensor infos begin (after the KV section), by walking the KV section."""
    n_kv = struct.unpack_from("<Q", raw, 16)[0]
    pos = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(vt: int, pos: int) -> int:
        if vt in sizes:
            return pos + sizes[vt]
        if vt == 8:
            return pos + 8 + struct.unpack_from("<Q", raw, pos)[0]
        et, cnt = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        if et in sizes:
            return pos + sizes[et] * cnt
        for _ in range(cnt):
            pos = skip(et, pos)
        return pos

    for _ in range(n_kv):
        pos += 8 + struct.unpack_from("<Q", raw, pos)[0]
        vt = struct.unpack_from("<I", raw, pos)[0]
        pos = skip(vt, pos + 4)
    return pos


def _load(target: Path, drafter: Path | None, timeout: float) -> tuple[int | str, str]:
    cmd = [sys.executable, "-m", "app.cli", "generate", "--target", str(target), "--prompt", "Hello",
           "--max-tokens", "2", "--ctx", "256", "--threads", "2"]
    cmd += ["--drafter", str(drafter)] if drafter else ["--no-drafter"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           cwd=Path(__file__).resolve().parent.parent)
    except subprocess.TimeoutExpired:
        return "hang", ""
    return r.returncode, r.stderr[-2000:]


def _app_load(host: EngineProcess, target: Path, drafter: Path | None, timeout: float) -> tuple[str, str]:
    """Load the pair as the window does; ("loaded" | "refused" | "crash" | "hang", the message shown)."""
    msgs: list[object] = []
    crash: list[str] = []

    def run() -> None:
        try:
            spec = ModelSpec(str(target), str(drafter) if drafter else None, n_ctx=256, n_threads=2)
            host.request(Load(spec), msgs.append)
        except EngineCrashed as e:
            crash.append(str(e))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        host.kill()
        th.join()
        return "hang", ""
    if crash:
        return "crash", crash[0]
    failed = [m.message for m in msgs if isinstance(m, Failed)]
    if failed:
        return "refused", failed[0]
    return ("loaded" if any(isinstance(m, Loaded) for m in msgs) else "refused"), ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--out", default="/tmp/flashdesk-fuzz")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", action="store_true", help="load what the checks accept, in a child process")
    ap.add_argument("--app-load", action="store_true", help="load every file through the app's engine process")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", help="write every case here")
    args = ap.parse_args(argv)
    target, drafter = default_target(), default_drafter()
    if drafter is None:
        print("no bundled drafter", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    cases, t0 = [], time.perf_counter()
    host = EngineProcess(Path(tempfile.mkdtemp(prefix="flashdesk-fuzz-db-")) / "db.sqlite3") if args.app_load else None
    for label, role, path in _variants(target, drafter, out, args.n, rng):
        t, d = (path, drafter) if role == "target" else (target, path)
        rc_i, msg_i = _quiet(tools, ["inspect", str(path)])
        rc_p, msg_p = _quiet(tools, ["pair", str(t), str(d)])
        case = {"case": label, "role": role, "file": path.name, "inspect_rc": rc_i, "pair_rc": rc_p,
                "longest_message": max(len(msg_i) if rc_i else 0, len(msg_p) if rc_p == 2 else 0)}
        if rc_p == 1:  # NOT compatible: the lines of the failing checks are the message
            case["longest_message"] = max(case["longest_message"],
                                          max((len(x) for x in msg_p.splitlines() if x.startswith("[FAIL]")),
                                              default=0))
        # a target the pair check refuses may still be loaded alone (no drafter), as the app allows
        alone = role == "target" and rc_i == 0 and rc_p != 0
        if alone:
            d = None
        if args.load and (rc_p == 0 or alone):
            rc_l, err = _load(t, d, args.timeout)
            case["load_rc"] = rc_l
            case["load_error"] = err.strip().splitlines()[-1][:300] if rc_l and err.strip() else ""
        if host is not None:
            case["app_load"], msg_a = _app_load(host, t, d, args.timeout)
            case["alone"] = alone
            case["app_message"] = msg_a[:300]
            case["longest_message"] = max(case["longest_message"], len(msg_a))
        cases.append(case)
        path.unlink(missing_ok=True)
    if host is not None:
        host.close()
    crashed = [c for c in cases if c["inspect_rc"] == -1000 or c["pair_rc"] == -1000
               or (isinstance(c.get("load_rc"), int) and c["load_rc"] < 0) or c.get("app_load") == "crash"]
    summary = {
        "files": len(cases), "seconds": round(time.perf_counter() - t0, 1),
        "inspect_refused": sum(c["inspect_rc"] != 0 for c in cases),
        "pair_not_compatible_or_error": sum(c["pair_rc"] != 0 for c in cases),
        "loaded": sum("load_rc" in c for c in cases),
        "exceptions_or_crashes": len(crashed),
        "app_loaded": sum(c.get("app_load") == "loaded" for c in cases),
        "app_engine_crashes": sum(c.get("app_load") == "crash" for c in cases),
        "hangs": sum(c.get("load_rc") == "hang" or c.get("app_load") == "hang" for c in cases),
        "compatible_then_failed_load": sum(c.get("load_rc") not in (None, 0)
                                           or ((c["pair_rc"] == 0 or c.get("alone"))
                                               and c.get("app_load") not in (None, "loaded"))
                                           for c in cases),
        "longest_message": max(c["longest_message"] for c in cases),
    }
    print(json.dumps(summary, indent=2))
    for c in crashed:
        print("CRASH", json.dumps(c), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "cases": cases}, indent=1))
    ok = not crashed and not summary["hangs"] and not summary["compatible_then_failed_load"]
    return 0 if ok and summary["longest_message"] < 1024 else 1


if __name__ == "__main__":
    sys.exit(main())

"""`flashdesk bench`: plain decoding against DFlash, side by side in one process.

For each prompt the modes run back to back in an order that rotates from
prompt to prompt (so drift on a noisy machine hits every mode alike), each
from empty caches. Speculative outputs are checked against plain decoding:
`identical` (same greedy tokens) and `lossless` (the teacher-forced check,
DESIGN.md). Results are ratios first: speedup = tokens/s of the mode over
tokens/s of plain decoding on the same prompt.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.dflash import Engine
from app.engine.lossless import check_lossless
from app.engine.params import GenerationParams
from app.engine.prompt_format import PLAIN_STOP, ChatMessage, render_plain

# "plain-again" repeats plain decoding: its speedup over "plain" is the noise band of the machine
MODES = ("plain", "plain-again", "fixed", "adaptive", "adaptive-conf")


@dataclass
class BenchPrompt:
    id: str
    prompt: str
    category: str = "default"
    format: str = "chat"  # "chat": one user turn in the app's format; "raw": completion


def load_prompts(path: str | Path, limit: int | None = None) -> list[BenchPrompt]:
    out = []
    p = Path(path)
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(BenchPrompt(str(d["id"]), d["prompt"], d.get("category", "default"), d.get("format", "chat")))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{p}:{n}: not a prompt line (needs JSON with 'id' and 'prompt'): {e}") from None
    return out[:limit] if limit else out


def prompt_text(bp: BenchPrompt) -> tuple[str, list[str]]:
    """The text sent to the model and the stop strings, as the app would send it."""
    if bp.format == "raw":
        return bp.prompt, []
    return render_plain([ChatMessage("user", bp.prompt)]), list(PLAIN_STOP)


def run_mode(engine: Engine, tokens: list[int], mode: str, max_tokens: int, draft_max: int | None,
             stop: list[str]) -> dict:
    engine.reset()
    adaptive = mode.startswith("adaptive")
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, stop=stop,
                              speculative=not mode.startswith("plain"), draft_max=draft_max, adaptive=adaptive)
    policy = None
    if adaptive:
        from app.engine.adaptive import adaptive_policy_for
        policy = adaptive_policy_for(engine, use_confidence=mode == "adaptive-conf")
    out: list[int] = []
    text = ""
    ev = None
    for ev in engine.generate(tokens, params, policy=policy):
        out += ev.tokens
        text += ev.text
    st = ev.stats
    return {"tokens": out, "text": text, "tokens_per_s": st.tokens_per_s, "n_generated": st.n_generated,
            "tau": st.tau, "steps": st.steps, "drafted": st.drafted, "accepted": st.accepted,
            "accept_by_pos": st.accept_by_pos, "draft_by_pos": st.draft_by_pos,
            "k_history": st.k_history, "t_decode_s": st.t_decode_s, "host_share": st.host_share,
            "t_draft_s": st.t_draft_s, "t_verify_s": st.t_verify_s, "t_inject_s": st.t_inject_s,
            "finish_reason": ev.finish_reason}


def bench(engine: Engine, prompts: list[BenchPrompt], modes: list[str], max_tokens: int = 128,
          draft_max: int | None = None, check: bool = True,
          progress: Callable[[str], None] | None = None,
          partial: Callable[[dict], None] | None = None) -> dict:
    """Every mode on every prompt, interleaved. `partial` gets the result so far after each prompt
    (the CLI writes it to the JSON file, so a long run that is stopped keeps what it measured)."""
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; expected some of {', '.join(MODES)}")
    if "plain" not in modes:
        modes = ["plain", *modes]
    if not engine.has_drafter and any(not m.startswith("plain") for m in modes):
        raise ValueError("speculative modes need a drafter")
    rows = []
    t0 = time.time()

    def result(rows: list[dict]) -> dict:
        return {"modes": modes, "max_tokens": max_tokens, "draft_max": draft_max, "prompts": list(rows),
                "summary": summarize(rows, modes)}

    for i, bp in enumerate(prompts):
        text, stop = prompt_text(bp)
        tokens = engine.tokenize(text)
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        res = {m: run_mode(engine, tokens, m, max_tokens, draft_max, stop) for m in order}
        plain = res["plain"]
        row = {"id": bp.id, "category": bp.category, "n_prompt": len(tokens), "modes": {}}
        for m in modes:
            r = res[m]
            entry = {k: v for k, v in r.items() if k not in ("tokens", "text")}
            entry["text"] = r["text"]
            if m != "plain":
                entry["speedup"] = r["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] else 0.0
                entry["identical"] = r["tokens"] == plain["tokens"]
                if check and m != "plain-again":
                    rep = check_lossless(engine, tokens, r["tokens"])
                    entry.update(lossless=rep.lossless, near_ties=rep.near_ties,
                                 hard_mismatches=rep.hard_mismatches)
            row["modes"][m] = entry
        rows.append(row)
        if progress:
            bits = [f"{m} {row['modes'][m]['tokens_per_s']:.1f} tok/s" for m in modes]
            for m in modes[1:]:
                e = row["modes"][m]
                bits.append(f"{m} x{e['speedup']:.2f} tau {e['tau']:.2f}"
                            + (f" lossless={e['lossless']}" if "lossless" in e else ""))
            progress(f"[{i + 1}/{len(prompts)} {time.time() - t0:.0f}s] {bp.id} ({bp.category}): " + ", ".join(bits))
        if partial and i + 1 < len(prompts):
            partial(result(rows) | {"complete": False})
    return result(rows)


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4) if xs else 0.0


def summarize(rows: list[dict], modes: list[str]) -> dict:
    def block(rs: list[dict]) -> dict:
        out: dict = {"n_prompts": len(rs)}
        for m in modes:
            es = [r["modes"][m] for r in rs]
            d = {"median_tokens_per_s": _median([e["tokens_per_s"] for e in es])}
            if m != "plain":
                sp = [e["speedup"] for e in es]
                d.update(median_speedup=_median(sp),
                         p10_speedup=round(float(np.percentile(sp, 10)), 4) if sp else 0.0,
                         p90_speedup=round(float(np.percentile(sp, 90)), 4) if sp else 0.0,
                         mean_tokens_per_s_ratio=round(sum(e["tokens_per_s"] for e in es)
                                                       / max(1e-9, sum(r["modes"]["plain"]["tokens_per_s"]
                                                                       for r in rs)), 4),
                         median_tau=_median([e["tau"] for e in es]),
                         identical=sum(e["identical"] for e in es))
                if es and "lossless" in es[0]:
                    d.update(lossless=all(e["lossless"] for e in es), near_ties=sum(e["near_ties"] for e in es))
            out[m] = d
        return out

    cats = sorted({r["category"] for r in rows})
    return {"overall": block(rows), "by_category": {c: block([r for r in rows if r["category"] == c]) for c in cats}}


def write_json(result: dict, path: str | Path) -> None:
    """Atomically (temp file + rename): the file is rewritten after every prompt."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)

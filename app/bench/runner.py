"""`flashdesk bench`: plain decoding against the draft modes, side by side in one process.

For each prompt the modes run back to back in an order that rotates from
prompt to prompt (so drift on a noisy machine hits every mode alike), each
from empty caches. Speculative outputs are checked against plain decoding:
`identical` (same greedy tokens) and `lossless` (the teacher-forced check,
app.engine.lossless). The plain output itself is checked once per prompt; a
mode whose output is identical to it passes by that check (`lossless_by`:
"plain"), any other output is checked on its own. Results are ratios first:
speedup = tokens/s of the mode over tokens/s of plain decoding on the same
prompt. Every tokens/s here, ours and the peers', is one clock (peers.TOKENS_PER_S,
written into the JSON as `tokens_per_s_definition`).

Peer modes (app.bench.peers: llama.cpp's own llama-server loops, llama-cpp-python's
prompt lookup) run in the same rotation on the same prompt tokens; their outputs go
through the same checks, and the summary adds, per category, our best mode over each
peer (`peers`).
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.bench import peers as peer_modes
from app.bench.info import run_info
from app.bench.prompt_sets import BenchPrompt, prompt_text
from app.chat.format import PromptFormat, prompt_format_of
from app.engine.calibration import CostModel, calibrate, learn
from app.engine.controller import FORMAT_MODES, DraftController, check_format_mode, policy_for_mode
from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, DRAFT_MODEL, EAGLE3, MTP
from app.engine.lossless import check_lossless
from app.engine.params import GenerationParams
from gguf_tools.formats import EAGLE3 as EAGLE3_FORMAT
from gguf_tools.formats import MTP as MTP_FORMAT
from gguf_tools.formats import draft_format

# "plain-again" repeats plain decoding: its speedup over "plain" is the noise band of the machine;
# the others are app.engine.controller's draft modes (dflash2 and dspark: fixed, on a drafter of that format)
MODES = ("plain", "plain-again", "fixed", "lookup", "adaptive", "adaptive-conf", "hybrid", "draft-model", "mtp",
         "eagle3", *FORMAT_MODES)
NEEDS_DRAFTER = ("fixed", "adaptive", "adaptive-conf", *FORMAT_MODES)
# peer modes (app.bench.peers) are named by family: upstream-plain, upstream-dflash[@K], upstream-dspark[@K],
# upstream-lookup[:TYPE][@K], upstream-chain[:T1+T2][@K], llama-cpp-python-lookup[@K]
PEER_MODES = peer_modes.FAMILIES


def needs_drafter(mode: str) -> bool:
    spec = peer_modes.parse_mode(mode)
    return spec.needs_drafter if spec is not None else mode in NEEDS_DRAFTER


def run_mode(engine: Engine, tokens: list[int], mode: str, max_tokens: int, draft_max: int | None,
             stop: list[str], policies: dict | None = None) -> dict:
    """One generation in `mode` from empty caches; a mode's policy lives in `policies` (one per
    mode for a whole bench run, as one chat keeps its controller from reply to reply). The
    entry: the generation's stats (GenerationStats.to_dict, with the per-step histories), its
    tokens and text, and the step times per choice ("source:k")."""
    engine.reset()
    policies = {} if policies is None else policies
    if mode not in policies:
        policies[mode] = policy_for_mode(engine, "plain" if mode.startswith("plain") else mode, draft_max)
    policy = policies[mode]
    if isinstance(policy, DraftController):
        policy.record, policy.history, policy.predicted_step_s = True, [], []
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, stop=stop,
                              speculative=not mode.startswith("plain"), draft_max=draft_max)
    done = engine.complete(tokens, params, policy=policy)
    st = done.stats
    choices = [f"{s}:{k}" for s, k in zip(st.source_history, st.k_history)]
    entry = st.to_dict(history=True) | {
        "tokens": done.tokens, "text": done.text, "finish_reason": done.finish_reason,
        "step_ms_by_choice": _step_ms_by(choices, st.step_s_history)}
    if isinstance(policy, DraftController):  # what the controller's own (refreshed) cost model expected
        asked = [f"{c.source}:{c.k}" for c in policy.history]
        entry["predicted_step_ms_by_choice"] = _step_ms_by(asked, policy.predicted_step_s)
    return entry


def _step_ms_by(keys: list[str], step_s: list[float]) -> dict[str, list[float]]:
    """{key: [steps, total ms]} over one run (summed across runs by the summary)."""
    out: dict[str, list[float]] = {}
    for key, t in zip(keys, step_s):
        e = out.setdefault(key, [0, 0.0])
        e[0] += 1
        e[1] = round(e[1] + t * 1e3, 3)
    return out


def _sum_by_choice(rows: list[dict], mode: str, key: str) -> dict[str, list[float]]:
    per: dict[str, list[float]] = {}
    for r in rows:
        for c, (n, ms) in r["modes"][mode].get(key, {}).items():
            e = per.setdefault(c, [0, 0.0])
            e[0] += n
            e[1] += ms
    return dict(sorted(per.items()))


def cost_model_check(rows: list[dict], modes: list[str], cost: CostModel) -> dict:
    """Predicted against measured step time, per mode and choice "source:k" (mean over the run's
    steps): `calibrated`, the cost model as it stood before the run (calibrated, and learned from
    the loop's steps of earlier runs and chats: calibration.learn) for a steady step (no graph
    rebuild) at each step's context; `calibrated_rebuilds`, the same step by step with its
    rebuild cost (switch_s) added where the verify size differs from the step before (the first
    step of a generation included), as the controller reads it; `live`, for the controller's
    modes, what its own cost model (refreshed from the steps it saw) expected when it chose.
    {mode: {choice: {steps, measured_ms, calibrated_ms, error, calibrated_rebuilds_ms,
    rebuilds_error, [live_ms, live_error]}}, max_abs_error{,_rebuilds,_live}: over choices with
    >= 20 steps}."""
    out: dict = {}
    worst = {"error": 0.0, "rebuilds_error": 0.0, "live_error": 0.0}
    for m in modes:
        measured = _sum_by_choice(rows, m, "step_ms_by_choice")
        live = _sum_by_choice(rows, m, "predicted_step_ms_by_choice")
        steady, rebuilds = _calibrated_by_step(rows, m, cost)
        block = {}
        for choice, (n, ms) in measured.items():
            if choice not in steady:  # a size past the calibrated range
                continue
            meas = ms / n
            pred = steady[choice][1] / steady[choice][0]
            rb = rebuilds[choice][1] / rebuilds[choice][0]
            e = {"steps": int(n), "measured_ms": round(meas, 3), "calibrated_ms": round(pred, 3),
                 "error": round(pred / meas - 1.0, 4), "calibrated_rebuilds_ms": round(rb, 3),
                 "rebuilds_error": round(rb / meas - 1.0, 4)}
            if choice in live:
                lv = live[choice][1] / live[choice][0]
                e.update(live_ms=round(lv, 3), live_error=round(lv / meas - 1.0, 4))
            if n >= 20:
                for key in worst:
                    worst[key] = max(worst[key], abs(e.get(key, 0.0)))
            block[choice] = e
        out[m] = block
    out["max_abs_error"] = round(worst["error"], 4)
    out["max_abs_error_rebuilds"] = round(worst["rebuilds_error"], 4)
    out["max_abs_error_live"] = round(worst["live_error"], 4)
    return out


def cost_model_by_category(rows: list[dict], modes: list[str], cost: CostModel) -> dict:
    """cost_model_check's worst errors per prompt category: a document set at 2k, 8k and 16k cells is
    where a cost model fitted at short contexts goes wrong (issue 29: within 10% at each length)."""
    cats = sorted({r["category"] for r in rows})
    return {c: {k: v for k, v in cost_model_check([r for r in rows if r["category"] == c], modes, cost).items()
                if k.startswith("max_abs_error")} for c in cats}


def _calibrated_by_step(rows: list[dict], mode: str,
                        cost: CostModel) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """({choice: [steps, total ms]} steady, the same with rebuilds): the calibrated step time of
    every step of `mode` at its context (the prompt and what the reply emitted before it), its
    injected rows from what it emitted; with rebuilds, a graph rebuild counted where its verify
    size differs from the step before (the first step follows the prompt's pass, so it rebuilds
    too)."""
    steady: dict[str, list[float]] = {}
    rebuilt: dict[str, list[float]] = {}
    for r in rows:
        e = r["modes"][mode]
        last_n = -1
        n_past = e.get("n_prompt", 1) - 1  # as the engine counts: the prompt's last token is the first anchor
        for source, k, acc in zip(e.get("source_history", []), e.get("k_history", []),
                                  e.get("accepted_history", [])):
            if k + 1 < len(cost.verify_s):
                emitted = np.ones(k + 1)
                emitted[k] = acc + 1
                for out, prev in ((steady, None), (rebuilt, last_n)):
                    t = float(cost.step_times(source == DFLASH, emitted, prev, n_past=n_past)[k])
                    c = out.setdefault(f"{source}:{k}", [0, 0.0])
                    c[0] += 1
                    c[1] += t * 1e3
            last_n = k + 1
            n_past += acc + 1
    return steady, rebuilt


def bench(engine: Engine, prompts: list[BenchPrompt], modes: list[str], max_tokens: int = 128,
          draft_max: int | None = None, check: bool = True, recalibrate: bool = False,
          progress: Callable[[str], None] | None = None,
          partial: Callable[[dict], None] | None = None, repeat: int = 1) -> dict:
    """Every mode on every prompt, interleaved. `partial` gets the result so far after each prompt
    (the CLI writes it to the JSON file, so a long run that is stopped keeps what it measured);
    `recalibrate` measures the cost model anew first instead of reading the cache; the steps the
    controllers timed are folded into the cached model at the end (calibration.learn). `repeat`:
    every mode runs that many times per prompt (rounds interleaved, each in another order) and a
    mode's entry is its run of median tokens/s (all of them in `tokens_per_s_runs`): a short
    answer's single run is too noisy to rank modes by (stop 43: plain against plain again,
    0.79-1.29x prompt by prompt)."""
    if repeat < 1:
        raise ValueError(f"repeat {repeat}: expected 1 or more runs per mode")
    for m in modes:
        if m not in MODES and not peer_modes.is_peer(m):  # a malformed peer name raises here
            raise ValueError(f"unknown mode {m!r}; expected some of {', '.join(MODES + PEER_MODES)}")
    if "plain" not in modes:
        modes = ["plain", *modes]
    if not engine.has_drafter and any(needs_drafter(m) for m in modes):
        raise ValueError(f"the modes {', '.join(m for m in modes if needs_drafter(m))} need a drafter")
    wants_dm = [m for m in modes if m == "draft-model" or getattr(peer_modes.parse_mode(m), "needs_draft_model", False)]
    if wants_dm and engine.draft_model is None:
        raise ValueError(f"the modes {', '.join(wants_dm)} need a draft model (--draft-model)")
    if MTP in modes and MTP not in engine.sources:
        why = engine.mtp_unused or "this one has none"
        raise ValueError(f"the mode mtp needs a target carrying one MTP head ({why})")
    wants_e3 = [m for m in modes if m == EAGLE3 or getattr(peer_modes.parse_mode(m), "needs_eagle3", False)]
    if wants_e3 and EAGLE3 not in engine.sources:
        raise ValueError(f"the modes {', '.join(wants_e3)} need an EAGLE-3 drafter (--drafter)")
    peer_modes.check_drafter_formats(modes, engine.drafter_path)  # a peer on a drafter of another format: now
    for m in modes:  # and a mode named after a drafter format (dflash2, dspark)
        check_format_mode(engine, m)
    ours = [m for m in modes if not peer_modes.is_peer(m)]
    if engine.speculation_blocked:  # nothing to compare with plain decoding (llama-server cannot draft either)
        raise ValueError(engine.speculation_blocked)
    rows = []
    t0 = time.time()

    # as calibrated (afresh with `recalibrate`, and cached for the policies): they refresh their own copies
    cost = copy.deepcopy(calibrate(engine, use_cache=not recalibrate))
    run = run_info(engine.config.n_threads)
    fmt = prompt_format_of(engine.target)
    policies: dict = {}

    peers = peer_modes.open_peers(engine, modes, progress)  # built, started, warmed up once
    peer_info = {m: {"args": p.args[1:], "spec_log": p.spec_log} if isinstance(p, peer_modes.ServerPeer)
                 else {"num_pred_tokens": p.spec.k} for m, p in peers.items()}

    formats = source_formats(engine)

    def result(rows: list[dict]) -> dict:
        return {"run": run, "modes": modes, "max_tokens": max_tokens, "draft_max": draft_max, "repeat": repeat,
                "tokens_per_s_definition": peer_modes.TOKENS_PER_S, "source_formats": formats,
                "calibration": cost.to_dict(), "prompts": list(rows),
                "summary": summarize(rows, modes, formats) | {"cost_model": cost_model_check(rows, ours, cost)
                                                     | {"by_category": cost_model_by_category(rows, ours, cost)}}} \
            | ({"peers": peer_info} if peer_info else {})

    try:
        for i, bp in enumerate(prompts):
            row = _bench_prompt(engine, bp, fmt, i, modes, peers, policies, max_tokens, draft_max, check, repeat)
            rows.append(row)
            if progress:
                bits = [f"{m} {row['modes'][m]['tokens_per_s']:.1f} tok/s" for m in modes]
                for m in modes[1:]:
                    e = row["modes"][m]
                    bits.append(f"{m} x{e['speedup']:.2f} tau {e['tau']:.2f}"
                                + (f" lossless={e['lossless']}" if "lossless" in e else ""))
                progress(f"[{i + 1}/{len(prompts)} {time.time() - t0:.0f}s] {bp.id} ({bp.category}): "
                         + ", ".join(bits))
            if partial and i + 1 < len(prompts):
                partial(result(rows) | {"complete": False})
    finally:
        peer_modes.close_peers(peers)
    for p in policies.values():  # what the controllers timed goes into the cached model, as a chat's does
        if isinstance(p, DraftController):
            learn(engine, p.seen)
    return result(rows)


def _bench_prompt(engine: Engine, bp: BenchPrompt, fmt: PromptFormat, i: int, modes: list[str], peers: dict,
                  policies: dict, max_tokens: int, draft_max: int | None, check: bool, repeat: int = 1) -> dict:
    """Every mode on one prompt (`repeat` rounds), in an order rotated by the prompt's index and the
    round, then the checks."""
    text, stop = prompt_text(bp, fmt)
    tokens = engine.tokenize(text)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(repeat):
        j = (i + r) % len(modes)
        for m in modes[j:] + modes[:j]:
            runs[m].append(peers[m].run(tokens, max_tokens, stop) if m in peers
                           else on_one_clock(run_mode(engine, tokens, m, max_tokens, draft_max, stop, policies)))
    res = {m: median_run(rs) for m, rs in runs.items()}
    plain = res["plain"]
    row = {"id": bp.id, "category": bp.category, "n_prompt": len(tokens), "modes": {}}
    plain_check = _lossless(engine, tokens, plain["tokens"], "self") if check else None
    if plain_check:
        row["plain_lossless"] = plain_check
    for m in modes:
        r = res[m]
        entry = dict(r)  # tokens and text kept: the checks can be re-run from the file
        if m != "plain":
            entry["speedup"] = r["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] else 0.0
            entry["identical"] = r["tokens"] == plain["tokens"]
            if check and m != "plain-again":
                entry.update(plain_check | {"lossless_by": "plain"} if entry["identical"]
                             else _lossless(engine, tokens, r["tokens"], "own"))
        row["modes"][m] = entry
    return row


def median_run(entries: list[dict]) -> dict:
    """The run of median tokens/s (the lower middle of an even count), with every run's tokens/s."""
    if len(entries) == 1:
        return entries[0]
    ranked = sorted(entries, key=lambda e: e["tokens_per_s"])
    return ranked[(len(ranked) - 1) // 2] | {"tokens_per_s_runs": [e["tokens_per_s"] for e in entries]}


def on_one_clock(entry: dict) -> dict:
    """Our mode's entry with tokens/s on the peers' clock (peers.TOKENS_PER_S: after the first step);
    the engine's own n / decode time stays as `loop_tokens_per_s`."""
    first = (entry["accepted_history"][0] + 1, entry["step_s_history"][0]) if entry["steps"] else (0, 0.0)
    return entry | {"loop_tokens_per_s": entry["tokens_per_s"],
                    "tokens_per_s": peer_modes.after_first_step(entry["n_generated"], first[0],
                                                                entry["t_decode_s"] - first[1])}


def _lossless(engine: Engine, tokens: list[int], output: list[int], by: str) -> dict:
    rep = check_lossless(engine, tokens, output)
    return {"lossless": rep.lossless, "near_ties": rep.near_ties, "hard_mismatches": rep.hard_mismatches,
            "lossless_by": by}


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4) if xs else 0.0


def source_formats(engine: Engine) -> dict[str, str]:
    """The file format (gguf_tools.formats) behind each of the load's model sources: the dflash
    source's drafter (dflash, dflash2 or dspark: Engine.drafter_format), an EAGLE-3 drafter, the
    target's MTP head, the classic draft model's file."""
    out = {DFLASH: engine.drafter_format} if engine.has_drafter else {}
    if EAGLE3 in engine.sources:
        out[EAGLE3] = EAGLE3_FORMAT
    if MTP in engine.sources:
        out[MTP] = MTP_FORMAT
    if engine.draft_model is not None:
        out[DRAFT_MODEL] = draft_format(engine.draft_model.model.info).format
    return out


def _by_source(entries: list[dict], formats: dict[str, str] | None = None) -> dict:
    """tau per draft source over the steps that drafted from it, the share of the tokens each
    source (and the target itself) produced, summed over the prompts, and the file format of each
    source that drafted (`formats`: source_formats)."""
    steps: dict[str, int] = {}
    acc: dict[str, int] = {}
    for e in entries:
        for s, n in e.get("steps_by_source", {}).items():
            steps[s] = steps.get(s, 0) + n
            acc[s] = acc.get(s, 0) + e["accepted_by_source"].get(s, 0)
    n_gen = sum(e["n_generated"] for e in entries) or 1
    share = {"target": round(sum(e["steps"] for e in entries) / n_gen, 4)}
    share |= {s: round(a / n_gen, 4) for s, a in acc.items()}
    return {"tau_by_source": {s: round((acc[s] + n) / n, 4) if n else 0.0 for s, n in steps.items()},
            "token_share": share,
            "format_by_source": {s: f for s, f in (formats or {}).items() if steps.get(s, 0)}}


def summarize(rows: list[dict], modes: list[str], formats: dict[str, str] | None = None) -> dict:
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
                d.update(_by_source(es, formats))
                if es and "lossless" in es[0]:
                    d.update(lossless=all(e["lossless"] for e in es), near_ties=sum(e["near_ties"] for e in es))
            out[m] = d
        if any(peer_modes.is_peer(m) for m in modes):
            out["peers"] = peer_summary(rs, modes)
        return out

    cats = sorted({r["category"] for r in rows})
    return {"overall": block(rows), "by_category": {c: block([r for r in rows if r["category"] == c]) for c in cats}}


def peer_summary(rows: list[dict], modes: list[str]) -> dict:
    """Our best mode (peers.OURS_PREFERENCE: hybrid first; plain when none ran) against each peer on
    these prompts: `ours_over_peer`, the median over prompts of ours' tokens/s over the peer's on
    the same prompt (paired, so a slow prompt does not weigh more), and the ratio of the summed
    tokens/s; the best peer is the one with the highest median tokens/s."""
    ours = peer_modes.ours_mode(modes) or "plain"
    out: dict = {"ours": ours, "by_peer": {}}
    for m in (m for m in modes if peer_modes.is_peer(m)):
        pairs = [(r["modes"][ours]["tokens_per_s"], r["modes"][m]["tokens_per_s"]) for r in rows]
        ratios = [a / b for a, b in pairs if b > 0]
        es = [r["modes"][m] for r in rows]
        out["by_peer"][m] = {
            "median_tokens_per_s": _median([e["tokens_per_s"] for e in es]),
            "median_wall_tokens_per_s": _median([e.get("wall_tokens_per_s", 0.0) for e in es]),
            "median_speedup": _median([e["speedup"] for e in es]),
            "acceptance_rate": round(sum(e.get("accepted", 0) for e in es)
                                     / max(1, sum(e.get("drafted", 0) for e in es)), 4),
            "ours_over_peer": _median(ratios),
            "ours_over_peer_sum": round(sum(a for a, _ in pairs) / max(1e-9, sum(b for _, b in pairs)), 4)}
    if out["by_peer"]:
        best = max(out["by_peer"], key=lambda m: out["by_peer"][m]["median_tokens_per_s"])
        out["best_peer"] = best
        out["ours_over_best_peer"] = out["by_peer"][best]["ours_over_peer"]
    return out


def write_json(result: dict, path: str | Path) -> None:
    """Atomically (temp file + rename): the file is rewritten after every prompt."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)

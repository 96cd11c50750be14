"""`flashdesk serve-bench`: what the server costs. Tokens/s through the server (a whole reply, and
streamed as server-sent events) against Engine.complete on the same prompt, the same draft mode
(hybrid) and the same engine, interleaved: each repeat runs every arm once, in an order that
rotates from repeat to repeat, each from empty caches. "direct-again" repeats the direct run: its
ratio to "direct" is the machine's noise band; "server-penalties" sends presence, frequency and
repeat penalties (what they cost the server, against the same band). Also: the time to the first token, and the
overhead per streamed chunk (the streamed reply's extra wall time over the direct run, per chunk).

The client is http.client over one kept-alive connection (as the openai package keeps one), so
the numbers are the server's, not a client library's. Prints JSON.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from app.bench.info import run_info
from app.chat.format import ChatMessage
from app.engine.dflash import Engine
from app.engine.draft_policy import DraftPolicy
from app.engine.params import GenerationParams
from app.server.config import ServerConfig
from app.server.runner import BackgroundServer
from app.server.service import SERVED_MODE, ServedModel, ThreadExecutor

ARMS = ("direct", "server", "server-stream", "server-penalties", "direct-again")
# what the "server-penalties" arm sends on top (greedy still; the penalties change the text, and they take
# the sampler off the C argmax: each row is adjusted in numpy first)
PENALTIES = {"presence_penalty": 0.3, "frequency_penalty": 0.3, "repeat_penalty": 1.1}
DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome, and explain it."


def bench(engine: Engine, policy: DraftPolicy, prompt: str, max_tokens: int = 128, repeats: int = 5,
          warmup: int = 1, raw: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Every arm `repeats` times (after `warmup` untimed rounds); `policy` (the hybrid controller)
    serves every arm, as one server keeps one for its life."""
    served = ServedModel.for_engine(engine, policy)
    executor = ThreadExecutor(served)
    server = BackgroundServer(executor, ServerConfig(port=0))
    client = _Client(server.url, served.name, raw)
    text = prompt if raw else served.format.render([ChatMessage("user", prompt)])
    stop = [] if raw else list(served.format.stop)
    runs: list[dict] = []
    try:
        for r in range(warmup + repeats):
            order = ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]
            for arm in order:
                engine.reset()  # from empty caches; the engine thread is idle between runs
                if arm.startswith("direct"):
                    run = _direct(engine, policy, text, stop, max_tokens)
                else:
                    run = client.run(prompt, max_tokens, stream=arm == "server-stream",
                                     extra=PENALTIES if arm == "server-penalties" else {})
                run.update(arm=arm, repeat=r - warmup)
                if r >= warmup:
                    runs.append(run)
                if log is not None:
                    log(f"{'warmup' if r < warmup else f'repeat {r - warmup}'} {arm}: "
                        f"{run['tokens_per_s']:.1f} tok/s, ttft {run['ttft_ms']:.1f} ms")
    finally:
        client.close()
        server.stop()
        executor.close()
    return {"run": run_info(engine.config.n_threads), "target": str(engine.target.path),
            "drafter": str(engine.drafter.path) if engine.drafter else None, "draft_mode": SERVED_MODE,
            "endpoint": "/v1/completions" if raw else "/v1/chat/completions", "prompt": prompt,
            "max_tokens": max_tokens, "repeats": repeats, "warmup": warmup,
            "summary": summarize(runs), "runs": runs}


def _direct(engine: Engine, policy: DraftPolicy, text: str, stop: list[str], max_tokens: int) -> dict:
    """Engine.complete as `flashdesk generate` runs it (tokenizing included, as the server does)."""
    first: list[float] = []
    t0 = time.perf_counter()
    tokens = engine.tokenize(text)
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    done = engine.complete(tokens, params, policy=policy,
                           on_text=lambda _t: first.append(time.perf_counter()) if not first else None)
    wall = time.perf_counter() - t0
    st = done.stats
    return {"text": done.text, "completion_tokens": st.n_generated, "wall_s": wall,
            "tokens_per_s": st.n_generated / wall, "engine_tokens_per_s": st.tokens_per_s,
            "engine_s": st.t_total_s, "ttft_ms": 1000.0 * ((first[0] if first else time.perf_counter()) - t0),
            "chunks": 0, "tau": st.tau}


class _Client:
    """POSTs to the server over one kept-alive connection; times the reply as a client sees it."""

    def __init__(self, url: str, model: str, raw: bool):
        u = urlsplit(url)
        self._conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        self._model = model
        self._raw = raw

    def close(self) -> None:
        self._conn.close()

    def run(self, prompt: str, max_tokens: int, stream: bool, extra: dict) -> dict:
        body = {"model": self._model, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream, **extra}
        if self._raw:
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/completions" if self._raw else "/v1/chat/completions"
        t0 = time.perf_counter()
        self._conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = self._conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"the server answered {resp.status}: {resp.read()[:300]!r}")
        if stream:
            text, last, ttft, chunks = self._read_stream(resp, t0)
        else:
            last = json.loads(resp.read())
            choice = last["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            ttft, chunks = time.perf_counter() - t0, 0
        wall = time.perf_counter() - t0
        t = last["timings"]
        n = last["usage"]["completion_tokens"]
        return {"text": text, "completion_tokens": n, "wall_s": wall, "tokens_per_s": n / wall,
                "engine_tokens_per_s": t["predicted_per_second"],
                "engine_s": (t["prompt_ms"] + t["predicted_ms"]) / 1000.0, "ttft_ms": 1000.0 * ttft,
                "chunks": chunks, "tau": t["tau"]}

    def _read_stream(self, resp: http.client.HTTPResponse, t0: float) -> tuple[str, dict, float, int]:
        parts: list[str] = []
        ttft = None
        last: dict = {}
        while line := resp.readline():
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if not obj.get("choices"):
                continue
            c = obj["choices"][0]
            piece = c["delta"].get("content") if "delta" in c else c.get("text")
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(piece)
            if "timings" in obj:
                last = obj
        resp.read()  # the end of the chunked body: the connection is reused
        return "".join(parts), last, ttft if ttft is not None else time.perf_counter() - t0, len(parts)


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[int(q * 10) - 1] if len(xs) > 1 else xs[0]


def summarize(runs: list[dict]) -> dict:
    """Per arm: median tok/s (p10-p90), time to first token; ratios to "direct" paired by repeat;
    the streamed reply's overhead per chunk."""
    by = {arm: {r["repeat"]: r for r in runs if r["arm"] == arm} for arm in ARMS}
    out: dict = {}
    for arm, rs in by.items():
        if not rs:
            continue
        tps = [r["tokens_per_s"] for r in rs.values()]
        out[arm] = {"tokens_per_s": round(statistics.median(tps), 2),
                    "tokens_per_s_p10_p90": [round(_pct(tps, 0.1), 2), round(_pct(tps, 0.9), 2)],
                    "engine_tokens_per_s": round(statistics.median(r["engine_tokens_per_s"] for r in rs.values()), 2),
                    "ttft_ms": round(statistics.median(r["ttft_ms"] for r in rs.values()), 2),
                    "tau": round(statistics.median(r["tau"] for r in rs.values()), 3)}
        if arm != "direct" and by["direct"]:
            ratios = [r["tokens_per_s"] / by["direct"][k]["tokens_per_s"] for k, r in rs.items() if k in by["direct"]]
            out[arm]["vs_direct"] = round(statistics.median(ratios), 4)
            out[arm]["vs_direct_p10_p90"] = [round(_pct(ratios, 0.1), 4), round(_pct(ratios, 0.9), 4)]
    stream, direct = by["server-stream"], by["direct"]
    per_chunk = [(r["wall_s"] - direct[k]["wall_s"]) / r["chunks"] * 1000.0
                 for k, r in stream.items() if k in direct and r["chunks"]]
    if per_chunk:
        out["stream_overhead_ms_per_chunk"] = round(statistics.median(per_chunk), 4)
        out["stream_chunks"] = statistics.median(r["chunks"] for r in stream.values())
    out["noise_band"] = out.get("direct-again", {}).get("vs_direct_p10_p90")
    texts = {r["text"] for r in runs if r["arm"] != "server-penalties"}
    out["same_text"] = len(texts) == 1  # greedy: every arm without penalties should write the same reply
    return out

"""One greedy completion on the real llama-server of the pinned tree (native.server: built from the
patched sdist once, then cached), started as `flashdesk bench` starts its peers (app.bench.peers.ServerPeer)
but with a chosen log verbosity: at 4 and above the log has the loader's lines (DFlash2's selector), at 5
llama.cpp's debug lines (each draft candidate a sampler read). One thread per pool: with the target's and
the drafter's pools at 2 threads each on a 2-core machine, they spin against each other (a 16-token reply
took 0.3-20 s from one request to the next)."""

from __future__ import annotations

from pathlib import Path

from app.bench.peers import ServerPeer, parse_mode
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import FixedDraftLength
from app.engine.params import GenerationParams
from native import server as native_server


def server_exe() -> Path:
    return native_server.server_path() or native_server.build_server()


def complete_on_server(mode: str, target: Path, drafter: Path | None, tokens: list[int], max_tokens: int,
                       verbosity: int = 5) -> tuple[dict, list[str], str]:
    """(the bench entry of one /completion of `tokens`, the peer's spec_log, the server's whole log)."""
    peer = ServerPeer(parse_mode(mode), server_exe(), target, drafter, n_ctx=512, n_threads=1, n_batch=64)
    peer.args += ["-lv", str(verbosity)]
    try:
        peer.start(timeout_s=120)
        entry = peer.run(tokens, max_tokens, [])
        log = peer.log_path.read_text(errors="replace")
    finally:
        peer.close()
    return entry, peer.spec_log, log


def plain_tokens(target: Path, text: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """(the prompt's tokens, FlashDesk's plain greedy reply to them)."""
    e = Engine(target, None, EngineConfig(n_ctx=512, n_threads=1))
    try:
        prompt = e.tokenize(text)
        out = [t for ev in e.generate(prompt, GenerationParams(max_tokens=max_tokens), policy=FixedDraftLength(0))
               for t in ev.tokens]
        return prompt, out
    finally:
        e.close()

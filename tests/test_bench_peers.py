"""Peer modes of `flashdesk bench` (app.bench.peers): llama.cpp's own llama-server loops and
llama-cpp-python's prompt lookup, side by side with ours.

The fast tests cover the pure parts (mode names, server flags, the /completion reply, the
summary, the plot) and the HTTP plumbing against a stand-in server; the slow one builds the real
llama-server from the patched tree (once, cached) and runs peers through `flashdesk bench`."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from app.bench import peers
from app.bench.peers import PeerSpec, parse_completion, parse_mode
from app.bench.runner import bench, on_one_clock, peer_summary, summarize
from app.engine.stats import GenerationStats

# --- mode names -------------------------------------------------------------------------------


def test_mode_names_parse_to_server_flags() -> None:
    assert parse_mode("plain") is None and parse_mode("hybrid") is None  # ours
    assert parse_mode("upstream-plain").spec_args() == []
    d = parse_mode("upstream-dflash")
    assert d.needs_drafter and d.spec_args() == ["--spec-type", "draft-dflash"]  # its default length (3)
    assert parse_mode("upstream-dflash@7").spec_args() == ["--spec-type", "draft-dflash", "--spec-draft-n-max", "7"]
    lk = parse_mode("upstream-lookup")
    assert lk.spec_types == (peers.DEFAULT_LOOKUP,) and not lk.needs_drafter
    assert parse_mode("upstream-lookup:ngram-simple@8").spec_args() == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"]
    assert parse_mode("upstream-lookup:ngram-mod@16").spec_args() == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-min", "12"]
    ch = parse_mode("upstream-chain")
    assert ch.spec_types == ("ngram-simple", "draft-dflash") and ch.needs_drafter
    assert parse_mode("upstream-chain:ngram-mod+draft-dflash@4").spec_args() == [
        "--spec-type", "ngram-mod,draft-dflash", "--spec-ngram-mod-n-max", "4", "--spec-ngram-mod-n-min", "3",
        "--spec-draft-n-max", "4"]
    py = parse_mode("llama-cpp-python-lookup")
    assert py.k == peers.DEFAULT_PY_LOOKUP_K and not py.on_server
    assert parse_mode("llama-cpp-python-lookup@4").k == 4


@pytest.mark.parametrize("bad", ["upstream-lookup:ngram-foo", "upstream-lookup:draft-dflash", "upstream-dflash@0",
                                 "upstream-dflash@x", "upstream-plain@3", "upstream-chain:ngram-mod",
                                 "upstream-lookup:ngram-cache@4", "llama-cpp-python-lookup:ngram-mod"])
def test_malformed_peer_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_mode(bad)
    with pytest.raises(ValueError):  # before the engine is touched
        bench(None, [], ["plain", bad])  # type: ignore[arg-type]


def test_unknown_mode_lists_the_peers() -> None:
    with pytest.raises(ValueError, match="upstream-dflash"):
        bench(None, [], ["nonsense"])  # type: ignore[arg-type]


# --- the server's reply ------------------------------------------------------------------------

REPLY = {"content": " world", "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "stop_type": "limit", "tokens_evaluated": 12,
         "timings": {"cache_n": 0, "prompt_n": 12, "prompt_ms": 20.0, "predicted_n": 10, "predicted_ms": 100.0,
                     "predicted_per_second": 100.0, "draft_n": 9, "draft_n_accepted": 6}}


def test_completion_reply_parses_to_a_bench_entry() -> None:
    e = parse_completion(REPLY, wall_s=0.2)
    assert e["tokens"] == list(range(1, 11)) and e["text"] == " world" and e["finish_reason"] == "length"
    assert e["tokens_per_s"] == 90.0 and e["wall_tokens_per_s"] == 50.0  # 9 tokens after the first in 100 ms
    assert e["n_prompt"] == 12 and e["n_generated"] == 10
    assert (e["drafted"], e["accepted"]) == (9, 6) and e["acceptance_rate"] == round(6 / 9, 4)
    assert e["steps"] == 4 and e["tau"] == 2.5  # 10 tokens from 4 target passes
    plain = parse_completion({"content": "x", "tokens": [5], "stop_type": "eos",
                              "timings": {"predicted_n": 1, "predicted_per_second": 50.0}}, 0.1)
    assert plain["finish_reason"] == "stop" and plain["drafted"] == 0 and plain["tau"] == 1.0


def test_ours_and_the_servers_tokens_per_s_are_one_clock() -> None:
    """A 13-token reply at 10 ms a token after the first on both sides. Ours: a first step of 18 ms
    (it decodes the prompt's last token, indexes the prompt, rebuilds the graph: 1.2x a step in the
    docqa replies of docs/bench/peers-cpu.json), then 12 of 10 ms; the server's prompt pass makes
    token 1, then 120 ms for 12 (its predicted_per_second in this tree). Same speed: the ratio is 1.
    Ours counted whole, 13 / 138 ms, read 0.94 of the server."""
    st = GenerationStats()
    for s in [0.018] + [0.010] * 12:
        st.record_step("plain", 0, 0, 1, s)
    st.t_decode_s = 0.138
    ours = on_one_clock(st.to_dict(history=True))
    server = parse_completion({"content": "x", "tokens": list(range(13)), "stop_type": "eos",
                               "timings": {"predicted_n": 13, "predicted_ms": 120.0, "predicted_per_second": 100.0}},
                              0.2)
    assert ours["tokens_per_s"] == server["tokens_per_s"] == 100.0
    assert ours["loop_tokens_per_s"] == round(13 / 0.138, 3)  # the engine's own figure, kept
    row = {"id": "p", "category": "chat", "modes": {"hybrid": ours | {"speedup": 1.0},
                                                     "upstream-plain": server | {"speedup": 1.0}}}
    assert peer_summary([row], ["hybrid", "upstream-plain"])["by_peer"]["upstream-plain"]["ours_over_peer"] == 1.0
    # a first step that drafted: its accepted tokens came with it, before the clock starts
    st = GenerationStats()
    st.record_step("lookup", 3, 3, 4, 0.020)
    st.record_step("plain", 0, 0, 1, 0.010)
    st.t_decode_s = 0.030
    assert on_one_clock(st.to_dict(history=True))["tokens_per_s"] == 100.0


# --- the summary and the plot -----------------------------------------------------------------


def _entry(tps: float, speedup: float = 1.0, **kw: float) -> dict:
    return {"tokens_per_s": tps, "speedup": speedup, "tau": 1.0, "identical": True, "n_generated": 8, "steps": 8,
            "wall_tokens_per_s": tps * 0.9} | kw


def _rows() -> list[dict]:
    rows = []
    for i, (cat, base) in enumerate([("code", 100.0), ("code", 50.0), ("chat", 80.0)]):
        rows.append({"id": f"p{i}", "category": cat, "modes": {
            "plain": {"tokens_per_s": base, "tau": 1.0, "n_generated": 8, "steps": 8},
            "hybrid": _entry(base * 1.5, 1.5),
            "upstream-plain": _entry(base * 0.9, 0.9),
            "upstream-lookup": _entry(base * 1.2, 1.2, drafted=10, accepted=5)}})
    return rows


def test_summary_has_ours_over_each_peer_per_category() -> None:
    modes = ["plain", "hybrid", "upstream-plain", "upstream-lookup"]
    s = summarize(_rows(), modes)
    for block in (s["overall"], *s["by_category"].values()):
        p = block["peers"]
        assert p["ours"] == "hybrid" and set(p["by_peer"]) == {"upstream-plain", "upstream-lookup"}
        assert p["by_peer"]["upstream-lookup"]["ours_over_peer"] == 1.25
        assert p["by_peer"]["upstream-plain"]["ours_over_peer"] == round(1.5 / 0.9, 4)
        assert p["best_peer"] == "upstream-lookup" and p["ours_over_best_peer"] == 1.25
        assert p["by_peer"]["upstream-lookup"]["acceptance_rate"] == 0.5
    assert s["by_category"]["code"]["upstream-lookup"]["median_speedup"] == 1.2
    # no mode of ours but plain: plain is compared
    assert peer_summary(_rows(), ["plain", "upstream-plain"])["ours"] == "plain"
    assert "peers" not in summarize(_rows(), ["plain", "hybrid"])["overall"]


def test_plot_draws_the_peers(tmp_path: Path) -> None:
    from app.bench.plot import plot_bench

    modes = ["plain", "hybrid", "upstream-plain", "upstream-lookup"]
    res = {"modes": modes, "prompts": _rows(), "summary": summarize(_rows(), modes)}
    out = plot_bench(res, tmp_path / "b.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the build entry -------------------------------------------------------------------------


def test_server_build_is_keyed_like_the_libraries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from native import config
    from native import server as ns

    monkeypatch.setenv("FLASHDESK_NATIVE_CACHE", str(tmp_path))
    monkeypatch.delenv("FLASHDESK_LLAMA_SERVER", raising=False)
    flags = ns.server_flags("cpu")
    assert "-DGGML_NATIVE=OFF" in flags and "-DLLAMA_BUILD_SERVER=ON" in flags
    assert "-DLLAMA_BUILD_SERVER=OFF" not in flags and "-DLLAMA_USE_PREBUILT_UI=OFF" in flags
    assert ns.server_key("cpu") != config.build_key("cpu") and ns.server_key("cpu") == ns.server_key("cpu")
    assert ns.server_dir("cpu").parent == tmp_path and ns.server_path("cpu") is None  # not built: no path
    assert "llama-server" in ns.server_targets("cpu")


# --- the HTTP plumbing against a stand-in server ----------------------------------------------

STANDIN = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        self._send({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["n_predict"]
        toks = [(t + 1) % 50 for t in req["prompt"][-1:] * n][:n]
        self._send({"content": "x" * n, "tokens": toks, "stop_type": "limit", "echo": req,
                    "timings": {"prompt_n": len(req["prompt"]), "predicted_n": n, "predicted_ms": 20.0 * (n - 1),
                                "draft_n": n, "draft_n_accepted": n // 2}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_server_peer_over_loopback_with_a_standin(tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{STANDIN}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    spec = parse_mode("upstream-chain")
    with pytest.raises(ValueError, match="drafter"):
        peers.ServerPeer(spec, exe, tmp_path / "t.gguf", None, 512, 2, 64)
    p = peers.ServerPeer(spec, exe, tmp_path / "t.gguf", tmp_path / "d.gguf", 512, 2, 64)
    assert p.args[p.args.index("-t") + 1] == "2" and p.args[p.args.index("-md") + 1] == str(tmp_path / "d.gguf")
    assert p.args[p.args.index("--spec-type") + 1] == "ngram-simple,draft-dflash"
    assert p.args[p.args.index("--host") + 1] == "127.0.0.1"
    try:
        p.start(timeout_s=60)
        e = p.run([2, 7, 9], 6, ["\n"])
    finally:
        p.close()
    assert p.proc is None
    assert e["tokens"] == [10] * 6 and e["tokens_per_s"] == 50.0 and e["n_prompt"] == 3
    assert e["drafted"] == 6 and e["accepted"] == 3 and e["wall_s"] > 0


def test_server_that_dies_at_start_says_why(tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\nimport sys\nprint('error: cannot load the model')\nsys.exit(3)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    p = peers.ServerPeer(PeerSpec("upstream-plain", "upstream-plain"), exe, tmp_path / "t.gguf", None, 512, 1, 64)
    with pytest.raises(RuntimeError, match="cannot load the model"):
        p.start(timeout_s=30)


# --- the real thing (slow: builds llama-server once, a few minutes on 2 cores) -----------------


@pytest.mark.slow
@pytest.mark.gemma
def test_bench_runs_upstream_and_llama_cpp_python_peers(gemma_target: Path, shipped_drafter: Path,
                                                        tmp_path: Path) -> None:
    from app.cli import main
    from native import server as ns

    if not os.environ.get("FLASHDESK_LLAMA_SERVER"):
        ns.build_server()  # cached after the first time
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "code", "prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "format": "raw",
                    "category": "code"}) + "\n"
        + json.dumps({"id": "chat", "prompt": "What is the capital of France?", "category": "chat"}) + "\n")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    modes = "plain,lookup,upstream-dflash,llama-cpp-python-lookup"
    assert main(["bench", "--target", str(gemma_target), "--drafter", str(shipped_drafter), "--prompts", str(prompts),
                 "--max-tokens", "16", "--threads", "2", "--mode", modes, "--json", str(out),
                 "--plot", str(png)]) == 0
    res = json.loads(out.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "--spec-type" in res["peers"]["upstream-dflash"]["args"]
    assert res["tokens_per_s_definition"] == peers.TOKENS_PER_S
    for r in res["prompts"]:
        for m in ("upstream-dflash", "llama-cpp-python-lookup"):
            e = r["modes"][m]
            assert e["lossless"] is True, (m, e.get("hard_mismatches"))
            assert e["tokens_per_s"] > 0 and e["speedup"] > 0 and 0 < len(e["tokens"]) <= 16
        assert r["modes"]["upstream-dflash"]["n_prompt"] == r["n_prompt"]  # the same prompt tokens
        assert r["modes"]["upstream-dflash"]["drafted"] > 0
        tm = r["modes"]["upstream-dflash"]["timings"]  # the server's first token is outside its clock: not counted
        assert r["modes"]["upstream-dflash"]["tokens_per_s"] == pytest.approx(
            (tm["predicted_n"] - 1) / tm["predicted_ms"] * 1e3, abs=1e-3)
        assert r["modes"]["lookup"]["loop_tokens_per_s"] > 0  # ours on the same clock, its own figure kept
    p = res["summary"]["by_category"]["code"]["peers"]
    assert p["ours"] == "lookup" and set(p["by_peer"]) == {"upstream-dflash", "llama-cpp-python-lookup"}


def test_llama_cpp_python_lookup_runs_past_n_batch_tokens_of_context(tiny_pair: tuple[Path, Path]) -> None:
    """llama-cpp-python with a draft_model sizes its scores buffer by n_batch unless logits_all is
    passed: a prompt longer than n_batch failed in Llama.eval (seen on a 1.4k-token prompt)."""
    from app.bench.peers import PythonLookupPeer
    from app.engine.dflash import Engine, EngineConfig

    engine = Engine(*tiny_pair, EngineConfig(n_ctx=512, n_batch=32, n_threads=1))
    peer = PythonLookupPeer(parse_mode("llama-cpp-python-lookup@4"), engine)
    try:
        prompt = engine.tokenize("one two three four five six seven eight nine ten " * 12)
        assert len(prompt) > 3 * 32
        out = peer.run(prompt, 24, [])
        assert out["n_generated"] == len(out["tokens"]) > 0 and out["steps"] >= 1
    finally:
        peer.close()
        engine.close()


def test_upstream_draft_is_draft_simple_with_the_draft_model() -> None:
    """upstream-draft: llama-server's draft-simple on our classic draft model (issue 28 point 5)."""
    d = peers.parse_mode("upstream-draft@4")
    assert d.needs_draft_model and not d.needs_drafter and d.on_server
    assert d.spec_args() == ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    p = peers.ServerPeer(d, Path("llama-server"), Path("t.gguf"), None, 512, 2, 512, draft_model=Path("dm.gguf"))
    assert p.args[p.args.index("-md") + 1] == "dm.gguf"
    with pytest.raises(ValueError, match="needs a draft model"):
        peers.ServerPeer(d, Path("llama-server"), Path("t.gguf"), Path("d.gguf"), 512, 2, 512)
    with pytest.raises(ValueError, match="one draft file"):
        peers.parse_mode("upstream-chain:draft-simple+draft-dflash")


def test_upstream_mtp_is_draft_mtp_on_the_targets_own_heads(tmp_path: Path) -> None:
    """upstream-mtp: llama-server's draft-mtp, the target's own MTP heads (no second file); a target
    without heads is refused before a server starts (issue 28 point 5)."""
    from gguf_tools.synth import write_tiny_target

    m = peers.parse_mode("upstream-mtp@2")
    assert not m.needs_drafter and not m.needs_draft_model and m.needs_mtp_heads and m.on_server
    assert m.spec_args() == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    with_heads = write_tiny_target(tmp_path / "mtp.gguf", "qwen35", mtp_layers=1)
    p = peers.ServerPeer(m, Path("llama-server"), with_heads, None, 512, 2, 512)
    assert "-md" not in p.args and p.args[p.args.index("-m") + 1] == str(with_heads)
    without = write_tiny_target(tmp_path / "trunk.gguf", "qwen35")
    with pytest.raises(ValueError, match="needs a target with MTP heads; trunk.gguf has none"):
        peers.ServerPeer(m, Path("llama-server"), without, None, 512, 2, 512)
    with pytest.raises(ValueError, match="takes no type"):
        peers.parse_mode("upstream-mtp:ngram-mod")


@pytest.mark.slow
def test_bench_runs_upstream_mtp_on_a_qwen35_target_with_heads(tmp_path: Path) -> None:
    """The real llama-server drafts from the tiny Qwen3.5 target's MTP head: its output is ours plain."""
    from app.cli import main
    from gguf_tools.synth import write_tiny_target
    from native import server as ns

    if not os.environ.get("FLASHDESK_LLAMA_SERVER"):
        ns.build_server()  # cached after the first time
    target = write_tiny_target(tmp_path / "mtp.gguf", "qwen35", mtp_layers=1)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "t", "prompt": "the cat sat on the mat", "format": "raw",
                                   "category": "tiny"}) + "\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--target", str(target), "--no-drafter", "--prompts", str(prompts), "--max-tokens", "24",
                 "--threads", "2", "--mode", "plain,upstream-mtp@3", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert "draft-mtp" in res["peers"]["upstream-mtp@3"]["args"]
    e = res["prompts"][0]["modes"]["upstream-mtp@3"]
    assert e["lossless"] is True and e["tokens"] == res["prompts"][0]["modes"]["plain"]["tokens"]
    assert e["drafted"] > 0  # from the head (random: none pass)


def test_upstream_eagle3_is_draft_eagle3_on_our_eagle3_drafter(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """upstream-eagle3: llama-server's draft-eagle3 with the EAGLE-3 file we load as the drafter."""
    from app.engine.dflash import Engine, EngineConfig
    from gguf_tools.synth import write_eagle3

    m = peers.parse_mode("upstream-eagle3@4")
    assert m.needs_eagle3 and not m.needs_drafter and not m.needs_mtp_heads and m.on_server
    assert m.spec_args() == ["--spec-type", "draft-eagle3", "--spec-draft-n-max", "4"]
    e3 = write_eagle3(tmp_path / "e3.gguf", tiny_pair[0])
    e = Engine(tiny_pair[0], e3, EngineConfig(n_ctx=256, n_threads=1))
    try:
        assert e.drafter_path == e3 and not e.has_drafter
        p = peers.ServerPeer(m, Path("llama-server"), tiny_pair[0], e.drafter_path, 512, 2, 512)
        assert p.args[p.args.index("-md") + 1] == str(e3)
    finally:
        e.close()
    with pytest.raises(ValueError, match="needs a drafter"):
        peers.ServerPeer(m, Path("llama-server"), tiny_pair[0], None, 512, 2, 512)
    with pytest.raises(ValueError, match="takes no type"):
        peers.parse_mode("upstream-eagle3:ngram-mod")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_bench_runs_ours_beside_the_server_on_the_heads(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                        kind: str) -> None:
    """Our MTP and EAGLE-3 sources and llama-server's draft-mtp and draft-eagle3 in one bench run, on
    the tiny Qwen3.5 target's head and a random EAGLE-3 drafter for the tiny qwen3 target: every
    output is plain decoding's, and both drafted."""
    from app.cli import main
    from gguf_tools.synth import write_eagle3, write_tiny_target
    from native import server as ns

    if not os.environ.get("FLASHDESK_LLAMA_SERVER"):
        ns.build_server()  # cached after the first time
    if kind == "mtp":
        model = ["--target", str(write_tiny_target(tmp_path / "mtp.gguf", "qwen35", mtp_layers=1)), "--no-drafter"]
    else:
        model = ["--target", str(tiny_pair[0]), "--drafter", str(write_eagle3(tmp_path / "e3.gguf", tiny_pair[0]))]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "t", "prompt": "the cat sat on the mat", "format": "raw",
                                   "category": "tiny"}) + "\n")
    out = tmp_path / "bench.json"
    peer = f"upstream-{kind}@3"
    assert main(["bench", *model, "--prompts", str(prompts), "--max-tokens", "24", "--threads", "2",
                 "--mode", f"plain,{kind},{peer}", "--draft-max", "3", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert f"draft-{kind}" in res["peers"][peer]["args"]
    modes = res["prompts"][0]["modes"]
    for m in (kind, peer):
        assert modes[m]["lossless"] is True and modes[m]["tokens"] == modes["plain"]["tokens"]
        assert modes[m]["drafted"] > 0


def test_upstream_dspark_is_draft_dspark_and_each_dflash_peer_refuses_the_other_format(
        tiny_pair: tuple[Path, Path], tiny_dflash2_pair: tuple[Path, Path],
        tiny_dspark_pair: tuple[Path, Path]) -> None:
    """upstream-dspark: llama-server's draft-dspark on our DSpark drafter. llama-server itself runs
    draft-dflash on a DSpark file (v1's block layout, not anchor-first) and draft-dspark on a DFlash2 one, so
    each peer refuses the other's files by their headers (gguf_tools.formats), naming the file."""
    from app.errors import DraftFormatMismatch

    target, v1 = tiny_pair
    dflash2, dspark = tiny_dflash2_pair[1], tiny_dspark_pair[1]
    m = parse_mode("upstream-dspark@5")
    assert m.needs_drafter and not m.needs_eagle3 and not m.needs_draft_model and m.on_server
    assert m.spec_args() == ["--spec-type", "draft-dspark", "--spec-draft-n-max", "5"]
    assert parse_mode("upstream-dspark").spec_args() == ["--spec-type", "draft-dspark"]
    p = peers.ServerPeer(m, Path("llama-server"), target, dspark, 512, 2, 512)
    assert p.args[p.args.index("-md") + 1] == str(dspark)
    dflash = parse_mode("upstream-dflash")
    for f in (v1, dflash2):  # DFlash v1 and DFlash2 both run as draft-dflash
        peers.check_draft_file(dflash, f)
    peers.check_draft_file(m, dspark)
    with pytest.raises(DraftFormatMismatch, match=r"^upstream-dflash: tiny-qwen3-dspark.gguf is a DSpark file; "
                                                  r"draft-dflash runs DFlash v1 and DFlash2 drafters "
                                                  r"\(use upstream-dspark\)"):
        peers.check_draft_file(dflash, dspark)
    for f, label in ((v1, "DFlash v1"), (dflash2, "DFlash2")):
        with pytest.raises(DraftFormatMismatch, match=rf"^upstream-dspark@5: {f.name} is a {label} file; "
                                                      r"draft-dspark runs DSpark drafters \(use upstream-dflash\)"):
            peers.check_draft_file(m, f)
    with pytest.raises(DraftFormatMismatch, match="tiny-qwen3-dspark.gguf is a DSpark file"):  # in a chain too
        peers.check_drafter_formats(["plain", "upstream-chain:ngram-mod+draft-dflash"], dspark)
    peers.check_drafter_formats(["upstream-plain", "upstream-lookup", "upstream-dspark"], dspark)
    with pytest.raises(ValueError, match="needs a drafter"):
        peers.ServerPeer(m, Path("llama-server"), target, None, 512, 2, 512)
    for bad in ("upstream-dspark:ngram-mod", "upstream-chain:draft-dspark+draft-dflash", "upstream-dspark@0"):
        with pytest.raises(ValueError):
            parse_mode(bad)


def test_bench_refuses_a_peer_of_the_other_format_before_anything_runs(tiny_pair: tuple[Path, Path]) -> None:
    """The bench checks the drafter's format before it calibrates or starts a server."""
    from app.engine.dflash import Engine, EngineConfig
    from app.errors import DraftFormatMismatch

    e = Engine(*tiny_pair, EngineConfig(n_ctx=256, n_threads=1))
    try:
        with pytest.raises(DraftFormatMismatch, match="tiny-qwen3-dflash.gguf is a DFlash v1 file"):
            bench(e, [], ["plain", "upstream-dspark"])
    finally:
        e.close()


@pytest.mark.slow
def test_llama_server_walks_a_dflash2_files_selector(tiny_pair: tuple[Path, Path],
                                                     tiny_dflash2_pair: tuple[Path, Path]) -> None:
    """upstream-dflash on a DFlash2 file: llama-server loads the selector (the loader's line, at -lv 4+)
    as draft-dflash, drafts from the lattice its graph writes (is_dflash2: no draft sampled from logits,
    which llama.cpp logs at -lv 5 for every candidate it reads, as it does for the v1 file), and the
    reply is plain decoding's."""
    from server_once import complete_on_server, plain_tokens

    target = tiny_pair[0]
    prompt, plain = plain_tokens(target, "the cat sat on the mat", 24)
    runs = {f: complete_on_server("upstream-dflash@3", target, d, prompt, 24)
            for f, d in (("v1", tiny_pair[1]), ("dflash2", tiny_dflash2_pair[1]))}
    for f, (entry, spec_log, _) in runs.items():
        assert entry["tokens"] == plain, f
        assert entry["drafted"] > 0, f
        assert any("adding speculative implementation 'draft-dflash'" in x for x in spec_log), (f, spec_log)
    entry, spec_log, log = runs["dflash2"]
    assert any("DFlash2 conv kernel" in x and "top-k = 4" in x for x in spec_log), spec_log
    assert "draft candidate" not in log  # the selector's walk: no sampler read a drafter row
    _, v1_log, v1_whole = runs["v1"]
    assert not any("DFlash2" in x for x in v1_log) and "draft candidate" in v1_whole


@pytest.mark.slow
def test_bench_runs_upstream_dspark_beside_ours_on_a_dspark_file(tiny_dspark_pair: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    """llama-server's draft-dspark and our dspark mode in one `flashdesk bench` run on the tiny target
    with a random DSpark drafter: both draft, both outputs are plain decoding's, the server's log says
    draft-dspark, and the JSON names the drafter's format per source."""
    from server_once import server_exe

    from app.cli import main

    server_exe()  # built once, cached
    target, dspark = tiny_dspark_pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "t", "prompt": "the cat sat on the mat", "format": "raw",
                                   "category": "tiny"}) + "\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--target", str(target), "--drafter", str(dspark), "--prompts", str(prompts),
                 "--max-tokens", "24", "--threads", "1", "--mode", "plain,dspark,upstream-dspark@3",
                 "--draft-max", "3", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    info = res["peers"]["upstream-dspark@3"]
    assert "draft-dspark" in info["args"]
    assert any("adding speculative implementation 'draft-dspark'" in x for x in info["spec_log"]), info["spec_log"]
    modes = res["prompts"][0]["modes"]
    for m in ("dspark", "upstream-dspark@3"):
        assert modes[m]["lossless"] is True and modes[m]["tokens"] == modes["plain"]["tokens"], m
        assert modes[m]["drafted"] > 0, m
    assert res["source_formats"] == {"dflash": "dspark"}
    assert res["summary"]["overall"]["dspark"]["format_by_source"] == {"dflash": "dspark"}

"""The OpenAI-compatible server, for real: uvicorn on 127.0.0.1 (a free port) over the bundled pair
(Gemma 3 270M Q4_K_M + its distilled drafter) in draft mode hybrid, driven by the openai package.
Greedy replies are checked with the teacher-forced lossless check on a second, plain engine."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from app.bundled import default_drafter, default_target
from app.chat.format import ChatMessage, prompt_format_of
from app.cli import main
from app.engine.controller import policy_for_mode
from app.engine.dflash import Engine, EngineConfig
from app.engine.lossless import check_lossless
from app.engine.params import GenerationParams
from app.server.app import resolve_model
from app.server.config import ServerConfig, is_loopback
from app.server.errors import ApiError, ServerConfigError
from app.server.runner import BackgroundServer
from app.server.service import SERVED_MODE, ServedModel, ThreadExecutor, model_id_of
from app.session.models import load_engine, resolve_spec
from gguf_tools.edit import copy_gguf

pytestmark = pytest.mark.gemma

KEY = "test-key-123"
N_CTX = 2048
QUESTION = "What is the capital of France?"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # a base model goes on counting: a reply that does not end by itself
WAIT_S = 120


class Served:
    def __init__(self, server: BackgroundServer, model: str):
        self.server = server
        self.url = server.url
        self.service = server.service
        self.model = model

    def client(self, key: str = KEY, retries: int = 0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=retries, timeout=WAIT_S)

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            key: str | None = KEY) -> tuple[int, dict, bytes]:
        """A request as any HTTP client sends it: (status, headers, body)."""
        u = urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=WAIT_S)
        h = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
        conn.request(method, path, body, h | (headers or {}))
        resp = conn.getresponse()
        out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        conn.close()
        return out


@pytest.fixture(scope="module")
def served():
    drafter = default_drafter()
    assert drafter is not None, "the bundled drafter is missing from assets/drafters"
    # one llama.cpp thread: see tests/ui/conftest.py (tiny_spec)
    engine = load_engine(resolve_spec(n_ctx=N_CTX, n_threads=1))
    model = ServedModel.for_engine(engine, policy_for_mode(engine, SERVED_MODE))
    executor = ThreadExecutor(model)
    server = BackgroundServer(executor, ServerConfig(port=0, api_key=KEY, max_queue=1, max_tokens=N_CTX))
    yield Served(server, model.name)
    server.stop()
    executor.close()
    engine.close()


@pytest.fixture(scope="module")
def checker():
    """The plain target alone: tokenizes as the server does, and runs the teacher-forced check."""
    e = Engine(default_target(), None, EngineConfig(n_ctx=N_CTX, n_threads=1))
    yield e
    e.close()


def chat_prompt(engine: Engine, messages: list[ChatMessage]) -> list[int]:
    return engine.tokenize(prompt_format_of(engine.target).render(messages))


def ask(client: openai.OpenAI, model: str, messages: list[dict] | None = None, **kw):  # noqa: ANN003, ANN201
    return client.chat.completions.create(model=model, messages=messages or [{"role": "user", "content": QUESTION}],
                                          temperature=0, **kw)


def long_stream(client: openai.OpenAI, model: str):  # noqa: ANN201 - an openai Stream
    return client.completions.create(model=model, prompt=COUNTING, max_tokens=400, temperature=0, stream=True)


def check_timings(t: dict, completion_tokens: int) -> None:
    """timings agree with themselves and with usage (they are the engine's stats)."""
    assert t["predicted_n"] == completion_tokens
    assert t["draft_n"] == sum(t["drafted_by_source"].values())
    assert t["draft_n_accepted"] == sum(t["accepted_by_source"].values()) <= t["draft_n"]
    assert t["steps"] == t["predicted_n"] - t["draft_n_accepted"]  # each step: its accepted drafts + 1
    assert t["tau"] == pytest.approx(t["predicted_n"] / t["steps"], abs=1e-3)
    assert t["token_share"]["target"] == pytest.approx(t["steps"] / t["predicted_n"], abs=1e-3)
    assert sum(t["token_share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert t["predicted_per_second"] == pytest.approx(t["predicted_n"] / t["predicted_ms"] * 1000, rel=0.01)
    assert t["prompt_n"] + t["cache_n"] > 0 and t["prompt_ms"] >= 0


def test_health_and_models(served: Served) -> None:
    status, _, body = served.raw("GET", "/health", key=None)  # no key needed
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert served.model == model_id_of(default_target())
    assert [m.id for m in served.client().models.list().data] == [served.model]
    assert served.client().models.retrieve(served.model).id == served.model


def test_streamed_and_whole_greedy_replies_agree_and_are_lossless(served: Served, checker: Engine) -> None:
    client = served.client()
    whole = ask(client, served.model, max_tokens=32, extra_body={"return_tokens": True})
    choice = whole.choices[0]
    assert choice.message.content.strip() and choice.finish_reason in ("stop", "length")
    prompt = chat_prompt(checker, [ChatMessage("user", QUESTION)])
    assert whole.usage.prompt_tokens == len(prompt)
    assert whole.usage.completion_tokens == len(choice.tokens)
    check_timings(whole.timings, whole.usage.completion_tokens)
    record = served.service.records[-1]
    assert (record.completion_tokens, record.tau) == (whole.timings["predicted_n"],
                                                      pytest.approx(whole.timings["tau"], abs=1e-3))

    chunks = list(ask(client, served.model, max_tokens=32, stream=True, extra_body={"return_tokens": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = chunks[-1]
    assert text == choice.message.content
    assert last.choices[0].finish_reason == choice.finish_reason
    # the same tokens, but for those a step emitted past a stop string (how many depends on the drafts)
    a, b = sorted([last.choices[0].tokens, choice.tokens], key=len)
    assert b[:len(a)] == a
    assert last.usage.completion_tokens == len(last.choices[0].tokens)
    check_timings(last.timings, last.usage.completion_tokens)
    assert last.timings["cache_n"] == len(prompt) - 1  # the same prompt again: its KV came from the last turn

    for tokens in (choice.tokens, last.choices[0].tokens):
        rep = check_lossless(checker, prompt, tokens)
        assert rep.lossless, rep.hard_mismatches


def test_a_conversation_reuses_the_kv_cache_and_completions_stream_sse(served: Served, checker: Engine) -> None:
    client = served.client()
    turns = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]
    first = ask(client, served.model, turns, max_tokens=16)
    turns += [{"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "And of Italy?"}]
    second = ask(client, served.model, turns, max_tokens=8)
    assert second.usage.prompt_tokens == len(chat_prompt(checker, [ChatMessage(m["role"], m["content"])
                                                                   for m in turns]))
    # the second turn's prompt extends the first's: its KV stays (the last prompt token is decoded anew)
    assert second.timings["cache_n"] >= first.usage.prompt_tokens - 1
    assert second.usage.prompt_tokens_details.cached_tokens == second.timings["cache_n"]

    # /v1/completions as raw server-sent events, ending with [DONE]
    body = json.dumps({"model": served.model, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    status, headers, raw = served.raw("POST", "/v1/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 8  # include_usage
    assert objs[-2]["choices"][0]["finish_reason"] == "length" and "timings" in objs[-2]
    assert all(o["object"] == "text_completion" for o in objs)


def test_stop_strings(served: Served) -> None:
    client = served.client()
    free = ask(client, served.model, max_tokens=32).choices[0].message.content
    words = re.findall(r"[A-Za-z]{3,}", free)
    assert len(words) >= 3, free
    stop = words[len(words) // 2]
    cut = free[:free.index(stop)]
    whole = ask(client, served.model, max_tokens=32, stop=[stop])
    assert whole.choices[0].message.content == cut and whole.choices[0].finish_reason == "stop"
    chunks = list(ask(client, served.model, max_tokens=32, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def wait_for(cond, timeout: float = WAIT_S) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_client_that_disconnects_mid_stream_cancels_its_generation(served: Served) -> None:
    client = served.client()
    n_before = len(served.service.records)
    with long_stream(client, served.model) as stream:
        seen = 0
        for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].text)
            if seen == 2:
                break  # leaving the block closes the connection
    wait_for(lambda: len(served.service.records) > n_before)
    gone = served.service.records[-1]
    assert gone.finish_reason == "cancelled" and gone.completion_tokens < 400
    assert served.service.pending == 0
    after = ask(client, served.model, max_tokens=4)  # the next request is served
    assert after.usage.completion_tokens == 4

    # a client waiting for a whole reply that hangs up: noticed while the reply is generated
    n_before = len(served.service.records)
    body = json.dumps({"model": served.model, "prompt": COUNTING, "max_tokens": 400, "temperature": 0}).encode()
    u = urlsplit(served.url)
    with socket.create_connection((u.hostname, u.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        wait_for(lambda: served.service.pending == 1)
        time.sleep(0.3)  # a few steps in
    wait_for(lambda: len(served.service.records) > n_before)
    gone = served.service.records[-1]
    assert gone.finish_reason == "cancelled" and gone.completion_tokens < 400
    assert ask(client, served.model, max_tokens=4).usage.completion_tokens == 4


def test_concurrent_clients_are_served_one_after_the_other_and_a_full_queue_gets_429(served: Served) -> None:
    n_before = len(served.service.records)
    start = threading.Barrier(2)
    results: list = []

    def client_thread() -> None:
        start.wait()
        results.append(ask(served.client(), served.model, max_tokens=12))

    threads = [threading.Thread(target=client_thread) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert [r.usage.completion_tokens for r in results] == [12, 12]
    a, b = sorted(list(served.service.records)[n_before:], key=lambda r: r.started_at)
    assert a.ended_at <= b.started_at and b.queued_s > 0  # the second waited for the first

    # max_queue=1: one request runs, one waits, a third is refused with Retry-After
    with long_stream(served.client(), served.model) as running:
        next(iter(running))
        waiting = threading.Thread(target=lambda: results.append(ask(served.client(), served.model, max_tokens=4)))
        waiting.start()
        wait_for(lambda: served.service.pending == 2)
        with pytest.raises(openai.RateLimitError) as refused:
            ask(served.client(), served.model, max_tokens=4)
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert refused.value.body["code"] == "queue_full"
    waiting.join(WAIT_S)
    assert results[-1].usage.completion_tokens == 4


def test_bad_requests_get_a_4xx_with_an_error_body(served: Served) -> None:
    m = served.model
    msg = [{"role": "user", "content": "hi"}]
    cases = [
        (b'{"model": ', 400, "invalid_json"),
        (json.dumps({"model": m, "messages": msg, "max_tokens": "3"}), 400, "max_tokens"),
        (json.dumps({"model": m, "messages": msg, "temperature": "hot"}), 400, "temperature"),
        (json.dumps({"model": m, "messages": msg, "frobnicate": 1}), 400, "unknown_field"),
        (json.dumps({"model": m, "messages": msg, "max_tokens": N_CTX + 1}), 400, "max_tokens"),
        (json.dumps({"model": m, "messages": msg, "n": 2}), 400, "n"),
        (json.dumps({"model": m, "messages": []}), 400, "messages"),
        (json.dumps({"model": m, "messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages"),
        (json.dumps({"model": m}), 400, "missing_field"),
        (json.dumps([1, 2]), 400, None),
        (json.dumps({"model": m, "messages": msg, "max_tokens": N_CTX}), 400, "context_length_exceeded"),
        (b"x" * (2 << 20), 413, "body_too_large"),
        # values a client may send that this server cannot honour: a 400 naming the field
        (json.dumps({"model": m, "messages": msg, "modalities": ["text", "audio"]}), 400, "modalities"),
        (json.dumps({"model": m, "messages": msg, "audio": {"voice": "alloy", "format": "wav"}}), 400, "modalities"),
        (json.dumps({"model": m, "messages": msg, "typical_p": 0.5}), 400, "typical_p"),
        (json.dumps({"model": m, "messages": msg, "web_search_options": {}}), 400, "web_search_options"),
        (json.dumps({"model": m, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}), 400, "messages"),
        (json.dumps({"model": m, "messages": msg, "presence_penalty": 2.5}), 400, "presence_penalty"),
        (json.dumps({"model": m, "messages": msg, "logit_bias": {"x": 1}}), 400, "logit_bias"),
        (json.dumps({"model": m, "messages": msg, "logit_bias": {"999999999": 1}}), 400, "logit_bias"),
        (json.dumps({"model": m, "messages": msg, "top_logprobs": 21}), 400, "top_logprobs"),
        (json.dumps({"model": m, "messages": msg, "grammar": "root ::= nothing"}), 400, "grammar"),
        (json.dumps({"model": m, "messages": msg, "grammar": "root ::= " + "(" * 200 + '"a"' + ")" * 200}), 400,
         "grammar"),
        (json.dumps({"model": m, "messages": msg, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "https://example.com/schema.json"}}}}), 400, "response_format"),
        (json.dumps({"model": m, "messages": msg, "response_format": {"type": "yaml"}}), 400, "response_format"),
        (json.dumps({"model": m, "messages": msg, "response_format": {"type": "json_object"},
                     "grammar": 'root ::= "a"'}), 400, "response_format"),
        (json.dumps({"model": m, "prompt": "x", "echo": True}), 400, "echo"),
    ]
    for body, status, what in cases:
        path = "/v1/completions" if isinstance(body, str) and '"prompt"' in body else "/v1/chat/completions"
        got, _, raw = served.raw("POST", path, body if isinstance(body, bytes) else body.encode())
        err = json.loads(raw)["error"]
        assert got == status, (body[:80], raw)
        assert err["message"] and b"Traceback" not in raw
        assert what is None or what in (err["code"], err["param"]), (what, err)
    got, _, raw = served.raw("POST", "/v1/chat/completions", json.dumps({"model": m, "messages": msg}).encode(),
                             {"Content-Type": "text/plain"})  # a web page's simple request
    assert got == 415 and json.loads(raw)["error"]["code"] == "unsupported_media_type"
    for method, path, status in (("GET", "/v1/nope", 404), ("GET", "/v1/chat/completions", 405)):
        got, _, raw = served.raw(method, path)
        assert got == status and json.loads(raw)["error"]["message"]
    got, _, raw = served.raw("GET", "/health", headers={"Host": "evil.example:8080"})  # DNS rebinding
    assert got == 400 and json.loads(raw)["error"]["code"] == "bad_host"
    assert served.service.pending == 0


def test_the_api_key_is_enforced(served: Served) -> None:
    with pytest.raises(openai.AuthenticationError):
        served.client(key="wrong").models.list()
    for key in (None, "wrong"):
        got, _, raw = served.raw("POST", "/v1/completions", b"{}", key=key)
        assert got == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"


def test_a_public_bind_needs_a_key(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2  # refused before any model loads
    assert "without an API key" in capsys.readouterr().err
    with pytest.raises(ServerConfigError):
        ServerConfig(host="192.168.1.5").validate()
    ServerConfig(host="0.0.0.0", api_key="k").validate()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    with pytest.raises(ServerConfigError, match="name the origin"):
        ServerConfig(cors=["*"]).validate()


def test_the_serve_command(served: Served) -> None:  # noqa: ARG001 - after the fixture: its calibration is cached
    """`flashdesk serve` as a user runs it: a free port, the bundled pair, Ctrl-C stops it."""
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", "0", "--threads", "1", "--ctx", str(N_CTX),
           "--api-key", KEY]
    # SIGINT as a terminal leaves it: a test run started in the background (bash without job control)
    # inherits SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        def url() -> str | None:
            found = [m.group(1) for line in list(lines) if (m := re.search(r"on (http://\S+)/v1", line))]
            return found[0] if found else None

        wait_for(lambda: url() is not None or proc.poll() is not None, timeout=300)
        assert url(), lines
        client = openai.OpenAI(base_url=f"{url()}/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)
        model = client.models.list().data[0].id
        done = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=4, temperature=0)
        assert done.usage.completion_tokens == 4 and done.timings["predicted_n"] == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130  # a clean stop by Ctrl-C (uvicorn passes the signal on, main says 130)
        reader.join(10)
        log = "".join(lines)
        assert "completion: " in log and "tok/s" in log and "tau" in log  # the request's log line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_bench_on_a_tiny_run(capsys: pytest.CaptureFixture) -> None:
    """The measurement the owner runs on a quiet machine, here only as small as it gets."""
    assert main(["serve-bench", "--threads", "1", "--ctx", str(N_CTX), "--max-tokens", "8", "--repeats", "2",
                 "--warmup", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["draft_mode"] == SERVED_MODE and out["run"]["git_commit"]
    assert sorted(r["arm"] for r in out["runs"]) == sorted(
        ["direct", "server", "server-stream", "server-penalties", "direct-again"] * 2)
    s = out["summary"]
    for arm in ("server", "server-stream", "server-penalties", "direct-again"):
        assert s[arm]["tokens_per_s"] > 0 and s[arm]["vs_direct"] > 0 and s[arm]["ttft_ms"] > 0
    assert s["noise_band"] == s["direct-again"]["vs_direct_p10_p90"]
    assert "stream_overhead_ms_per_chunk" in s and s["stream_chunks"] > 0
    assert s["same_text"]  # greedy: every arm wrote the same reply


# --- what ordinary clients send (issue 32) ---------------------------------------------------


def test_every_openai_field_at_its_default_is_accepted_and_changes_nothing(served: Served) -> None:
    client = served.client()
    plain = ask(client, served.model, max_tokens=12)
    full = client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_completion_tokens=12,
        frequency_penalty=0, presence_penalty=0, logit_bias={}, logprobs=False, top_logprobs=0, n=1, seed=7,
        response_format={"type": "text"}, tools=[], tool_choice="none", parallel_tool_calls=True, stop=None,
        store=False, metadata={"app": "test"}, service_tier="auto", user="u1", modalities=["text"], top_p=1,
        prediction={"type": "content", "content": "Paris"}, reasoning_effort="low", verbosity="medium",
        safety_identifier="s1", prompt_cache_key="k1", prompt_cache_retention="in_memory",
        prompt_cache_options={"ttl": "5m"},
        extra_body={"repeat_penalty": 1.0, "repeat_last_n": 64, "top_k": 40, "min_p": 0.0, "typical_p": 1.0,
                    "n_probs": 0, "cache_prompt": True, "grammar": None})
    assert full.choices[0].message.content == plain.choices[0].message.content
    assert full.choices[0].logprobs is None
    done = client.completions.create(model=served.model, prompt="def add(a, b):", max_tokens=8, temperature=0,
                                     best_of=1, echo=False, frequency_penalty=0, presence_penalty=0, logit_bias={},
                                     n=1, suffix=None, user="u1", seed=3, top_p=1, stop=None,
                                     extra_body={"repeat_penalty": 1.0, "top_k": 40, "min_p": 0.0})
    again = client.completions.create(model=served.model, prompt="def add(a, b):", max_tokens=8, temperature=0)
    assert done.choices[0].text == again.choices[0].text and done.usage.completion_tokens == 8


def test_any_model_name_is_served_by_the_one_model(served: Served) -> None:
    client = served.client()
    reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2, temperature=0)
    assert reply.model == served.model  # the reply names the model that wrote it
    chunks = list(client.completions.create(model="llama3:8b", prompt="a", max_tokens=2, stream=True))
    assert {c.model for c in chunks} == {served.model}
    assert client.models.retrieve("gpt-4o").id == served.model
    # where a name picks among several models, an unknown one is still a 404
    assert resolve_model("b", ["a", "b"]) == "b" and resolve_model("x", ["a"]) == "a"
    with pytest.raises(ApiError) as e:
        resolve_model("gpt-4o", ["a", "b"])
    assert e.value.status == 404 and e.value.code == "model_not_found"


def test_hostile_bodies_get_a_4xx_never_a_500_or_a_reset(served: Served) -> None:
    deep = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    got, _, raw = served.raw("POST", "/v1/chat/completions", deep)
    assert got == 400 and json.loads(raw)["error"]["code"] == "too_deep"
    nested_schema: dict = {"type": "object"}
    for _ in range(70):
        nested_schema = {"type": "object", "properties": {"a": nested_schema}}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": nested_schema}}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": fmt})
    got, _, raw = served.raw("POST", "/v1/chat/completions", body.encode())
    assert got == 400 and json.loads(raw)["error"]["code"] == "too_deep"
    big = b'{"model": "m", "prompt": "' + b"a" * (50 << 20) + b'"}'  # 50 MB: read through, then refused
    got, _, raw = served.raw("POST", "/v1/completions", big)
    assert got == 413 and json.loads(raw)["error"]["code"] == "body_too_large"
    with pytest.raises(openai.APIStatusError) as e:  # the same through a real client
        served.client().completions.create(model="m", prompt="a" * (50 << 20), max_tokens=1)
    assert e.value.status_code == 413
    assert ask(served.client(), served.model, max_tokens=2).usage.completion_tokens == 2


def test_tools_are_refused_clearly_for_a_model_without_them(served: Served) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        ask(served.client(), served.model, max_tokens=4, tools=[tool], tool_choice="auto")
    assert e.value.body["param"] == "tools" and "chat template" in e.value.body["message"]


PENALTIES = {"frequency_penalty": 1.0, "presence_penalty": 0.5}


def test_penalties_are_applied_and_speculation_keeps_them_lossless(served: Served, checker: Engine) -> None:
    client = served.client()
    messages = [{"role": "user", "content": "Count from 1 to 30, separated by commas."}]
    kw = {"max_tokens": 48, "extra_body": {"return_tokens": True, "repeat_penalty": 1.2}}
    free = ask(client, served.model, messages, **kw).choices[0]
    pen = ask(client, served.model, messages, **PENALTIES, **kw)
    assert pen.choices[0].message.content != free.message.content  # applied
    streamed = list(ask(client, served.model, messages, stream=True, **PENALTIES, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == pen.choices[0].message.content
    prompt = chat_prompt(checker, [ChatMessage("user", messages[0]["content"])])
    params = GenerationParams(repeat_penalty=1.2, **PENALTIES)
    for tokens in (pen.choices[0].tokens, streamed[-1].choices[0].tokens):
        rep = check_lossless(checker, prompt, tokens, params=params)
        assert rep.lossless, rep.hard_mismatches
    assert pen.timings["draft_n_accepted"] > 0  # and drafts were verified under them


def test_logprobs_whole_and_streamed_agree_and_are_the_targets(served: Served, checker: Engine) -> None:
    client = served.client()
    whole = ask(client, served.model, max_tokens=16, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(x.top_logprobs) == 3 for x in content)
    assert "".join(x.token for x in content).startswith(whole.choices[0].message.content)
    assert all(x.top_logprobs[0].token == x.token for x in content)  # greedy: the most likely token
    chunks = list(ask(client, served.model, max_tokens=16, logprobs=True, top_logprobs=3, stream=True))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    assert [x.token for x in streamed] == [x.token for x in content]
    assert [x.logprob for x in streamed] == pytest.approx([x.logprob for x in content], abs=1e-3)
    # the plain target alone (another engine: its prompt read in one batch, not from the server's
    # cache of earlier turns, which rounds a little differently) gives the same tokens and numbers
    prompt = chat_prompt(checker, [ChatMessage("user", QUESTION)])
    events = list(checker.generate(prompt, GenerationParams(max_tokens=len(content), logprobs=3)))
    plain = [lp for ev in events for lp in ev.logprobs][:len(content)]
    assert [checker.target.token_to_piece(x.token).decode() for x in plain] == [x.token for x in content]
    assert [x.logprob for x in plain] == pytest.approx([x.logprob for x in content], abs=0.1)

    done = client.completions.create(model=served.model, prompt="def add(a, b):", max_tokens=8, temperature=0,
                                     logprobs=2)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == done.choices[0].text and lp.text_offset[0] == 0
    parts = list(client.completions.create(model=served.model, prompt="def add(a, b):", max_tokens=8,
                                           temperature=0, logprobs=2, stream=True))
    got = [p.choices[0].logprobs for p in parts if p.choices and p.choices[0].logprobs]
    assert [t for g in got for t in g.tokens] == lp.tokens
    assert [o for g in got for o in g.text_offset] == lp.text_offset


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "city": {"enum": ["Paris", "Rome", "Berlin"]}}}
FLAGS = {"type": "object", "required": ["ok", "tags"],
         "properties": {"ok": {"type": "boolean"},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}}}


def matches(value: object, schema: dict) -> bool:
    """The part of JSON Schema these tests use."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", []))
                and (schema.get("additionalProperties", True) or set(value) <= set(props))
                and all(matches(v, props[k]) for k, v in value.items() if k in props))
    if kind == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", len(value))
                and all(matches(v, schema["items"]) for v in value))
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    return kind == "boolean" and isinstance(value, bool)


def test_json_schema_replies_always_parse_and_match(served: Served) -> None:
    client = served.client()
    asks = [("Describe a person who lives in Europe.", PERSON), ("Is the sky blue? Add a few tags.", FLAGS)]
    for question, schema in asks:
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
        messages = [{"role": "user", "content": question}]
        whole = ask(client, served.model, messages, max_tokens=200, response_format=fmt)
        text = whole.choices[0].message.content
        assert matches(json.loads(text), schema), text
        chunks = list(ask(client, served.model, messages, max_tokens=200, response_format=fmt, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        for seed in range(3):  # sampled replies follow it too
            sampled = client.chat.completions.create(model=served.model, messages=messages, max_tokens=200,
                                                     temperature=1.0, seed=seed, response_format=fmt)
            assert matches(json.loads(sampled.choices[0].message.content), schema), sampled.choices[0].message
    obj = ask(client, served.model, [{"role": "user", "content": "Give a JSON object with a key 'a' set to 1."}],
              max_tokens=200, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


# --- tools (issue 32, e): Hermes/Qwen <tool_call> through a tool-capable chat template ---------------

# Qwen 2.5's chat template as its GGUFs carry it: tools listed in the system turn, calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>, results in <tool_response> blocks
QWEN_TEMPLATE = (Path(__file__).parent / "qwen25_tool_template.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 20}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                          "parameters": {"type": "object", "properties": {},
                                                         "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_served(tmp_path_factory: pytest.TempPathFactory):
    """The bundled target with Qwen 2.5's tool-capable template in its GGUF (a copy), served on
    loopback with lookup drafts (speculation under the tool-call grammar)."""
    path = copy_gguf(default_target(), tmp_path_factory.mktemp("tools") / "gemma-qwen-template.gguf",
                     meta={"tokenizer.chat_template": QWEN_TEMPLATE})
    engine = Engine(path, None, EngineConfig(n_ctx=N_CTX, n_threads=1))
    model = ServedModel.for_engine(engine, policy_for_mode(engine, "lookup"))
    executor = ThreadExecutor(model)
    server = BackgroundServer(executor, ServerConfig(port=0, api_key=KEY, max_queue=1, max_tokens=N_CTX))
    yield Served(server, model.name), engine
    server.stop()
    executor.close()
    engine.close()


def rendered(engine: Engine, messages: list[ChatMessage], tools: list[dict] | None) -> str:
    return prompt_format_of(engine.target).render(messages, tools=tools)


def streamed_calls(chunks: list) -> tuple[str, list[dict]]:
    """A stream's content and its tool calls, put together by index as OpenAI's clients do."""
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += d.id or ""
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), [calls[i] for i in sorted(calls)]


def test_tools_reach_the_template_and_a_required_call_comes_back_in_openai_shape(tool_served) -> None:
    served, engine = tool_served
    client = served.client()
    # one call: after it the grammar leaves the model nothing but its end, so the reply is whole
    one = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    whole = ask(client, served.model, WEATHER_Q, max_tokens=64, **one)
    question = [ChatMessage("user", WEATHER_Q[0]["content"])]
    prompt = rendered(engine, question, TOOLS)
    assert "The weather in a city now." in prompt and whole.usage.prompt_tokens == len(engine.tokenize(prompt))
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict) and (call.function.name != "get_weather" or isinstance(args["city"], str))
    assert len(choice.message.tool_calls) == 1

    chunks = list(ask(client, served.model, WEATHER_Q, max_tokens=64, stream=True, **one))
    content, calls = streamed_calls(chunks)
    assert content == "" and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls]  # greedy: the same
    assert all(c["id"].startswith("call_") for c in calls)

    named = ask(client, served.model, WEATHER_Q, max_tokens=64, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [t.function.name for t in named.choices[0].message.tool_calls] == ["get_time"]
    # parallel calls (OpenAI's default): this small model goes on calling until max_tokens cuts it;
    # the whole calls come back, and a cut reply is "length", never "tool_calls"
    many = ask(client, served.model, WEATHER_Q, max_tokens=48, tools=TOOLS, tool_choice="required")
    names = [t.function.name for t in many.choices[0].message.tool_calls or []]
    assert names and set(names) <= {"get_weather", "get_time"}
    cut = many.usage.completion_tokens == 48
    assert many.choices[0].finish_reason == ("length" if cut else "tool_calls"), many
    # tool_choice "none": the model is not told of the tools, and its reply is text
    plain = ask(client, served.model, WEATHER_Q, max_tokens=4, tools=TOOLS, tool_choice="none")
    assert plain.usage.prompt_tokens == len(engine.tokenize(rendered(engine, question, None)))
    assert plain.choices[0].message.tool_calls is None


# a reply with text before its call, forced by a grammar, read with tool_choice "auto"
SAID_CALL = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_call_after_text_is_parsed_whole_and_held_back_from_the_stream(tool_served) -> None:
    served, _ = tool_served
    client = served.client()
    gbnf = "root ::= " + json.dumps(SAID_CALL)
    whole = ask(client, served.model, WEATHER_Q, max_tokens=64, tools=TOOLS, extra_body={"grammar": gbnf})
    msg = whole.choices[0].message
    assert msg.content == "Let me check." and whole.choices[0].finish_reason == "tool_calls"
    assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    chunks = list(ask(client, served.model, WEATHER_Q, max_tokens=64, tools=TOOLS, stream=True,
                      extra_body={"grammar": gbnf}))
    content, calls = streamed_calls(chunks)
    assert content.strip() == "Let me check." and "<tool_call>" not in content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # without tools the same text is content
    bare = ask(client, served.model, WEATHER_Q, max_tokens=64, extra_body={"grammar": gbnf})
    assert bare.choices[0].message.content == SAID_CALL and bare.choices[0].finish_reason == "stop"


def test_a_tool_result_turn_is_rendered_and_answered(tool_served) -> None:
    served, engine = tool_served
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turns = WEATHER_Q + [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    reply = ask(served.client(), served.model, turns, max_tokens=8, tools=TOOLS)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = rendered(engine, [ChatMessage("user", WEATHER_Q[0]["content"]),
                               ChatMessage("assistant", "", [{"id": "call_1", "type": "function", "function": {
                                   "name": "get_weather", "arguments": {"city": "Paris"}}}]),
                               ChatMessage("tool", "Sunny, 21 C", tool_call_id="call_1")], TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nSunny, 21 C\n</tool_response>" in prompt
    assert reply.usage.prompt_tokens == len(engine.tokenize(prompt))


def test_tool_requests_that_cannot_be_honoured_get_a_400(served: Served, tool_served) -> None:
    tsrv, _ = tool_served
    msg = [{"role": "user", "content": "hi"}]
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name<|im_end|>"}}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"messages": msg + [{"role": "assistant", "tool_calls": [call]}]}, "messages"),
    ]
    for extra, param in cases:
        body = {"model": tsrv.model, "messages": msg} | extra
        got, _, raw = tsrv.raw("POST", "/v1/chat/completions", json.dumps(body).encode())
        assert got == 400 and json.loads(raw)["error"]["param"] == param, (extra, raw)
    # the bundled model has no template: a tool result is refused as tools are
    turns = msg + [{"role": "tool", "tool_call_id": "c", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as e:
        ask(served.client(), served.model, turns, max_tokens=4)
    assert e.value.body["param"] == "messages" and "chat template" in e.value.body["message"]


# --- LangChain (issue 32, point 7): a widely used client, with whatever defaults it sends -----------


def test_langchain_chat_openai_invokes_and_streams(served: Served, tool_served) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{served.url}/v1", api_key=KEY, model="anything", max_tokens=8, max_retries=0,
                     timeout=WAIT_S)
    print("langchain sends:", llm._get_request_payload([("user", QUESTION)]))  # noqa: T201 - for the log
    answer = llm.invoke(QUESTION)
    assert answer.content and answer.response_metadata["model_name"] == served.model
    parts = list(llm.stream(QUESTION))
    assert "".join(p.content for p in parts) and len(parts) > 1
    tsrv, _ = tool_served
    tool_llm = ChatOpenAI(base_url=f"{tsrv.url}/v1", api_key=KEY, model="anything", max_tokens=64, max_retries=0,
                          timeout=WAIT_S, temperature=0).bind_tools([WEATHER], tool_choice="required",
                                                                   parallel_tool_calls=False)
    called = tool_llm.invoke("What is the weather in Paris?")
    assert [c["name"] for c in called.tool_calls] == ["get_weather"] and isinstance(called.tool_calls[0]["args"], dict)

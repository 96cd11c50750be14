"""`flashdesk serve`: the OpenAI-compatible local server on one pair; `flashdesk serve-bench`: what it costs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from app.cli.common import add_model_args, open_engine
from app.engine.controller import policy_for_mode
from app.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig
from app.server.service import SERVED_MODE, GenerationService, RequestRecord, ServedModel, ThreadExecutor

KEY_ENV = "FLASHDESK_API_KEY"


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible server on 127.0.0.1 (bundled pair by default)")
    add_model_args(s)
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}; any other "
                                                         f"needs --api-key)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free port")
    s.add_argument("--api-key", default=os.environ.get(KEY_ENV) or None,
                   help=f"clients must send Authorization: Bearer KEY (default: ${KEY_ENV}, else none)")
    s.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN call the server (repeatable; none by default)")
    defaults = ServerConfig()
    s.add_argument("--max-queue", type=int, default=defaults.max_queue,
                   help=f"requests waiting behind the running one; more get 429 (default {defaults.max_queue})")
    s.add_argument("--max-tokens-limit", type=int, default=defaults.max_tokens,
                   help=f"the most tokens a request may ask for (default {defaults.max_tokens})")
    s.add_argument("--max-body", type=int, default=defaults.max_body_bytes,
                   help=f"the largest request body in bytes (default {defaults.max_body_bytes})")
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("serve-bench", help="tokens/s through the server vs Engine.complete, interleaved (JSON)")
    add_model_args(b)
    b.add_argument("--prompt", default=None, help="default: a request for a short Python function")
    b.add_argument("--raw", action="store_true", help="the prompt as is through /v1/completions (default: a chat "
                                                      "turn through /v1/chat/completions)")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--repeats", type=int, default=5, help="timed rounds over all arms (default 5)")
    b.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    b.add_argument("--json", help="also write the result here")
    b.set_defaults(func=cmd_serve_bench)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.app import create_app  # noqa: PLC0415 - FastAPI and uvicorn load only for this command
    from app.server.runner import bind, serve_forever, url_of  # noqa: PLC0415 - FastAPI loads only here

    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key, cors=list(args.cors),
                          max_body_bytes=args.max_body, max_tokens=args.max_tokens_limit, max_queue=args.max_queue)
    config.validate()  # before anything loads: a public bind without a key never starts
    sock = bind(config.host, config.port)
    try:
        engine = open_engine(args)
        try:
            _log("calibrating the draft controller (cached after the first time)...")
            served = ServedModel.for_engine(engine, policy_for_mode(engine, SERVED_MODE))
            executor = ThreadExecutor(served)
            service = GenerationService(executor, config.max_queue, config.max_tokens)
            service.add_listener(_log_request)
            _log(f"serving {served.name} ({SERVED_MODE}) on {url_of(sock)}/v1"
                 f"{' (API key required)' if config.api_key else ''}; Ctrl-C stops")
            try:
                serve_forever(create_app(service, config), sock)
            finally:
                service.close()
                executor.close()
        finally:
            engine.close()
    finally:
        sock.close()
    return 0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _log_request(r: RequestRecord) -> None:
    """One line per request: when, what, tokens, speed, tau (the Server panel's columns)."""
    when = time.strftime("%H:%M:%S", time.localtime(r.submitted_at))
    what = f"{r.kind}{' stream' if r.stream else ''}"
    if r.error:
        _log(f"{when} {what}: error: {r.error}")
        return
    _log(f"{when} {what}: {r.prompt_tokens} prompt ({r.cached_tokens} cached) + {r.completion_tokens} tokens, "
         f"{r.tokens_per_s:.1f} tok/s, tau {r.tau:.2f}, {r.finish_reason}, queued {r.queued_s:.2f} s")


def cmd_serve_bench(args: argparse.Namespace) -> int:
    from app.server import bench  # noqa: PLC0415 - FastAPI and uvicorn load only for this command

    engine = open_engine(args)
    try:
        result = bench.bench(engine, policy_for_mode(engine, SERVED_MODE), args.prompt or bench.DEFAULT_PROMPT,
                             args.max_tokens, args.repeats, args.warmup, args.raw, log=_log)
        result["target"] = str(engine.target.path)
    finally:
        engine.close()
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0

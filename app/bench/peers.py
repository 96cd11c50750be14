"""Peers in `flashdesk bench`: the speculative loops a FlashDesk user could pick instead.

Two families, measured on the same prompts in the same run as our modes:

- llama.cpp's own `llama-server` (built from the same patched tree as our
  libraries by native.server, on the first bench that needs it), driven over
  HTTP on loopback: the same GGUFs, threads, context and batch size, one
  slot, greedy (`temperature` 0), the same max tokens and stop strings, the
  prompt as a raw completion (`/completion`, `cache_prompt` false). The
  prompt goes as the token ids our engine made of the rendered prompt text,
  so both sides decode the identical prompt (text would be re-tokenized with
  the server's own special-token parsing). One server per mode, started and
  warmed up before the first prompt, stopped at the end of the bench.
  tokens/s is TOKENS_PER_S, from the server's `timings.predicted_n` and
  `predicted_ms` (ours on the same clock: app.bench.runner.on_one_clock);
  wall-clock tokens/s (the HTTP round trip, prompt processing included) sits
  next to it; acceptance comes from `timings.draft_n` / `draft_n_accepted`.
- llama-cpp-python's `LlamaPromptLookupDecoding` through `llama_cpp.Llama`,
  in this process, on the same patched libraries (native.lib loads them before
  llama_cpp is imported: the one library FlashDesk uses).

Mode names (comma-separated in `--mode`; `@K` sets the draft length):

    upstream-plain                      the server without speculation
    upstream-dflash[@K]                 --spec-type draft-dflash, our DFlash v1 or DFlash2 drafter (default
                                        --spec-draft-n-max 3; llama.cpp walks a DFlash2 file's selector)
    upstream-dspark[@K]                 --spec-type draft-dspark, our DSpark drafter (--drafter)
    upstream-draft[@K]                  --spec-type draft-simple, our classic draft model (--draft-model)
    upstream-mtp[@K]                    --spec-type draft-mtp: the target's own MTP heads (Qwen3.5/3.6)
    upstream-eagle3[@K]                 --spec-type draft-eagle3, our EAGLE-3 drafter (--drafter)
    upstream-lookup[:TYPE][@K]          n-gram speculation; TYPE one of LOOKUP_TYPES (default ngram-mod)
    upstream-chain[:T1+T2...][@K]       chained types, the first that drafts wins
                                        (default ngram-simple+draft-dflash)
    llama-cpp-python-lookup[@K]         LlamaPromptLookupDecoding(num_pred_tokens=K), default 10

@K maps to each type's own length knob (PeerSpec.server_args); ngram-cache has
none on this tree (fixed at 8). A type that reads the drafter file takes only the formats of
DRAFT_FILE_FORMATS (gguf_tools.formats, by the file's header): llama-server itself would run
draft-dflash on a DSpark file (v1's block layout, not anchor-first) or draft-dspark on a DFlash2 one,
so the peer refuses them before a server starts (check_draft_file).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.engine.text_stream import TextStream
from app.errors import DraftFormatMismatch
from gguf_tools.formats import DFLASH2, DFLASH_V1, DSPARK, EAGLE3, LABELS, draft_format, mtp_layers
from gguf_tools.reader import read_gguf
from native import server as native_server

if TYPE_CHECKING:
    from app.engine.dflash import Engine

# --spec-type values of this llama.cpp tree (common/speculative.cpp)
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
              "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
LOOKUP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# best n-gram type on this tree, measured by hand (issue 18: 12 HumanEval prompts, 128 tokens,
# 2 threads): ngram-mod 0.94x of the server's plain decoding, ngram-simple 0.82x, ngram-cache 0.65x
DEFAULT_LOOKUP = "ngram-mod"
DEFAULT_CHAIN = ("ngram-simple", "draft-dflash")  # the best chain by the same measurement (0.74x)
DEFAULT_PY_LOOKUP_K = 10  # LlamaPromptLookupDecoding's num_pred_tokens default
DEFAULT_DFLASH_K = 3  # common_params_speculative_draft.n_max

# One clock for ours and every peer (the bench JSON says it as `tokens_per_s_definition`): the tokens
# after the first step over the time after it. A peer's first step is its prompt's pass, which makes
# token 1; ours is the decode loop's first step, which decodes the prompt's last token (and indexes
# the prompt for the lookup) and makes token 1 and any drafts accepted with it. Ours counted whole
# (n / the loop's time) against the server's (n - 1) / predicted_ms read 6% low on 13-token replies.
TOKENS_PER_S = ("tokens after the first step / the time after it: ours (n - the first step's tokens) / "
                "(decode loop time - the first step's time); llama-server (predicted_n - 1) / predicted_ms; "
                "llama-cpp-python (n - 1) / the time after the first token")


def after_first_step(n: int, n_first: int, seconds_after: float) -> float:
    """TOKENS_PER_S: the tokens after the first step's n_first over the time after it (0: none)."""
    return round((n - n_first) / seconds_after, 3) if n > n_first and seconds_after > 0 else 0.0

SERVER_FAMILIES = ("upstream-plain", "upstream-dflash", "upstream-dspark", "upstream-lookup", "upstream-chain",
                   "upstream-draft", "upstream-mtp", "upstream-eagle3")
PY_LOOKUP = "llama-cpp-python-lookup"
FAMILIES = (*SERVER_FAMILIES, PY_LOOKUP)
# our modes a peer is compared with, first found (hybrid drafts from both sources, as a chain does)
OURS_PREFERENCE = ("hybrid", "adaptive-conf", "adaptive", "lookup", "fixed", "dflash2", "dspark", "draft-model")
# the types that read the server's one draft file (-md; the draft model's for draft-simple)
FILE_TYPES = ("draft-simple", "draft-dflash", "draft-dspark", "draft-eagle3")
# the drafter formats each such type runs as its graph expects (draft-simple: the draft model, pair-checked at load)
DRAFT_FILE_FORMATS = {"draft-dflash": (DFLASH_V1, DFLASH2), "draft-dspark": (DSPARK,), "draft-eagle3": (EAGLE3,)}
# the peer that runs a drafter of each format
PEER_OF_FORMAT = {DFLASH_V1: "upstream-dflash", DFLASH2: "upstream-dflash", DSPARK: "upstream-dspark",
                  EAGLE3: "upstream-eagle3"}

START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class PeerSpec:
    mode: str
    family: str
    spec_types: tuple[str, ...] = ()
    k: int | None = None

    @property
    def needs_drafter(self) -> bool:
        """A DFlash-family drafter (the DFlash source's file): draft-dflash or draft-dspark."""
        return "draft-dflash" in self.spec_types or "draft-dspark" in self.spec_types

    @property
    def needs_eagle3(self) -> bool:
        return "draft-eagle3" in self.spec_types

    @property
    def needs_draft_model(self) -> bool:
        return "draft-simple" in self.spec_types

    @property
    def needs_mtp_heads(self) -> bool:
        return "draft-mtp" in self.spec_types

    @property
    def on_server(self) -> bool:
        return self.family in SERVER_FAMILIES

    def spec_args(self) -> list[str]:
        """llama-server's speculation flags for this mode (the drafter's path comes separately)."""
        if not self.spec_types:
            return []
        args = ["--spec-type", ",".join(self.spec_types)]
        if self.k is None:
            return args
        for t in self.spec_types:
            if t in ("draft-dflash", "draft-dspark", "draft-simple", "draft-mtp", "draft-eagle3"):  # params.draft.n_max
                args += ["--spec-draft-n-max", str(self.k)]
            elif t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
                args += [f"--spec-{t}-size-m", str(self.k)]
            elif t == "ngram-mod":  # its default drafts 48..64 tokens: keep n_min/n_max at 3/4
                args += ["--spec-ngram-mod-n-max", str(self.k), "--spec-ngram-mod-n-min", str(max(1, self.k * 3 // 4))]
        return args


def parse_mode(mode: str) -> PeerSpec | None:
    """The peer a mode name means; None for a mode that is not a peer (ours). A peer name that
    does not parse raises ValueError."""
    name, _, k_text = mode.partition("@")
    family, _, types_text = name.partition(":")
    if family not in FAMILIES:
        return None
    k = None
    if k_text:
        if not k_text.isdigit() or not 1 <= int(k_text) <= 256:
            raise ValueError(f"{mode!r}: the draft length after '@' must be a whole number 1..256")
        k = int(k_text)
    types = tuple(t for t in types_text.split("+") if t) if types_text else ()
    bad = [t for t in types if t not in SPEC_TYPES or t == "none"]
    if bad:
        raise ValueError(f"{mode!r}: unknown --spec-type {', '.join(bad)}; this llama.cpp has "
                         f"{', '.join(SPEC_TYPES[1:])}")
    if family == "upstream-plain":
        if types or k is not None:
            raise ValueError(f"{mode!r}: upstream-plain takes no type or draft length")
        return PeerSpec(mode, family)
    if family == "upstream-dflash":
        if types:
            raise ValueError(f"{mode!r}: upstream-dflash takes no type (it is draft-dflash)")
        return PeerSpec(mode, family, ("draft-dflash",), k)
    if family == "upstream-dspark":
        if types:
            raise ValueError(f"{mode!r}: upstream-dspark takes no type (it is draft-dspark)")
        return PeerSpec(mode, family, ("draft-dspark",), k)
    if family == "upstream-draft":
        if types:
            raise ValueError(f"{mode!r}: upstream-draft takes no type (it is draft-simple)")
        return PeerSpec(mode, family, ("draft-simple",), k)
    if family == "upstream-mtp":
        if types:
            raise ValueError(f"{mode!r}: upstream-mtp takes no type (it is draft-mtp)")
        return PeerSpec(mode, family, ("draft-mtp",), k)
    if family == "upstream-eagle3":
        if types:
            raise ValueError(f"{mode!r}: upstream-eagle3 takes no type (it is draft-eagle3)")
        return PeerSpec(mode, family, ("draft-eagle3",), k)
    if family == "upstream-lookup":
        types = types or (DEFAULT_LOOKUP,)
        if len(types) != 1 or types[0] not in LOOKUP_TYPES:
            raise ValueError(f"{mode!r}: upstream-lookup takes one of {', '.join(LOOKUP_TYPES)}")
        if k is not None and types[0] == "ngram-cache":
            raise ValueError(f"{mode!r}: ngram-cache has no draft length setting on this tree (fixed at 8)")
        return PeerSpec(mode, family, types, k)
    if family == "upstream-chain":
        types = types or DEFAULT_CHAIN
        if len(types) < 2:
            raise ValueError(f"{mode!r}: a chain needs two or more types, e.g. upstream-chain:ngram-mod+draft-dflash")
        files = [t for t in types if t in FILE_TYPES]
        if len(files) > 1:
            raise ValueError(f"{mode!r}: {' and '.join(files)} each need the server's one draft file (-md)")
        return PeerSpec(mode, family, types, k)
    if types:
        raise ValueError(f"{mode!r}: {PY_LOOKUP} takes no type")
    return PeerSpec(mode, family, (), k if k is not None else DEFAULT_PY_LOOKUP_K)


def is_peer(mode: str) -> bool:
    return parse_mode(mode) is not None


def check_drafter_formats(modes: list[str], drafter: Path | None) -> None:
    """check_draft_file for every peer in `modes` that reads the drafter (the bench calls it before it
    calibrates, so before open_peers starts any server)."""
    for m in modes:
        spec = parse_mode(m)
        if spec is not None and (spec.needs_drafter or spec.needs_eagle3):
            check_draft_file(spec, drafter)


def check_draft_file(spec: PeerSpec, drafter: Path | None) -> None:
    """Raise DraftFormatMismatch, naming the file, where a type of `spec` reads a drafter file of a
    format it does not run (DRAFT_FILE_FORMATS; a missing drafter is ServerPeer's to refuse)."""
    if drafter is None:
        return
    for t in spec.spec_types:
        formats = DRAFT_FILE_FORMATS.get(t)
        if formats is None:
            continue
        fmt = draft_format(read_gguf(drafter))
        if fmt.format not in formats:
            other = PEER_OF_FORMAT.get(fmt.format)
            raise DraftFormatMismatch(
                f"{spec.mode}: {Path(drafter).name} is a {fmt.label} file; {t} runs "
                f"{' and '.join(LABELS[f] for f in formats)} drafters"
                + (f" (use {other})" if other and other != spec.family else ""))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion_request(tokens: list[int], max_tokens: int, stop: list[str]) -> dict:
    """The /completion body: a raw completion of the prompt's token ids, greedy, no prompt cache."""
    return {"prompt": list(tokens), "n_predict": max_tokens, "temperature": 0.0, "cache_prompt": False,
            "stop": list(stop), "return_tokens": True, "stream": False}


def parse_completion(resp: dict, wall_s: float) -> dict:
    """A bench entry from the server's /completion reply: its tokens and text, the server's own
    timings, acceptance from its draft counters. tau (tokens per target pass) is derived as our
    engine counts it: every pass emits its accepted drafts + 1 token, so passes = predicted_n -
    draft_n_accepted. tokens/s is TOKENS_PER_S: predicted_ms starts after the prompt's pass, which
    made the first of the predicted_n tokens (taken from the timings, not from the server's own
    predicted_per_second, whose definition has changed between llama.cpp versions)."""
    t = resp.get("timings") or {}
    tokens = [int(x) for x in resp.get("tokens") or []]
    n_gen = int(t.get("predicted_n", len(tokens)))
    drafted = int(t.get("draft_n", 0))
    accepted = int(t.get("draft_n_accepted", 0))
    steps = max(1, n_gen - accepted) if n_gen else 0
    predicted_ms = float(t.get("predicted_ms", 0.0))
    stop_type = resp.get("stop_type", "")
    return {
        "tokens": tokens, "text": resp.get("content", ""),
        "finish_reason": "length" if stop_type == "limit" else "stop",
        "n_prompt": int(t.get("prompt_n", resp.get("tokens_evaluated", 0))),
        "n_generated": n_gen, "steps": steps, "drafted": drafted, "accepted": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "tau": round(n_gen / steps, 4) if steps else 0.0,
        "tokens_per_s": after_first_step(n_gen, 1, predicted_ms / 1e3),
        "wall_s": round(wall_s, 6),
        "wall_tokens_per_s": round(n_gen / wall_s, 3) if wall_s > 0 else 0.0,
        "timings": t,
    }


class ServerPeer:
    """One llama-server for one mode, on a free loopback port."""

    def __init__(self, spec: PeerSpec, exe: Path, target: Path, drafter: Path | None, n_ctx: int,
                 n_threads: int, n_batch: int, n_gpu_layers: int = 0, draft_model: Path | None = None):
        self.spec = spec
        if (spec.needs_drafter or spec.needs_eagle3) and drafter is None:
            raise ValueError(f"{spec.mode} needs a drafter (--drafter, or the bundled pair)")
        if spec.needs_draft_model and draft_model is None:
            raise ValueError(f"{spec.mode} needs a draft model (--draft-model)")
        if spec.needs_mtp_heads and not mtp_layers(read_gguf(target)):
            raise ValueError(f"{spec.mode} needs a target with MTP heads; {target.name} has none")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix=f"flashdesk-{spec.mode.replace(':', '_')}-", suffix=".log")[1])
        threads = str(n_threads or os.cpu_count() or 2)
        self.args = [str(exe), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port),
                     "-c", str(n_ctx), "-b", str(n_batch), "-ub", str(n_batch), "-np", "1",
                     "-t", threads, "-tb", threads, "-ngl", str(n_gpu_layers), "--no-webui",
                     # our sizes as given (no fitting to free memory), no host-memory prompt cache
                     "-fit", "off", "-cram", "0"]
        if spec.needs_drafter or spec.needs_eagle3 or spec.needs_draft_model:
            self.args += ["-md", str(draft_model if spec.needs_draft_model else drafter), "-td", threads,
                          "-tbd", threads, "-ngld", str(n_gpu_layers)]
        self.args += spec.spec_args()
        self.proc: subprocess.Popen | None = None
        self.spec_log: list[str] = []  # what the server's log said it loaded for speculation (start)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                code, tail = self.proc.returncode, self.log_tail()
                self.close()
                raise RuntimeError(f"{self.spec.mode}: llama-server exited with {code}:\n{tail}\n"
                                   f"(args: {' '.join(self.args)})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.spec_log = self.loaded_lines()
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        tail = self.log_tail()
        self.close()
        raise RuntimeError(f"{self.spec.mode}: llama-server not ready after {timeout_s:.0f} s:\n{tail}")

    def loaded_lines(self) -> list[str]:
        """The log's lines on the draft file and the speculative types the server set up (its type,
        n_max, block size; with `-lv 4` and more, the loader's lines such as DFlash2's selector),
        without the timestamps."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        keep = ("common_speculative", "DFlash", "DSpark")
        return [line.split(" I ", 1)[-1].strip() for line in lines if any(k in line for k in keep)]

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def run(self, tokens: list[int], max_tokens: int, stop: list[str]) -> dict:
        body = json.dumps(completion_request(tokens, max_tokens, stop)).encode()
        req = urllib.request.Request(self.url + "/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                resp = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.spec.mode}: /completion answered {e.code}: "
                               f"{e.read().decode(errors='replace')[:500]}") from None
        entry = parse_completion(resp, time.perf_counter() - t0)
        if not resp.get("tokens") and entry["n_generated"]:
            raise RuntimeError(f"{self.spec.mode}: the server returned no tokens (return_tokens unsupported?)")
        return entry

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log_path.unlink(missing_ok=True)  # its tail went into any error raised


class PythonLookupPeer:
    """llama-cpp-python's LlamaPromptLookupDecoding, as its users get it: `Llama(model_path,
    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=K))` and its `generate` loop (greedy),
    on the patched libraries native.lib loaded. Stop strings end the reply at the token that
    completes one and an end-of-generation token counts, as in our engine (app.engine.text_stream)."""

    def __init__(self, spec: PeerSpec, engine: Engine):
        from native.lib import load  # noqa: PLC0415 - the patched library before llama_cpp's Python API

        load()
        # after load(): llama_cpp's Python API binds the library already loaded, the patched one
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.spec = spec
        self.engine = engine
        cfg = engine.config
        threads = cfg.n_threads or os.cpu_count() or 2
        place = cfg.target_placement
        # as our engine's context: flash attention on (what its "auto" resolves to on these backends),
        # the sliding-window cache at window size (llama.cpp's default context is full-size).
        # logits_all=True as a user must pass it: with a draft_model llama-cpp-python keeps every
        # row's logits but sizes its `scores` buffer from the logits_all argument (n_batch rows when
        # False), so any reply past n_batch tokens of context fails in Llama.eval ("could not
        # broadcast ... into shape (0,)"); the decode itself is unchanged (draft_model already
        # turns logits_all on).
        self.llm = Llama(model_path=str(engine.target.path), n_ctx=engine.n_ctx, n_batch=cfg.n_batch,
                         n_ubatch=cfg.n_batch, n_threads=threads, n_threads_batch=threads,
                         n_gpu_layers=place.n_gpu_layers if place else 0, flash_attn=True, swa_full=False,
                         logits_all=True, verbose=False,
                         draft_model=LlamaPromptLookupDecoding(num_pred_tokens=spec.k or DEFAULT_PY_LOOKUP_K))

    def start(self) -> None:
        pass

    def run(self, tokens: list[int], max_tokens: int, stop: list[str]) -> dict:
        target = self.engine.target
        stream = TextStream(target.token_to_piece, stop)
        out: list[int] = []
        passes: list[int] = []  # tokens in each target pass (Llama.eval) of this reply
        llm = self.llm
        real_eval = type(llm).eval

        def counted_eval(toks: list[int]) -> None:
            passes.append(len(toks))
            real_eval(llm, toks)

        llm.eval = counted_eval  # the instance attribute shadows the method generate() calls
        llm.reset()
        t0 = time.perf_counter()
        t_first = None
        finish = "length"
        gen = llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True)
        try:
            for tok in gen:
                if t_first is None:
                    t_first = time.perf_counter()  # the prompt pass gave the first token
                out.append(int(tok))
                stream.push([int(tok)])
                if target.is_eog(int(tok)) or stream.stopped:
                    finish = "stop"
                    break
                if len(out) >= max_tokens:
                    break
        finally:
            gen.close()
            del llm.eval
        t_end = time.perf_counter()
        text = stream.text if stream.stopped else stream.text + stream.finish()
        n = len(out)
        # the first pass is the prompt (+ nothing drafted); each later one verified [token, drafts...]
        steps = len(passes)
        drafted = sum(k - 1 for k in passes[1:])
        accepted = max(0, n - steps)
        decode_s = t_end - (t_first or t_end)  # TOKENS_PER_S: after the prompt's pass, which made token 1
        return {"tokens": out, "text": text, "finish_reason": finish, "n_prompt": len(tokens), "n_generated": n,
                "steps": steps, "drafted": drafted, "accepted": accepted,
                "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
                "tau": round(n / steps, 4) if steps else 0.0,
                "tokens_per_s": after_first_step(n, 1, decode_s),
                "wall_s": round(t_end - t0, 6),
                "wall_tokens_per_s": round(n / (t_end - t0), 3) if t_end > t0 else 0.0}

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.close()


def open_peers(engine: Engine, modes: list[str], log: Callable[[str], None] | None = None,
               warmup_tokens: int = 8) -> dict[str, ServerPeer | PythonLookupPeer]:
    """Start (and warm up) every peer in `modes`; llama-server is built first if it is not cached."""
    specs = [s for s in (parse_mode(m) for m in modes) if s is not None]
    peers: dict[str, ServerPeer | PythonLookupPeer] = {}
    if not specs:
        return peers
    say = log or (lambda _m: None)
    exe = None
    if any(s.on_server for s in specs):
        exe = native_server.server_path()
        if exe is None:
            say("[peers] llama-server is not built for this tree yet: building it (a few minutes)")
            exe = native_server.build_server()
    place = engine.config.target_placement
    warm = engine.tokenize("the quick brown fox")  # (lowercase: the tests' tiny vocabulary has no capitals)
    try:
        for s in specs:
            if s.on_server:
                assert exe is not None
                p: ServerPeer | PythonLookupPeer = ServerPeer(
                    s, exe, engine.target.path, engine.drafter_path, engine.n_ctx,
                    engine.config.n_threads, engine.config.n_batch, place.n_gpu_layers if place else 0,
                    engine.draft_model.model.path if engine.draft_model else None)
            else:
                p = PythonLookupPeer(s, engine)
            peers[s.mode] = p
            say(f"[peers] starting {s.mode}" + (f": {' '.join(p.args[1:])}" if isinstance(p, ServerPeer) else ""))
            p.start()
            p.run(warm, warmup_tokens, [])
    except BaseException:
        close_peers(peers)
        raise
    return peers


def close_peers(peers: dict) -> None:
    for p in peers.values():
        p.close()


def ours_mode(modes: list[str]) -> str | None:
    return next((m for m in OURS_PREFERENCE if m in modes), None)

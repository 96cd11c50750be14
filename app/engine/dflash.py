"""The DFlash decode loop: a target model, an optional DFlash drafter.

One step (docs/design.md, section 1):
  draft   the drafter decodes [anchor, MASK x k] in one pass; its argmax at
          block positions 1..k are the drafts; the block's K/V is then trimmed
  verify  the target decodes [anchor, d0..d(k-1)] in one pass
  accept  target token i (argmax, or a sample) is emitted; while it equals
          draft i the next is checked; the first mismatch is the correction,
          a full match earns a bonus token
  sync    the target's hidden states of the a+1 verified tokens are injected
          into the drafter; both caches are trimmed to n_past
Invariant before each draft: both caches hold positions 0..n_past-1 (the
drafter's only the last EngineConfig.drafter_window of them, at their true
positions) and the anchor (the last emitted token) is in neither.

The drafts of a step come from the policy's choice (app.engine.draft_policy):
none (plain decoding, k = 0, through the same code) or one of the engine's
draft sources (`self.sources`, app.engine.sources: the context lookup, the
DFlash drafter, a classic draft model), each asked through the same calls
(begin, propose, accepted, trim, reset). The DFlash drafter's features are
fed lazily, before its next pass, whichever source drafted in between.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.draft_policy import (
    DFLASH,
    DRAFT_MODEL,
    EAGLE3,
    LOOKUP,
    LOOKUP_K_MAX,
    MTP,
    PLAIN_STEP,
    Choice,
    DraftPolicy,
    FixedDraftLength,
    StepInfo,
    StepTiming,
)
from app.engine.events import FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, Completion, GenerationEvent
from app.engine.grammar import check_grammar
from app.engine.llama_objects import (
    ContextConfig,
    EmbeddingBatch,
    LlamaContext,
    LlamaGrammar,
    LlamaModel,
    ModelPlacement,
    TokenBatch,
)
from app.engine.lookup import ContextLookup
from app.engine.params import GenerationParams, InvalidParams
from app.engine.sampling import TokenLogprob, TokenSampler, token_logprob
from app.engine.sources import (
    DRAFT_MODEL_K_MAX,
    EAGLE3_K_MAX,
    MTP_K_MAX,
    DFlashSource,
    DraftModelSource,
    DraftSource,
    Eagle3Source,
    LookupSource,
    MtpSource,
)
from app.engine.stats import GenerationStats
from app.engine.text_stream import TextStream
from app.errors import ContextOverflow, GenerationError, ModelLoadError
from gguf_tools.formats import DFLASH2, DFLASH_V1, DSPARK, draft_format, mtp_layers, trained_span
from gguf_tools.formats import EAGLE3 as EAGLE3_FORMAT
from gguf_tools.pair import PairReport, check_pair
from gguf_tools.reader import GGUFInfo, read_gguf
from gguf_tools.validate import read_d2t

# A hook for tests and calibration: given the history (all tokens so far, anchor last) and the
# policy's choice, the tokens to verify instead of that source's own drafts (None: its own).
DraftOverride = Callable[[list[int], Choice], list[int] | None]
# target features queued for the drafter while decoding, at most (bytes): 64 MiB is ~8k rows of
# the bundled pair, ~800 of an 8B target tapped at 5 layers
PENDING_MAX_BYTES = 64 << 20
# the drafter attends to the last this many injected positions (EngineConfig.drafter_window; 0: all of
# them) unless its file says how far it was trained to read (drafter_window_for). 2,048 is DFlash2's
# window (z-lab; SGLang caps its DFlash drafter the same way): drafters are trained on short contexts and
# lose acceptance far past them, while an unbounded drafter pays attention and KV over the whole
# document every pass
DRAFTER_WINDOW = 2048
# cells of the drafter's cache beyond its window: a draft block (block_size rows) or a timed injection
# (Engine.time_injection, calibration's INJECT_ROWS = 64) after a full window; llama.cpp pads to 256 anyway
DRAFTER_SLACK = 256


def drafter_window_for(info: GGUFInfo) -> int:
    """The window a drafter gets unless one is asked for: the span it was trained on, where its file says
    (gguf_tools.formats.trained_span), else DRAFTER_WINDOW. A drafter reads features from farther back
    than it was trained on badly: the bundled one (sequences of at most 544 tokens) drafted the docqa set
    at tau 1.27 with a 2,048 window and 1.44-1.51 with 256-768 (stop 48, fixed k = 3)."""
    return trained_span(info) or DRAFTER_WINDOW


def drafter_context(n_ctx: int, window: int | None) -> int:
    """The drafter's context length under a window: it never holds more than the window and a block, and
    llama.cpp ties no position to a cell (a cell keeps the position it was given; freed cells are
    refilled), so its cache is sized to that, not to the target's n_ctx (the plan prices it the same)."""
    return min(n_ctx, window + DRAFTER_SLACK) if window else n_ctx


# Backend greedy sampling where the target's output layer is on the CPU: off until the host-cost
# bench (python -m app.bench.host_cost: pass_backend beside pass_c) shows it is not slower there
BACKEND_GREEDY_ON_CPU = False
# ... and where it is on a GPU: on. On an H200 (stop 45, docs/bench/gpu-h200/) a pass with the argmax
# in the graph took 1.11 ms at n = 1 and 3.92 ms at n = 16 against 1.25 and 6.72 ms with the logits
# copied out and the argmax in C; plain decoding ran at 800 against 681 tok/s, the hybrid at 1,063
# against 851. It costs a second copy of the logits buffer on the output device, which the memory
# plan prices (app.scheduler.memory.output_work)
BACKEND_GREEDY_ON_GPU = True
# "1" or "0": backend greedy on or off wherever the output layer is (a measurement's A/B)
BACKEND_GREEDY_ENV = "FLASHDESK_BACKEND_GREEDY"


def backend_greedy_on(output_on_gpu: bool) -> bool:
    """Whether the target's greedy picks come from llama.cpp's backend sampler (the argmax in the graph,
    no logits copied out), for an output layer on a GPU or on the CPU."""
    forced = os.environ.get(BACKEND_GREEDY_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return BACKEND_GREEDY_ON_GPU if output_on_gpu else BACKEND_GREEDY_ON_CPU


def backend_greedy_default(model: LlamaModel, placement: ModelPlacement | None) -> bool:
    """Where the output layer is on a GPU (llama.cpp offloads it when n_gpu_layers exceeds the
    layer count, or is -1, and the model has a device to offload to: a CPU-only build given
    n_gpu_layers keeps everything on the CPU) the argmax can run there and n x n_vocab logits stay
    off the PCIe bus."""
    n_gpu = placement.n_gpu_layers if placement is not None else 0
    return backend_greedy_on((n_gpu < 0 or n_gpu > model.n_layer) and bool(model.device_names()))


def max_draft(block_size: int | None) -> int:
    """The longest draft any source makes: a DFlash block's (block_size - 1), a lookup's, a draft
    model's, an MTP head's or EAGLE-3's. (A recurrent target keeps a snapshot for each: the memory plan
    prices as many.)"""
    return max((block_size or 1) - 1, LOOKUP_K_MAX, DRAFT_MODEL_K_MAX, MTP_K_MAX, EAGLE3_K_MAX)


def verify_rows_max(drafter: str | Path | None) -> int:
    """The most tokens one verify decodes: the longest draft (with this drafter's header's block
    size) plus the anchor."""
    return max_draft(int(read_gguf(drafter).get("dflash.block_size", 16)) if drafter is not None else None) + 1


@dataclass
class EngineConfig:
    n_ctx: int = 4096
    n_threads: int = 0
    n_batch: int = 512
    type_k: int | None = None
    type_v: int | None = None
    target_placement: ModelPlacement | None = None
    drafter_placement: ModelPlacement | None = None
    draft_model_placement: ModelPlacement | None = None
    # greedy replies take the verify rows' tokens from llama.cpp's backend sampling (the argmax in the
    # graph, no logits copied out) instead of the argmax in C; None: where the target's output layer
    # is on a GPU (backend_greedy_default)
    backend_greedy: bool | None = None
    drafter_window: int | None = None  # None: the drafter's own (drafter_window_for); 0: unbounded
    # a target carrying MTP (nextn) heads drafts with its own head (one more context, the head's
    # weights loaded); False: the trunk alone
    mtp: bool = True


class Engine:
    """A loaded target (+ drafter) pair and the caches of one conversation."""

    def __init__(self, target: str | Path, drafter: str | Path | None = None,
                 config: EngineConfig | None = None,
                 progress: Callable[[str, float], bool] | None = None,
                 pair: PairReport | None = None, draft_model: str | Path | None = None):
        """`drafter`: a DFlash-family drafter (v1, DFlash2, DSpark: the DFlash source) or an EAGLE-3
        drafter (its own source); `pair`: the pair check of these two files, when the caller already
        made it; `draft_model`: a classic draft model (a GGUF with the target's vocabulary, checked by
        check_draft_model)."""
        cfg = config or EngineConfig()
        self.config = cfg
        if drafter is not None:
            # checked from the headers, before llama.cpp sees either file
            (pair if pair is not None else check_pair(target, drafter)).raise_if_bad()

        def stage(name: str) -> Callable[[float], bool] | None:
            if progress is None:
                return None
            return lambda p: progress(name, p)

        # a target carrying MTP heads drafts with its own head (app.engine.sources.MtpSource); where it
        # cannot, `mtp_unused` says why and the trunk decodes alone
        n_heads = mtp_layers(read_gguf(target))
        self.mtp_unused: str | None = None
        if n_heads and not cfg.mtp:
            self.mtp_unused = "turned off for this load"
        elif n_heads > 1:
            self.mtp_unused = f"it carries {n_heads} chained heads and FlashDesk's loop drives a single head"
        try:
            self.target = LlamaModel(target, cfg.target_placement, stage("target"), with_mtp=self.mtp_unused is None
                                     and n_heads == 1)
        except ModelLoadError:
            if self.mtp_unused is not None or n_heads != 1:
                raise
            self.mtp_unused = "llama.cpp could not load the head (the trunk loaded without it)"
            self.target = LlamaModel(target, cfg.target_placement, stage("target"))
        n_ctx = min(cfg.n_ctx, self.target.n_ctx_train) if self.target.n_ctx_train > 0 else cfg.n_ctx
        # layers on a CUDA device: its steps replay CUDA graphs once a size repeats (calibration.steady_run)
        self.target_on_cuda = any(name.startswith("CUDA") for name in self.target.device_names())
        self.backend_greedy = (backend_greedy_default(self.target, cfg.target_placement)
                               if cfg.backend_greedy is None else cfg.backend_greedy)
        rows = verify_rows_max(drafter)
        self.ctx = LlamaContext(self.target, ContextConfig(
            n_ctx=n_ctx, n_batch=cfg.n_batch, n_ubatch=cfg.n_batch, n_threads=cfg.n_threads,
            type_k=cfg.type_k, type_v=cfg.type_v, backend_greedy_rows=rows if self.backend_greedy else 0,
            n_rs_seq=rows - 1 if self.target.recurrent else 0))
        self.n_ctx = self.ctx.n_ctx
        # a step takes back the drafts the target rejected: a recurrent target (Qwen3.5/3.6, LFM2) does
        # that from one snapshot per draft, which llama.cpp keeps only for the architectures it can roll
        # back; for the others every reply decodes plain, and this says why
        self.speculation_blocked: str | None = None
        if self.target.recurrent and self.ctx.n_rs_seq < rows - 1:
            self.speculation_blocked = (
                f"{Path(target).name}: llama.cpp cannot roll back the recurrent state of architecture "
                f"{self.target.arch}, so drafts cannot be verified; every reply decodes plain")
        self.drafter: LlamaModel | None = None
        self.dctx: LlamaContext | None = None
        self.block_size = 1
        self.drafter_format = DFLASH_V1
        self._anchor_first = False
        self.target_layers: list[int] = []
        # an EAGLE-3 drafter is a source of its own (no DFlash graph: registered with the others)
        eagle3 = drafter if drafter is not None and draft_format(read_gguf(drafter)).format == EAGLE3_FORMAT else None
        if drafter is not None and eagle3 is None:
            self._load_drafter(Path(drafter), cfg, stage("drafter"))
        self._tbatch = TokenBatch(max(cfg.n_batch, self.block_size, LOOKUP_K_MAX + 1, DRAFT_MODEL_K_MAX + 1))
        self.lookup = ContextLookup()  # the n-gram index of the conversation: lookup drafts
        self.sources = self._register_sources(draft_model, eagle3, cfg, stage("draft model"), stage("drafter"))
        # token ids whose K/V sit in the target cache (and features in the drafter's), positions 0..len-1
        self._cached: list[int] = []
        # features not yet fed to the drafter: (first position, rows), contiguous, ending at len(_cached)
        self._pending: list[tuple[int, np.ndarray]] = []
        self._n_pending = 0  # rows in _pending (read every step: kept, not summed)
        self.drafter_window = 0
        self.set_drafter_window(cfg.drafter_window)
        self.warm_up()
        self.injected_rows = 0  # feature rows fed to the drafter since load (what a window saves)

    def warm_up(self) -> None:
        """One pass of each kind a speculative step makes, at its largest size, then empty caches: the
        buffers llama.cpp sized at load are first touched here, not in the first reply. Without it the
        first reply's first DFlash step cost ~1.5x its steady cost (the target's verify of 8 rows 28-35 ms
        against 20-21, the drafter's block 6-7.5 ms against 1.7, its first prompt injection 11-12 ms
        against 6-7; stop 52, scripts/first_reply.py's reply). llama.cpp's tools warm up the same way
        (common_init decodes a short batch and clears the memory before the first request)."""
        self.reset()  # (it forgets the cached conversation: its passes start at position 0)
        n_vocab = self.target.n_vocab
        rows = min(verify_rows_max(self.drafter.path if self.drafter is not None else None), self.n_ctx - 1)
        ids = [(7 + 13 * i) % n_vocab for i in range(rows)]  # the tokens do not change a pass's cost
        self._tbatch.set(ids, 0, True)
        self.ctx.decode(self._tbatch)
        self.ctx.greedy_rows(list(range(rows)))
        if self.dctx is not None:
            self.ctx.taps(rows)
            n_feat = min(self._d_ubatch, self._dctx_cells - self.block_size)
            if n_feat > 0:
                self._inject(np.zeros((n_feat, len(self.target_layers) * self.target.n_embd), dtype=np.float32), 0)
                self._draft(ids[0], n_feat, self.block_size - 1, GenerationStats(block_size=max(self.block_size, 2)))
        self.reset()

    def _load_drafter(self, path: Path, cfg: EngineConfig, progress: Callable[[float], bool] | None) -> None:
        self.drafter = LlamaModel(path, cfg.drafter_placement, progress)
        self.target_layers = self.drafter.target_layers()
        self.block_size = int(self.drafter.meta("dflash.block_size") or 16)
        # which DFlash graph (gguf_tools.formats, the pinned llama.cpp's rules): v1 drafts from its
        # logits at [anchor, mask x k]; DFlash2 from the selector lattice its graph writes as nextn
        # embeddings; DSpark from its logits biased by a Markov head, the anchor's own row drafting
        # first unless its header says otherwise (llama.cpp's draft-dflash / draft-dspark)
        self.drafter_format = draft_format(self.drafter.info).format
        self._anchor_first = (self.drafter_format == DSPARK
                              and (self.drafter.meta("dflash.sample_from_anchor") or "true") == "true")
        self.mask_token = self.drafter.mask_token()
        if self.mask_token < 0:
            raise ModelLoadError(f"{path}: the drafter has no usable mask token")
        # a non-causal drafter must see each block (and each injection chunk) in one ubatch
        self._d_ubatch = max(self.block_size, min(256, cfg.n_batch))
        # the drafter's reduced vocabulary (target ids), if it has one: the drafter then outputs
        # only those logits (not 262k-wide -inf rows) and the readout maps them through d2t in C
        self._d2t = np.ascontiguousarray(self._read_d2t(), dtype=np.int64)
        self._open_drafter_context(drafter_context(self.n_ctx, self._resolve_window(cfg.drafter_window)))
        self.ctx.enable_taps(self.target_layers)
        self._dbatch = TokenBatch(self.block_size)
        self._ebatch = EmbeddingBatch(self._d_ubatch, len(self.target_layers) * self.target.n_embd)
        # features emitted while decoding wait for the next DFlash step (plain and lookup steps then
        # cost no drafter call at all, and a reply that never drafts from DFlash feeds nothing),
        # up to this many rows; a prompt's are fed as it is read (_prefill), a ubatch at a time
        row_bytes = 4 * len(self.target_layers) * self.target.n_embd
        self._pending_cap = max(self._d_ubatch, PENDING_MAX_BYTES // row_bytes)

    def _open_drafter_context(self, n_ctx: int) -> None:
        """(Re)create the drafter's context with n_ctx cells (its cache starts empty)."""
        if self.dctx is not None:
            self.dctx.close()
            self.dctx = None
        causal = (self.drafter.meta("dflash.attention.causal") or "false") == "true"
        self.dctx = LlamaContext(self.drafter, ContextConfig(
            n_ctx=n_ctx, n_batch=self._d_ubatch, n_ubatch=self._d_ubatch, n_threads=self.config.n_threads,
            non_causal=not causal), other=self.ctx)
        self._dctx_cells = n_ctx
        if self.drafter_format == DFLASH2:
            self.dctx.set_dflash2_lattice()
        elif self._d2t.size and self.drafter_format == DFLASH_V1:
            # (DFlash2's selector and DSpark's Markov head read the target-wide logits: never compact)
            self.dctx.set_dflash_compact_logits()

    def _register_sources(self, draft_model: str | Path | None, eagle3: str | Path | None, cfg: EngineConfig,
                          progress: Callable[[float], bool] | None,
                          eagle3_progress: Callable[[float], bool] | None) -> dict[str, DraftSource]:
        """The registry of draft sources, by the name a policy chooses: the one place a source is
        added (its class in app.engine.sources; the loop asks each the same way)."""
        sources: dict[str, DraftSource] = {LOOKUP: LookupSource(self.lookup)}
        if self.dctx is not None:
            sources[DFLASH] = DFlashSource(self)
        if draft_model is not None:
            sources[DRAFT_MODEL] = DraftModelSource(draft_model, self.n_ctx, cfg.n_threads, cfg.n_batch,
                                                    cfg.draft_model_placement, progress)
        if self.target.n_mtp_heads == 1:
            try:
                sources[MTP] = MtpSource(self.ctx, cfg.n_threads, cfg.n_batch)
            except (ModelLoadError, GenerationError) as e:
                self.mtp_unused = f"llama.cpp made no context for the head ({e})"
        if eagle3 is not None:
            sources[EAGLE3] = Eagle3Source(eagle3, self.ctx, cfg.n_threads, cfg.n_batch, cfg.drafter_placement,
                                           eagle3_progress)
        return sources

    # --- public -------------------------------------------------------------
    @property
    def has_drafter(self) -> bool:
        return self.dctx is not None

    @property
    def drafter_path(self) -> Path | None:
        """The drafter file: a DFlash-family drafter's or an EAGLE-3 drafter's."""
        if self.drafter is not None:
            return self.drafter.path
        e3 = self.sources.get(EAGLE3)
        return e3.model.path if e3 is not None else None  # type: ignore[union-attr]

    @property
    def draft_model(self) -> DraftModelSource | None:
        return self.sources.get(DRAFT_MODEL)  # type: ignore[return-value]

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Prompt tokens: special tokens only from a prompt format's markup (LlamaModel.tokenize_prompt);
        a plain str, whoever wrote it, is plain text."""
        return self.target.tokenize_prompt(text, add_special=add_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self.target.detokenize(tokens)

    def reset(self) -> None:
        """Forget the cached conversation (both caches)."""
        self.ctx.clear()
        for s in self.sources.values():
            s.reset()
        self._cached = []

    def _resolve_window(self, window: int | None) -> int:
        """The window asked for (0: unbounded), or the drafter's own for None (drafter_window_for)."""
        if window is not None and window < 0:
            raise ValueError(f"drafter window {window}: expected 0 (unbounded) or a positive count")
        if window is None:
            return drafter_window_for(self.drafter.info) if self.drafter is not None else DRAFTER_WINDOW
        return window

    def set_drafter_window(self, window: int | None) -> None:
        """Let the drafter attend to the last `window` injected positions only (0: all; None: the span
        its file says it was trained on, else DRAFTER_WINDOW). Forgets the cached conversation: the
        drafter's cache is rebuilt under the new bound."""
        window = self._resolve_window(window)
        self.drafter_window = window
        self.reset()
        if self.dctx is not None and drafter_context(self.n_ctx, window) != self._dctx_cells:
            self._open_drafter_context(drafter_context(self.n_ctx, window))  # its cache is sized to the window

    def _window_start(self, end: int) -> int:
        """The first position the drafter keeps when its features end at `end`."""
        return max(0, end - self.drafter_window) if self.drafter_window else 0

    @property
    def pending_rows(self) -> int:
        """Target feature rows waiting to be fed to the drafter."""
        return self._n_pending

    def cache_positions(self) -> tuple[int, int | None]:
        """(target pos_max, drafter pos_max) once pending features are fed:
        both equal n_past-1 between steps."""
        if self.dctx is None:
            return self.ctx.pos_max(), None
        self._flush()
        return self.ctx.pos_max(), self.dctx.pos_max()

    def close(self) -> None:
        for name in (DRAFT_MODEL, MTP, EAGLE3):  # the sources that own llama.cpp objects
            src = getattr(self, "sources", {}).get(name)
            if src is not None:
                src.close()
        for obj in ("_ebatch", "_dbatch", "_tbatch", "dctx", "ctx", "drafter", "target"):
            o = getattr(self, obj, None)
            if o is not None:
                o.close()

    def complete(self, prompt: list[int], params: GenerationParams | None = None,
                 cancel: threading.Event | None = None, policy: DraftPolicy | None = None,
                 on_text: Callable[[str], None] | None = None,
                 draft_override: DraftOverride | None = None) -> Completion:
        """generate() collected: the one generate-and-collect loop every caller that does not
        stream step by step uses (the CLI, the bench, document answers, the baseline...).
        `on_text` sees each piece of visible text as it is decoded."""
        tokens: list[int] = []
        parts: list[str] = []
        ev = None
        for ev in self.generate(prompt, params, cancel=cancel, policy=policy, draft_override=draft_override):
            tokens += ev.tokens
            if ev.text:
                parts.append(ev.text)
                if on_text is not None:
                    on_text(ev.text)
        assert ev is not None  # generate yields at least the final event
        return Completion(tokens, "".join(parts), ev.stats, ev.finish_reason)

    def check_room(self, n_prompt: int, max_tokens: int) -> None:
        """ContextOverflow unless a prompt this long and a reply this long fit the context."""
        if n_prompt + max_tokens > self.n_ctx:
            raise ContextOverflow(n_prompt, max_tokens, self.n_ctx)

    def generate(self, prompt: list[int], params: GenerationParams | None = None,
                 cancel: threading.Event | None = None, policy: DraftPolicy | None = None,
                 draft_override: DraftOverride | None = None) -> Iterator[GenerationEvent]:
        """Decode after `prompt` (token ids); yields one event per step."""
        params = params or GenerationParams()
        params.validate()
        if not prompt:
            raise ValueError("the prompt is empty")
        self.check_room(len(prompt), params.max_tokens)
        if params.logit_bias and max(params.logit_bias) >= self.target.n_vocab:
            raise InvalidParams(f"logit_bias: token id {max(params.logit_bias)} is not in the vocabulary "
                                f"(0..{self.target.n_vocab - 1})", "logit_bias")
        # parsed now, so that a bad grammar is the caller's error before anything is decoded
        if params.grammar:
            check_grammar(params.grammar)
        grammar = LlamaGrammar(self.target, params.grammar) if params.grammar else None
        if policy is None:
            # upstream's loop: the drafter's block (or draft_max) every step; plain without a drafter
            k_max = self.block_size - 1 if params.draft_max is None else params.draft_max
            policy = FixedDraftLength(min(k_max, self.block_size - 1) if self.has_drafter else 0)
        speculative = params.speculative and self.speculation_blocked is None
        return self._run(prompt, params, cancel, policy, draft_override, speculative, grammar)

    def reference_scores(self, prompt: list[int], continuation: list[int],
                         params: GenerationParams | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Teacher-forced plain decoding: the prompt is prefilled as plain
        decoding does, then the target decodes one token at a time through
        `continuation`. For each position i: the single-token argmax, and how
        far continuation[i]'s logit lies below the argmax's (0 when equal);
        with `params`, of the logits its bias and penalties adjust (as the sampler does)."""
        adjust = TokenSampler(params, prompt) if params is not None else None
        self.reset()
        self.ctx.use_backend_greedy(False)  # it reads the logits
        argmax = np.empty(len(continuation), dtype=np.int64)
        deficit = np.empty(len(continuation), dtype=np.float32)
        try:
            want = prompt[:-1]
            for i in range(0, len(want), self.ctx.n_batch):
                self._tbatch.set(want[i:i + self.ctx.n_batch], i, False)
                self.ctx.decode(self._tbatch)
            feed = [prompt[-1]] + continuation[:-1]
            for i, tok in enumerate(feed):
                self._tbatch.set([tok], len(prompt) - 1 + i, True)
                self.ctx.decode(self._tbatch)
                row = self.ctx.logits_row(0)
                if adjust is not None:
                    row = adjust.adjusted(row, continuation[:i])
                best = int(np.argmax(row))
                argmax[i] = best
                deficit[i] = float(row[best] - row[continuation[i]])
        finally:
            self.reset()
        return argmax, deficit

    # --- the loop -------------------------------------------------------------
    def _run(self, prompt: list[int], params: GenerationParams, cancel: threading.Event | None,
             policy: DraftPolicy, draft_override: DraftOverride | None,
             speculative: bool, grammar: LlamaGrammar | None) -> Iterator[GenerationEvent]:
        st = GenerationStats(block_size=max(self.block_size, 2) if self.has_drafter else 16,
                             n_prompt=len(prompt))
        t_start = time.perf_counter()
        try:
            st.n_prompt_reused = self._prefill(prompt)
            self.lookup.reply_ends = [self.target.tokenize(s, add_special=False, parse_special=False)
                                      for s in params.stop]
            for src in self.sources.values():
                src.begin(prompt, st, speculative)
        except BaseException:
            self.reset()
            if grammar is not None:
                grammar.close()
            raise
        st.t_prefill_s = time.perf_counter() - t_start
        sampler = TokenSampler(params, prompt, grammar)
        # the argmax where the logits are, when nothing of this reply reads the logits themselves
        self.ctx.use_backend_greedy(self.backend_greedy and sampler.plain_greedy and params.logprobs is None)
        stream = TextStream(self.target.token_to_piece, params.stop)
        n_past = len(prompt) - 1
        anchor = prompt[-1]
        n_out = 0
        t_loop = time.perf_counter()
        finish: str | None = None
        try:
            while finish is None:
                if cancel is not None and cancel.is_set():
                    finish = FINISH_CANCELLED  # the caches are consistent: keep them for the next turn
                    yield self._final(stream, st, t_start, t_loop, FINISH_CANCELLED)
                    return
                room = min(params.max_tokens - n_out, self.n_ctx - n_past) - 1
                t_step = time.perf_counter()
                before = (st.t_draft_s, st.t_verify_s, st.t_inject_s)
                choice = self._choose(policy, room, n_past, st) if speculative and room > 0 else PLAIN_STEP
                drafts = sampler.admissible(self._drafts(choice, anchor, n_past, policy, draft_override, st))
                choice = Choice(choice.source, len(drafts)) if drafts else PLAIN_STEP
                emitted, n_acc, logprobs = self._verify(anchor, drafts, n_past, sampler, st)
                sampler.accept(emitted)
                self._sync(anchor, emitted, n_past, st)
                n_past += len(emitted)
                anchor = emitted[-1]
                text, n_reply = self._push_text(stream, emitted)
                # a reply cut by a stop string counts its last token as the target's own, so that
                # tokens = accepted drafts + one per step holds for the stats (the policy sees n_acc)
                a_reply = min(n_acc, n_reply - 1)
                n_out += n_reply
                t_now = time.perf_counter()
                st.record_step(choice.source, choice.k, a_reply, n_reply, t_now - t_step)
                st.t_decode_s = t_now - t_loop
                st.t_total_s = t_now - t_start
                policy.observe(choice, n_acc, StepTiming(
                    draft_s=st.t_draft_s - before[0], verify_s=st.t_verify_s - before[1],
                    inject_s=st.t_inject_s - before[2], step_s=t_now - t_step))
                if self.target.is_eog(anchor) or stream.stopped:
                    finish = FINISH_STOP
                elif n_out >= params.max_tokens:
                    finish = FINISH_LENGTH
                if finish is not None:
                    text += stream.finish()
                yield GenerationEvent(text, emitted[:n_reply], [True] * a_reply + [False], st, finish,
                                      choice.source, logprobs[:n_reply] if logprobs is not None else None)
        except BaseException:
            # an error or an abandoned generator leaves caches we cannot vouch for
            if finish is None:
                self.reset()
            raise
        finally:
            if grammar is not None:
                grammar.close()

    def _push_text(self, stream: TextStream, emitted: list[int]) -> tuple[str, int]:
        """The step's text and how many of its tokens belong to the reply: pushed one at a time, so
        that a stop string ends the reply at the token completing it, as in plain decoding (tokens
        verified after it stay in the cache, not in the reply); an end-of-generation token counts
        but shows no text."""
        text = ""
        for i, t in enumerate(emitted):
            if not self.target.is_eog(t):
                text += stream.push([t])
            if stream.stopped:
                return text, i + 1
        return text, len(emitted)

    def _choose(self, policy: DraftPolicy, room: int, n_past: int,
                st: GenerationStats) -> Choice:
        """Ask the policy, showing it what this step could draft from (and the lookup's match);
        the k it may use is capped by the room left and by what the source can draft."""
        match = self.sources[LOOKUP].find(min(LOOKUP_K_MAX, room), st)
        step = StepInfo(lookup=match, has_drafter=self.has_drafter, pending_rows=self.pending_rows,
                        first=st.steps == 0, n_past=n_past, sources=tuple(self.sources))
        choice = policy.choose(step)
        source = self.sources.get(choice.source)
        if source is None:
            return PLAIN_STEP
        k = max(0, min(choice.k, source.k_max, room))
        return Choice(choice.source, k) if k > 0 else PLAIN_STEP

    def _drafts(self, choice: Choice, anchor: int, n_past: int,
                policy: DraftPolicy, draft_override: DraftOverride | None, st: GenerationStats) -> list[int]:
        """The tokens to verify after the anchor for this choice."""
        k = choice.k
        if k == 0:
            return []
        drafts, conf = self.sources[choice.source].propose(self._cached + [anchor], n_past, k, st,
                                                            policy.uses_confidence)
        if draft_override is not None:
            forced = draft_override(self._cached + [anchor], choice)
            if forced is not None:
                drafts = [int(x) for x in forced][:k]
        if conf is not None:
            # early stop of the block where the drafter is unsure (the policy decides by tokens/s)
            drafts = drafts[:policy.truncate(conf[:len(drafts)])]
        return drafts

    def _final(self, stream: TextStream, st: GenerationStats, t_start: float, t_loop: float,
               reason: str) -> GenerationEvent:
        now = time.perf_counter()
        st.t_decode_s = now - t_loop
        st.t_total_s = now - t_start
        return GenerationEvent(stream.finish(), [], [], st, reason)

    def _prefill(self, prompt: list[int]) -> int:
        """Bring both caches to prompt[:-1]; returns how many tokens were reused."""
        want = prompt[:-1]
        keep = 0
        for a, b in zip(self._cached, want):
            if a != b:
                break
            keep += 1
        if keep < len(self._cached):
            ok = self.ctx.seq_rm(keep) and all(s.trim(keep) for s in self.sources.values())
            # a sliding-window cache may have dropped positions the new tokens need
            swa_gap = self.target.n_swa > 0 and keep > 0 and self.ctx.pos_min() > max(0, keep - self.target.n_swa)
            if not ok or swa_gap:
                self.reset()
                keep = 0
            self._cached = self._cached[:keep]
        todo = want[keep:]
        lo = self._window_start(len(want))  # a long prompt feeds the drafter only its last W positions
        step = self.ctx.n_batch  # llama.cpp's own limit (it clamps n_batch to a small context)
        for i in range(0, len(todo), step):
            chunk = todo[i:i + step]
            pos0 = keep + i
            self._tbatch.set(chunk, pos0, False)
            self.ctx.decode(self._tbatch)
            for src in self.sources.values():
                src.read(chunk, pos0)
            if self.dctx is not None and pos0 + len(chunk) > lo:
                skip = max(0, lo - pos0)
                self._queue(self.ctx.taps(len(chunk))[skip:], pos0 + skip)
                # a long prompt's features are fed as it is read, a ubatch at a time; under a window
                # (at most W rows are queued) they wait for the drafter's first need: a plain reply
                # feeds it nothing, a speculative one W rows as it starts (DFlashSource.begin)
                if self.pending_rows >= (self._pending_cap if self.drafter_window else self._d_ubatch):
                    self._flush()
            self._cached.extend(chunk)
        return keep

    def _queue(self, feats: np.ndarray, pos0: int) -> None:
        """Target features wait here until the drafter next needs its cache: fed in one batch
        before its next pass (or once a ubatch's worth waits), so steps that do not run the
        drafter (plain, lookup) do not pay a drafter call each."""
        if self._pending and self._pending[-1][0] + len(self._pending[-1][1]) != pos0:
            # the window skipped the positions between (a prompt's head): what waits is older still
            self._pending, self._n_pending = [], 0
        self._pending.append((pos0, feats))
        self._n_pending += len(feats)
        # rows that would fall out of the window before the drafter's next pass are never fed
        while self.drafter_window and self._n_pending - len(self._pending[0][1]) >= self.drafter_window:
            self._n_pending -= len(self._pending.pop(0)[1])

    def _flush(self, st: GenerationStats | None = None) -> None:
        if not self._pending:
            return
        t0 = time.perf_counter()
        pos0 = self._pending[0][0]
        feats = np.concatenate([r for _, r in self._pending]) if len(self._pending) > 1 else self._pending[0][1]
        self._pending = []
        self._n_pending = 0
        lo = self._window_start(pos0 + len(feats))
        if lo > pos0:
            feats, pos0 = feats[lo - pos0:], lo
        if 0 <= self.dctx.pos_min() < lo:
            # the cells that fall out of the window go first: llama.cpp wants injected positions to
            # follow the sequence's last one (a skipped prompt head would leave a gap), and the freed
            # cells are the next filled, so the drafter's pass spans ~W cells, not n. The cells kept
            # keep their true positions: no shift, their K were rotated there
            self.dctx.seq_rm(0, lo)
        self._inject(feats, pos0)
        self.injected_rows += len(feats)
        if st is not None:
            dt = time.perf_counter() - t0
            st.t_inject_s += dt
            st.t_llama_s += dt

    def time_injection(self, rows: int, repeats: int = 9) -> float:
        """Median seconds to feed `rows` feature rows to the drafter (zeros, after its cache; removed
        again): the injection costs of the cost model."""
        if self.dctx is None:
            return 0.0
        self._flush()
        n_past = len(self._cached)
        feats = np.zeros((rows, len(self.target_layers) * self.target.n_embd), dtype=np.float32)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self._inject(feats, n_past)
            times.append(time.perf_counter() - t0)
            self.dctx.seq_rm(n_past)
        return float(np.median(times))

    def _inject(self, feats: np.ndarray, pos0: int) -> None:
        """Feed target features (rows at pos0..) into the drafter's KV cache."""
        for j in range(0, feats.shape[0], self._d_ubatch):
            block = feats[j:j + self._d_ubatch]
            self._ebatch.set(block, pos0 + j)
            self.dctx.decode(self._ebatch)

    def _draft(self, anchor: int, n_past: int, k: int, st: GenerationStats,
               with_confidence: bool = False) -> tuple[list[int], np.ndarray | None]:
        """k drafts (and, if asked, the drafter's probability of each)."""
        self._flush(st)
        t0 = time.perf_counter()
        # the drafts are block rows row0..row0+k-1: after the anchor, or from it (DSpark)
        row0 = 0 if self._anchor_first else 1
        block = [anchor] + [self.mask_token] * (k + row0 - 1)
        lattice = self.drafter_format == DFLASH2
        # v1 and DSpark: every entry is an output: the dflash graph computes logits
        # for all block rows without output-id filtering, so a partial output mask
        # would misalign rows (the parity test caught this). DFlash2: none is, no
        # logits leave the graph, its lattice has a row per block token anyway
        # (llama.cpp's draft-dflash marks no outputs for DFlash2 either)
        self._dbatch.set(block, n_past, not lattice)
        self.dctx.decode(self._dbatch)
        if lattice:
            toks, conf = self.dctx.dflash2_walk(k, with_confidence)
        elif self._d2t.size and self.drafter_format == DFLASH_V1:
            toks, conf = self.dctx.dflash_readout(row0, k, self._d2t, with_confidence)
        else:
            toks, _ = self.dctx.argmax_rows(list(range(row0, row0 + k)))
            conf = self._confidence(row0, k) if with_confidence else None
        t_llama = time.perf_counter() - t0
        t1 = time.perf_counter()
        # the block's own K/V must not stay: later blocks would attend to it
        self.dctx.seq_rm(n_past)
        t_end = time.perf_counter()
        st.t_draft_s += t_end - t0
        st.t_llama_s += t_llama + (t_end - t1)
        return toks.tolist(), conf

    def _confidence(self, row0: int, k: int) -> np.ndarray:
        """The drafter's softmax probability of its own argmax at rows row0..row0+k-1 (target-wide logits)."""
        out = np.empty(k, dtype=np.float64)
        for i in range(k):
            x = self.dctx.logits_row(row0 + i)
            out[i] = 1.0 / float(np.exp(x - x.max()).sum())
        return out

    def _read_d2t(self) -> np.ndarray:
        # its ids were checked against the target's vocabulary by the pair check (gguf_tools.validate)
        return read_d2t(self.drafter.info)

    def _verify(self, anchor: int, drafts: list[int], n_past: int, sampler: TokenSampler,
                st: GenerationStats) -> tuple[list[int], int, list[TokenLogprob] | None]:
        """The emitted tokens: row i's pick (as if drafts[:i] were emitted: the sampler's `ahead`)
        while it equals draft i; the accepted count; each emitted token's logprobs, if asked."""
        t0 = time.perf_counter()
        k = len(drafts)
        self._tbatch.set([anchor] + drafts, n_past, True)
        self.ctx.decode(self._tbatch)
        t_llama = time.perf_counter() - t0
        toks = None
        if sampler.plain_greedy:
            t1 = time.perf_counter()
            toks = self.ctx.greedy_rows(list(range(k + 1)))  # in the graph (backend greedy) or in C
            t_llama += time.perf_counter() - t1
        n_top = sampler.params.logprobs
        logprobs: list[TokenLogprob] | None = None if n_top is None else []
        emitted: list[int] = []
        for i in range(k + 1):
            t = int(toks[i]) if toks is not None else sampler.pick(self.ctx.logits_row(i), drafts[:i])
            emitted.append(t)
            if logprobs is not None:  # the target's own row: the same numbers plain or speculative
                logprobs.append(token_logprob(self.ctx.logits_row(i), t, n_top))
            if i == k or t != drafts[i] or self.target.is_eog(t):
                break
        st.t_verify_s += time.perf_counter() - t0
        st.t_llama_s += t_llama
        return emitted, len(emitted) - 1, logprobs

    def _sync(self, anchor: int, emitted: list[int], n_past: int, st: GenerationStats) -> None:
        """Keep the drafter's features and both caches at the verified prefix (reading the taps
        and the trim count as the verify pass's)."""
        n_keep = n_past + len(emitted)
        t0 = time.perf_counter()
        if self.dctx is not None:
            self._queue(self.ctx.taps(len(emitted)), n_past)
        if not self.ctx.seq_rm(n_keep):  # (a recurrent state rolls back only as far as its snapshots)
            raise GenerationError(f"{self.target.path.name}: llama.cpp could not take back the rejected drafts "
                                  f"after position {n_keep}")
        dt = time.perf_counter() - t0
        st.t_verify_s += dt
        st.t_llama_s += dt
        if self.dctx is not None and self._n_pending >= self._pending_cap:
            self._flush(st)
        kept = [anchor] + emitted[:-1]
        for s in self.sources.values():
            s.read(kept, n_past)
            s.accepted(anchor, emitted, n_past, st)
        self._cached.append(anchor)
        self._cached.extend(emitted[:-1])

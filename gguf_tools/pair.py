"""Does a DFlash drafter fit a target? Every check, with a plain-language reason.

    python -m gguf_tools pair TARGET.gguf DRAFTER.gguf [--json]

The engine runs the same checks before loading, and the UI shows the same
messages, so "no compatible draft model" always comes with the why.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf_tools import validate
from gguf_tools.errors import FlashDeskError, PairMismatch, excerpt
from gguf_tools.formats import DFLASH2, DFLASH_V1, DSPARK, EAGLE3, MTP, PLAIN, draft_format
from gguf_tools.reader import GGUFInfo, read_gguf
from gguf_tools.validate import MAX_BLOCK, MIN_BLOCK
from native.lib import NativeBuildMissing, build_info


@dataclass
class PairCheck:
    name: str
    ok: bool
    detail: str
    skipped: bool = False  # could not be checked here (e.g. no native build); never a failure


@dataclass
class PairReport:
    target: str
    drafter: str
    checks: list[PairCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def problems(self) -> list[str]:
        return [c.detail for c in self.checks if not c.ok]

    def check(self, name: str) -> PairCheck | None:
        """The check called `name`, if it ran."""
        return next((c for c in self.checks if c.name == name), None)

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise PairMismatch(self.target, self.drafter, self.problems)

    def to_dict(self) -> dict:
        return {"target": self.target, "drafter": self.drafter, "ok": self.ok,
                "checks": [asdict(c) for c in self.checks]}


def tap_architectures() -> tuple[str, ...] | None:
    """Architectures whose hidden states the installed native build can tap (None: no build found)."""
    try:
        return build_info().tap_architectures
    except NativeBuildMissing:
        return None


__all__ = ["MAX_BLOCK", "MIN_BLOCK", "PairCheck", "PairReport", "check_draft_model", "check_pair",
           "tap_architectures"]
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre")
_TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


def _token_text(info: GGUFInfo, tid: int) -> str | None:
    n = info.array_len("tokenizer.ggml.tokens") or 0
    if not 0 <= tid < n:
        return None
    return excerpt(info.get("tokenizer.ggml.tokens")[tid])


def _check_tokenizer(t: GGUFInfo, d: GGUFInfo, add) -> None:  # noqa: ANN001 - list.append
    tv, dv = t.n_vocab, d.n_vocab
    add(PairCheck("vocab_size", tv == dv,
                  f"vocabulary of {tv} tokens on both" if tv == dv else
                  f"vocabulary size differs: the target has {tv} tokens, the drafter {dv} "
                  f"(the drafter belongs to a model with another tokenizer)"))
    if not d.has("tokenizer.ggml.tokens"):
        add(PairCheck("tokenizer", False, "the drafter carries no tokenizer, so llama.cpp cannot find its mask "
                                          "token: reconvert it with the target's tokenizer (gguf_tools convert)"))
        return
    if not t.has("tokenizer.ggml.tokens"):
        add(PairCheck("tokenizer", False, "the target carries no tokenizer"))
        return
    same_tokens = t.array_digest("tokenizer.ggml.tokens") == d.array_digest("tokenizer.ggml.tokens")
    if not same_tokens:
        add(PairCheck("tokenizer", False, "same vocabulary size but different tokens: the drafter was made for "
                                          "another tokenizer, so its drafts would be the wrong ids" if tv == dv else
                      "different token lists: the drafter was made for another tokenizer"))
        return
    # the drafter's own copy of the per-token scores and types is read by llama.cpp when it loads the
    # drafter: where both files have them they must be the target's (a flipped byte in either hung
    # the load or broke generation in the fuzz run)
    differ = [k.removeprefix("tokenizer.ggml.") for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")
              if t.has(k) and d.has(k) and t.array_digest(k) != d.array_digest(k)]
    if differ:
        add(PairCheck("tokenizer", False, f"identical token lists, but the drafter's token {' and '.join(differ)} "
                                          "differ from the target's: one of the files is damaged, or the drafter "
                                          "was converted with another tokenizer (gguf_tools convert copies the "
                                          "target's)"))
        return
    # drafts are token ids: identical token lists are what matters; the rest only informs
    others = [k.removeprefix("tokenizer.ggml.") for k in _TOKENIZER_KEYS if t.get(k) != d.get(k)]
    others += [k.removeprefix("tokenizer.ggml.") for k in _TOKENIZER_ARRAYS[1:]
               if (t.has(k) or d.has(k)) and t.array_digest(k) != d.array_digest(k)]
    note = (f" (the drafter's copy differs in {', '.join(others)}, which drafting does not use)" if others else "")
    add(PairCheck("tokenizer", True, f"identical token lists ({tv} tokens, {t.get('tokenizer.ggml.model')})" + note))


def check_pair(target: str | Path, drafter: str | Path,
               tap_archs: tuple[str, ...] | None = None) -> PairReport:
    """Run every compatibility check; raises ModelLoadError only for unreadable files.

    `tap_archs` overrides the native build's list of tappable architectures (tests)."""
    t = read_gguf(target)
    d = read_gguf(drafter)
    rep = PairReport(str(t.path), str(d.path))
    add = rep.checks.append

    # each file on its own first: values llama.cpp would assert on make every other check moot
    t_bad = validate.model_problems(t)
    add(PairCheck("target_metadata", not t_bad, f"the target's metadata is in range ({t.path.name})" if not t_bad
                  else f"the target {t.path.name} cannot be loaded: " + "; ".join(map(str, t_bad[:4]))))
    # the drafter's checks that have a pair check of their own are reported there
    d_bad = [p for p in validate.model_problems(d)
             if p.key not in ("dflash.block_size", "tokenizer.ggml.mask_token_id", "d2t", "fc.weight")]
    add(PairCheck("drafter_metadata", not d_bad, f"the drafter's metadata is in range ({d.path.name})"
                  if not d_bad else f"the drafter {d.path.name} cannot be loaded: " + "; ".join(map(str, d_bad[:4]))))
    if t_bad or any(p.key.endswith((".block_count", ".embedding_length")) for p in d_bad):
        return rep  # the other checks would compare numbers that mean nothing

    # which draft format each file is (gguf_tools.formats: the pinned llama.cpp's own rules)
    fmt = draft_format(d)
    is_dflash = fmt.format in (DFLASH_V1, DFLASH2, DSPARK)  # the dflash graphs the DFlash source drives
    is_eagle3 = fmt.format == EAGLE3  # the EAGLE-3 source's
    if fmt.format == PLAIN:
        why = (f"the drafter's architecture is {excerpt(d.arch)}, not 'dflash': it is a plain model, not a "
               f"DFlash drafter (with the target's vocabulary it can be a classic draft model: --draft-model)")
    else:
        why = (f"the drafter is {fmt.label} ({fmt.detail}), which llama.cpp runs as {fmt.llama_type}; "
               f"as a drafter FlashDesk's loop takes DFlash (v1, DFlash2, DSpark) and EAGLE-3 files (a target's MTP "
               f"heads need no second file). It needs {fmt.needs}")
    ok = is_dflash or is_eagle3
    add(PairCheck("drafter_architecture", ok, f"the drafter is a {fmt.label} model" if ok else why))
    t_fmt = draft_format(t)
    if t_fmt.format == MTP:  # informs only: the target can draft for itself in llama.cpp
        add(PairCheck("target_mtp", True, f"the target carries its own draft heads: {t_fmt.detail}"))
    if t.arch == "dflash":
        add(PairCheck("target_architecture", False,
                      "the target is itself a DFlash drafter: choose the full model as the target"))
    else:
        add(PairCheck("target_architecture", True,
                      f"the target is a {excerpt(t.arch)} model with {t.n_layer} layers"))
    if is_eagle3:
        _check_eagle3(t, d, add, tap_archs)
        return rep
    if not is_dflash:
        return rep

    add(PairCheck("hidden_size", d.n_embd == t.n_embd,
                  f"hidden size {t.n_embd} on both" if d.n_embd == t.n_embd else
                  f"hidden size differs: the drafter is built for {d.n_embd}, the target has {t.n_embd} "
                  f"(this drafter belongs to a different model)"))
    _check_tokenizer(t, d, add)

    layers = validate.target_layers(d)
    if not d.has("dflash.target_layers"):
        add(PairCheck("target_layers", False, "the drafter has no dflash.target_layers: it does not say which "
                                              "of the target's hidden states it reads"))
    elif layers is not None:  # (malformed lists are the drafter_metadata check's)
        bad = validate.target_layers_problem(layers, t.n_layer)
        add(PairCheck("target_layers", bad is None,
                      f"reads the inputs of target layers {layers} (the target has {t.n_layer})" if bad is None
                      else bad))
        fc = d.tensor("fc.weight")
        if fc is not None:
            want = len(layers) * d.n_embd
            add(PairCheck("fc_width", fc.shape[0] == want,
                          f"fc reads {len(layers)} x {d.n_embd} features" if fc.shape[0] == want else
                          f"fc.weight expects {fc.shape[0]} input features but {len(layers)} layers x "
                          f"{d.n_embd} = {want}: the drafter file is inconsistent"))

    _check_taps(t, add, tap_archs)

    mask = d.get("tokenizer.ggml.mask_token_id")
    if mask is None:
        add(PairCheck("mask_token", False, "the drafter sets no tokenizer.ggml.mask_token_id "
                                           "(DFlash fills its block with this token)"))
    elif not isinstance(mask, int) or not 0 <= mask < min(d.n_vocab, t.n_vocab):
        add(PairCheck("mask_token", False, f"mask token id {excerpt(mask)} is outside the vocabulary of "
                                           f"{d.n_vocab} tokens (tokenizer.ggml.mask_token_id; allowed: "
                                           f"0..{min(d.n_vocab, t.n_vocab) - 1})"))
    else:
        text = _token_text(d, mask)
        add(PairCheck("mask_token", True, f"mask token id {mask}" + (f" ({text})" if text is not None else "")))

    if fmt.format == DFLASH2:
        # llama.cpp drafts from the lattice when the key says DFlash2, but builds the selector only when
        # its tensors are there: without them it would read a lattice no graph wrote
        missing = [n for n in ("selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight")
                   if d.tensor(n) is None]
        add(PairCheck("dflash2_selector", not missing, f"DFlash2 selector over the top "
                      f"{d.get('dflash.selector_top_k')} candidates" if not missing else
                      f"dflash.selector_top_k is set but the selector's tensors are missing ({', '.join(missing)}): "
                      f"the file is inconsistent"))

    bad_bs = validate.block_size_problem(d)
    bs = d.get("dflash.block_size", 16)
    add(PairCheck("block_size", bad_bs is None, f"block size {bs}: up to {bs - 1} drafted tokens per step"
                  if bad_bs is None else bad_bs))

    _check_head(t, d, add)
    return rep


def _check_taps(t: GGUFInfo, add, tap_archs: tuple[str, ...] | None) -> None:  # noqa: ANN001 - rep.checks.append
    archs = tap_archs if tap_archs is not None else tap_architectures()
    if archs is None:
        add(PairCheck("taps", True, "not checked: no native build found to ask which architectures it taps",
                      skipped=True))
    else:
        ok = t.arch in archs
        add(PairCheck("taps", ok, f"this build taps hidden states of {t.arch!r} models" if ok else
                      f"this build cannot tap hidden states of {t.arch!r} models, so no drafter can run on this "
                      f"target (supported: {', '.join(archs)})"))


def _check_head(t: GGUFInfo, d: GGUFInfo, add) -> None:  # noqa: ANN001 - rep.checks.append
    """The drafter's output head: the target's (shared through ctx_other), or its own over the
    target's vocabulary or mapped into it by d2t."""
    shares = d.tensor("output.weight") is None
    if shares:
        has_head = t.tensor("output.weight") is not None or t.tensor("token_embd.weight") is not None
        add(PairCheck("shared_head", has_head, "the drafter shares the target's embeddings and output head"
                      if has_head else "the drafter needs the target's output head, which the target lacks"))
    elif d.tensor("d2t") is None:
        rows = d.tensor("output.weight").shape[1]
        add(PairCheck("draft_head", rows == t.n_vocab, f"own output head over {rows} tokens"
                      if rows == t.n_vocab else
                      f"the drafter's own head covers {rows} tokens but has no d2t map to the target's {t.n_vocab}"))
    if d.tensor("d2t") is not None:
        bad = validate.d2t_problems(d, t.n_vocab, "the target's")
        add(PairCheck("d2t", not bad, f"d2t maps {d.tensor('d2t').shape[0]:,} draft tokens into the target's "
                                      f"{t.n_vocab:,}" if not bad else bad[0]))


def _check_eagle3(t: GGUFInfo, d: GGUFInfo, add, tap_archs: tuple[str, ...] | None) -> None:  # noqa: ANN001
    """An EAGLE-3 drafter reads 3 of the target's layer inputs (id n_layer: its last hidden state) of
    eagle3.target_hidden_size each through fc, and the target's tokens."""
    hidden = d.get("eagle3.target_hidden_size")
    add(PairCheck("hidden_size", hidden == t.n_embd, f"target hidden size {t.n_embd} on both"
                  if hidden == t.n_embd else f"the drafter reads target states of {excerpt(hidden)} "
                  f"(eagle3.target_hidden_size), the target's are {t.n_embd}: a drafter for another model"))
    _check_tokenizer(t, d, add)
    layers = d.get("eagle3.target_layers")
    ok = (isinstance(layers, list) and len(layers) == 3
          and all(isinstance(x, int) and 0 <= x <= (t.n_layer or 0) for x in layers))
    add(PairCheck("target_layers", ok, f"reads target layers {layers} (the target has {t.n_layer})" if ok else
                  f"eagle3.target_layers = {excerpt(layers)}: 3 layer ids within 0..{t.n_layer} expected"))
    fc = d.tensor("fc.weight")
    if fc is not None and isinstance(hidden, int):
        add(PairCheck("fc_width", fc.shape[0] == 3 * hidden, f"fc reads 3 x {hidden} features"
                      if fc.shape[0] == 3 * hidden else f"fc.weight expects {fc.shape[0]} input features, not "
                      f"3 x {hidden}: the drafter file is inconsistent"))
    _check_taps(t, add, tap_archs)
    _check_head(t, d, add)


def check_draft_model(target: str | Path, draft: str | Path) -> PairReport:
    """Does a classic draft model fit a target: both load, and the draft model is a plain model
    (not a DFlash drafter) with the target's token list, so that its greedy tokens are the
    target's ids. Nothing else has to match (llama.cpp's draft-simple asks the same)."""
    t = read_gguf(target)
    d = read_gguf(draft)
    rep = PairReport(str(t.path), str(d.path))
    add = rep.checks.append
    for label, info in (("target", t), ("draft model", d)):
        bad = validate.model_problems(info)
        add(PairCheck(f"{label.replace(' ', '_')}_metadata", not bad,
                      f"the {label}'s metadata is in range ({info.path.name})" if not bad else
                      f"the {label} {info.path.name} cannot be loaded: " + "; ".join(map(str, bad[:4]))))
    if not rep.ok:
        return rep
    plain = d.arch != "dflash"
    add(PairCheck("draft_model_architecture", plain,
                  f"the draft model is a {excerpt(d.arch)} model with {d.n_layer} layers" if plain else
                  f"the file is a {draft_format(d).label} drafter: load it as the drafter (--drafter), not as a "
                  f"draft model"))
    _check_tokenizer(t, d, add)
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gguf_tools pair", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("drafter")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        rep = check_pair(args.target, args.drafter)
    except FlashDeskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        for c in rep.checks:
            print(f"[{'skip' if c.skipped else 'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        print("compatible" if rep.ok else "NOT compatible")
    return 0 if rep.ok else 1

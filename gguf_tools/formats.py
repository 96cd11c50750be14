"""Which draft format a GGUF is, by the keys and tensors the pinned llama.cpp reads.

The rules are those of the pinned tree (llama-cpp-python 0.3.36's vendor/llama.cpp):
`common_speculative_types_from_gguf` (common/speculative.cpp) picks draft-dspark when a
`dflash` file has `markov_w1.weight`, else draft-dflash, and draft-mtp for any other
architecture whose last block has `blk.N.nextn.eh_proj.weight`; the DFlash graph is DFlash2
when `dflash.selector_top_k` > 0 (src/models/dflash.cpp: `is_dflash2 = selector_top_k > 0`,
the selector tensors `selector_hidden/predecessor/successor`); EAGLE-3 is architecture
`eagle3` (src/models/eagle3.cpp: `eagle3.target_layers`, `eagle3.target_hidden_size`, `fc`,
`d2t`); a classic draft model (draft-simple) is any plain model with the target's token list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gguf_tools.reader import GGUFInfo

DFLASH_V1 = "dflash"
DFLASH2 = "dflash2"
DSPARK = "dspark"
EAGLE3 = "eagle3"
MTP = "mtp"  # a target carrying its own next-token heads
PLAIN = "plain"  # a plain model: a target, or a classic draft model for a target with its vocabulary

# how a person calls each (DraftFormat.label)
LABELS = {DFLASH_V1: "DFlash v1", DFLASH2: "DFlash2", DSPARK: "DSpark", EAGLE3: "EAGLE-3",
          MTP: "target with MTP heads", PLAIN: "plain model"}

# the formats FlashDesk's own loop drafts from today (app.engine.sources); the rest llama-server runs
IN_LOOP = (DFLASH_V1, DFLASH2, DSPARK, EAGLE3, MTP, PLAIN)


@dataclass(frozen=True)
class DraftFormat:
    format: str  # one of the names above
    label: str  # how a person calls it
    llama_type: str  # llama.cpp's speculative type (--spec-type), "" for a plain model
    detail: str  # what in the file says so, and the format's own numbers
    needs: str  # what it needs to draft
    in_loop: bool  # FlashDesk's decode loop drafts from it today

    def to_dict(self) -> dict:
        return asdict(self)


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


# written by `flashdesk distill`: the longest sequence (tokens) the drafter was trained on, so the farthest
# context it has learned to read (the engine's default window for it)
TRAINED_SPAN_KEY = "flashdesk.distill.span"


def trained_span(info: GGUFInfo) -> int | None:
    """The tokens of the longest sequence a drafter was trained on, where its file says (a positive count)."""
    n = _int(info.get(TRAINED_SPAN_KEY))
    return n if n and n > 0 else None


def mtp_layers(info: GGUFInfo) -> int:
    """How many MTP (nextn) heads a non-DFlash model carries: `{arch}.nextn_predict_layers`, or 1
    when only the last block's `nextn.eh_proj` tensor shows it (llama.cpp's own test)."""
    n = _int(info.arch_get("nextn_predict_layers")) or 0
    if n > 0:
        return n
    n_layer = info.n_layer or 0
    return 1 if n_layer > 0 and info.tensor(f"blk.{n_layer - 1}.nextn.eh_proj.weight") is not None else 0


def draft_format(info: GGUFInfo) -> DraftFormat:
    """The draft format of one file, from its header alone."""
    if info.arch == "dflash":
        layers = list(info.get("dflash.target_layers") or [])
        block = _int(info.get("dflash.block_size")) or 16
        if info.tensor("markov_w1.weight") is not None:
            conf = info.tensor("conf_proj.weight") is not None
            heads = "a Markov head (markov_w1/markov_w2)" + (", a confidence head" if conf else "")
            return DraftFormat(DSPARK, LABELS[DSPARK], "draft-dspark",
                               f"a dflash file with {heads}; "
                               f"block {block}, target layers {layers}",
                               "the target's hidden states at its target layers, the Markov head over the previous "
                               "draft token (in its graph), an anchor-first block" + (
                                   "" if conf else "; no confidence head: llama.cpp needs --spec-draft-p-min 0"),
                               True)
        top_k = _int(info.get("dflash.selector_top_k")) or 0
        if top_k > 0:
            rank = _int(info.get("dflash.selector_rank"))
            window = _int(info.get("dflash.attention.sliding_window"))
            return DraftFormat(DFLASH2, LABELS[DFLASH2], "draft-dflash",
                               f"dflash.selector_top_k = {top_k}" + (f", selector rank {rank}" if rank else "")
                               + (f", sliding window {window}" if window else "")
                               + f"; block {block}, target layers {layers}",
                               f"the target's hidden states at its target layers, and the selector lattice over the "
                               f"top {top_k} candidates per position (read from the drafter's nextn embeddings, not "
                               f"its logits, and walked as llama.cpp's draft-dflash walks it)",
                               True)
        return DraftFormat(DFLASH_V1, LABELS[DFLASH_V1], "draft-dflash", f"block {block}, target layers {layers}",
                           "the target's hidden states at its target layers (FlashDesk taps them), "
                           "[anchor, mask x k] in one pass", True)
    if info.arch == "eagle3":
        layers = list(info.get("eagle3.target_layers") or [])
        return DraftFormat(EAGLE3, LABELS[EAGLE3], "draft-eagle3",
                           f"architecture eagle3, target layers {layers}, target hidden size "
                           f"{info.get('eagle3.target_hidden_size')}" + (", d2t" if info.tensor("d2t") else ""),
                           "3 of the target's hidden states (fc over them), its own pre-norm state carried "
                           "between draft steps, one pass per draft token", True)
    n_mtp = mtp_layers(info)
    if n_mtp:
        return DraftFormat(MTP, LABELS[MTP], "draft-mtp",
                           f"{info.arch} with {n_mtp} MTP (nextn) head{'s' if n_mtp > 1 else ''} "
                           f"(blk.*.nextn.eh_proj)",
                           "no second file: the target's own head, fed its last hidden state, as a second "
                           "context on the same file (llama.cpp's draft-mtp)" + (
                               "; several chained heads: FlashDesk's loop drives a single head only, and decodes "
                               "this target without them" if n_mtp > 1 else ""), n_mtp == 1)
    return DraftFormat(PLAIN, LABELS[PLAIN], "draft-simple" if info.n_layer else "",
                       f"architecture {info.arch}, {info.n_layer} layers",
                       "as a classic draft model: the target's token list (gguf_tools pair checks it), its own "
                       "context and KV cache; FlashDesk runs it with --draft-model", True)

"""Which draft sources a load uses, and why: what the Model panel shows after a load (Qt-free).

Every drafter format the pinned llama.cpp loads is driven by the loop (a file that does not fit is
refused by check_spec, with the reason); a target's MTP heads the engine does not use get a line
saying why, as Unsloth Studio says why it falls back. The lines come from the loaded engine's source
registry (`Engine.sources`), so a new source shows up here by its name.
"""

from __future__ import annotations

from pathlib import Path

from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, DRAFT_MODEL, EAGLE3, LOOKUP, MTP
from app.errors import FlashDeskError
from app.session.models import ModelSpec
from gguf_tools.formats import DFLASH2, DSPARK, draft_format
from gguf_tools.formats import MTP as MTP_FORMAT
from gguf_tools.reader import read_gguf

# what the dflash source is, by the drafter's format (Engine.drafter_format): it runs DFlash v1, DFlash2 and DSpark
DFLASH_KINDS = {DFLASH2: "DFlash2 drafter", DSPARK: "DSpark drafter"}
_DFLASH_HOW = {DFLASH2: " (its selector's walk)", DSPARK: " (its Markov head)"}


def dflash_kind(engine: Engine) -> str:
    """The loaded drafter's kind as the user knows it: "DFlash drafter", "DFlash2 drafter", "DSpark drafter"."""
    return DFLASH_KINDS.get(engine.drafter_format, "DFlash drafter")


def source_labels(engine: Engine) -> dict[str, str]:
    """Names for the sources whose name depends on the loaded files (the stats panel shows them; the
    session stores them with each reply's summary): the dflash source by its drafter's format."""
    return {DFLASH: dflash_kind(engine)} if DFLASH in engine.sources else {}


def draft_source_lines(engine: Engine, spec: ModelSpec) -> tuple[str, ...]:
    """What drafts for this load and why, one line each: the sources in the engine's registry and the
    target's own MTP heads where the engine does not use them."""
    lines: list[str] = []
    if engine.speculation_blocked:
        return (*lines, engine.speculation_blocked)
    names = [n for n in engine.sources if n != LOOKUP]
    for name in names:
        if name == DFLASH:
            kind = dflash_kind(engine) + _DFLASH_HOW.get(engine.drafter_format, "")
            lines.append(f"{kind} {Path(spec.drafter or '').name} in use: blocks of {engine.block_size} "
                         f"(up to {engine.block_size - 1} drafts a step), fed the target's hidden states")
        elif name == DRAFT_MODEL:
            lines.append(f"draft model {Path(spec.draft_model or '').name} in use: shares the target's vocabulary "
                         f"(up to {engine.sources[name].k_max} drafts a step, one pass each)")
        elif name == EAGLE3:
            src = engine.sources[name]
            lines.append(f"EAGLE-3 drafter {Path(spec.drafter or '').name} in use: fed 3 of the target's hidden "
                         f"states (layers {src.layers}), up to {src.k_max} drafts a step, one pass each")
        elif name == MTP:
            lines.append(f"the target's own MTP head in use: no second file, fed the target's last hidden state "
                         f"(up to {engine.sources[name].k_max} drafts a step, one pass of the head each)")
        else:
            lines.append(f"draft source {name} in use")
    try:
        t_fmt = draft_format(read_gguf(spec.target))
    except FlashDeskError:
        t_fmt = None
    if t_fmt is not None and t_fmt.format == MTP_FORMAT and MTP not in engine.sources:
        why = engine.mtp_unused or "the loaded target has none"
        lines.append(f"the target carries MTP heads ({t_fmt.detail}): not used: {why}")
    if names:
        lines.append("context lookup: on beside them (drafts copied from the conversation, no model pass)")
    else:
        lines.append("no drafter: plain decoding with the context lookup")
    return tuple(lines)

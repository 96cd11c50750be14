"""The drafters on this machine for a chosen target: what the Model panel offers without a file dialog.

Looked for in the target's own folder, the models folder (catalog downloads) and the bundled
drafters; each file's draft format comes from its header (gguf_tools.formats) and it is offered
only when it fits this target:
- a drafter (DFlash v1, DFlash2, DSpark, EAGLE-3) whose pair check passes (`--drafter`);
- a plain model with the target's token list and a smaller file (a classic draft model, `--draft-model`);
- the target's own MTP head: listed (no file to choose: a load of the target uses it unless turned off,
  `ModelSpec.mtp`: the Model panel's switch, `--no-mtp`); a target
  with several chained heads: listed, not usable, with the reason (FlashDesk's loop drives one).
Header reads only (the reader decodes no token list), so a scan of a models folder is quick.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.bundled import DRAFTER_DIR
from app.errors import FlashDeskError
from app.hub.catalog import CatalogEntry
from app.hub.paths import models_dir
from gguf_tools.formats import MTP, PLAIN, draft_format
from gguf_tools.pair import check_draft_model, check_pair
from gguf_tools.reader import GGUFInfo, read_gguf

ROLE_DRAFTER = "drafter"  # a DFlash drafter: ModelSpec.drafter
ROLE_DRAFT_MODEL = "draft-model"  # a classic draft model: ModelSpec.draft_model
ROLE_MTP = "mtp"  # the target's own heads: no file to choose


@dataclass(frozen=True)
class DrafterOption:
    """One drafter found for the target."""
    path: str  # "" for the target's own MTP heads
    role: str  # ROLE_*
    format_label: str  # "DFlash v1", "DFlash2", "plain model", ... (gguf_tools.formats)
    usable: bool  # FlashDesk's loop can draft from it with this target
    why: str  # the pair check's word, or why it cannot be used
    catalog_title: str | None = None  # the catalog's name for this file, when it is one

    @property
    def text(self) -> str:
        """The line the panel shows."""
        name = Path(self.path).name if self.path else "the target's own MTP heads"
        role = {ROLE_DRAFTER: "drafter", ROLE_DRAFT_MODEL: "draft model", ROLE_MTP: "no second file"}[self.role]
        tail = "" if self.usable else ": not driven by FlashDesk yet"
        return f"{name} — {self.format_label} ({role}){tail}"


def drafter_folders(target: str | Path) -> list[Path]:
    """Where drafters for `target` may be: its own folder, the models folder, the bundled drafters."""
    return [Path(target).expanduser().parent, models_dir(), DRAFTER_DIR]


def _catalog_titles(entries: list[CatalogEntry]) -> dict[str, str]:
    titles = {}
    for e in entries:
        titles[e.drafter.file] = f"{e.title}: drafter"
        for d in e.drafters:
            if d.file is not None:
                titles[d.file.file] = d.title
    return titles


def find_drafters(target: str | Path, folders: list[Path] | None = None,
                  catalog: list[CatalogEntry] | None = None,
                  tap_archs: tuple[str, ...] | None = None) -> list[DrafterOption]:
    """The drafters for `target` in `folders` (default: drafter_folders), usable ones first.
    `tap_archs` overrides the native build's list of tappable architectures (tests)."""
    t_path = Path(target).expanduser().resolve()
    t_info = read_gguf(t_path)  # an unreadable target raises: the panel says so
    titles = _catalog_titles(catalog or [])
    out: list[DrafterOption] = []
    t_fmt = draft_format(t_info)
    if t_fmt.format == MTP:
        used = "; a load of this target drafts with it unless turned off (--no-mtp)" if t_fmt.in_loop else ""
        out.append(DrafterOption("", ROLE_MTP, t_fmt.label, t_fmt.in_loop, f"{t_fmt.detail}; {t_fmt.needs}{used}"))
    seen = {t_path}
    for folder in folders if folders is not None else drafter_folders(t_path):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.gguf")):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            opt = _option(t_path, t_info, real, tap_archs)
            if opt is not None:
                out.append(DrafterOption(opt.path, opt.role, opt.format_label, opt.usable, opt.why,
                                         titles.get(real.name)))
    order = {ROLE_DRAFTER: 0, ROLE_DRAFT_MODEL: 1, ROLE_MTP: 2}
    return sorted(out, key=lambda o: (not o.usable, order[o.role], Path(o.path).name))


def _option(target: Path, t_info: GGUFInfo, path: Path, tap_archs: tuple[str, ...] | None) -> DrafterOption | None:
    """The option for one file, or None when it does not fit this target (or is not a model)."""
    try:
        info = read_gguf(path)
        fmt = draft_format(info)
        if fmt.format not in (PLAIN, MTP) and fmt.in_loop:  # the drafter files (gguf_tools.formats.IN_LOOP)
            rep = check_pair(target, path, tap_archs=tap_archs)
            return DrafterOption(str(path), ROLE_DRAFTER, fmt.label, True, "the pair check passed") if rep.ok else None
        if fmt.format == PLAIN:
            # a classic draft model pays only when it is cheaper than the target: a smaller file
            if path.stat().st_size >= target.stat().st_size or not check_draft_model(target, path).ok:
                return None
            return DrafterOption(str(path), ROLE_DRAFT_MODEL, "classic draft model", True,
                                 "shares the target's token list")
        tokens = "tokenizer.ggml.tokens"
        if fmt.format == MTP or (info.has(tokens) and info.array_digest(tokens) != t_info.array_digest(tokens)):
            return None  # another target's heads, or another model family's drafter
        return DrafterOption(str(path), ROLE_DRAFTER, fmt.label, False, fmt.needs)
    except (FlashDeskError, OSError):
        return None  # an unreadable or damaged file is not offered (the pair check names it when chosen)

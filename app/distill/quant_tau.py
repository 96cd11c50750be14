"""What quantizing a drafter costs in acceptance: tau per quantization, as JSON.

    flashdesk quant-tau --target T.gguf --drafter D.gguf --prompts P.jsonl
        [--variants F16,Q8_0,Q4_K_M,Q4_K_M+Q8_0] [--limit N] [--max-tokens 64] [--draft-max K]
        [--out-dir DIR] [--json OUT.json]

Each variant is made from D (which should be the F16/F32 original) by
`gguf_tools quantize`; `TYPE+KEEP` is TYPE with the sensitive tensors (fc,
attention K/V) kept at KEEP. Every variant then generates greedily over the
same prompts (the app's chat format) with a fixed draft length, and the
command prints tau (mean tokens per verify pass), the acceptance rate and the
acceptance by block position. Tau depends only on the tokens, not on the
machine's speed, so it is comparable across machines; tokens/s is not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from app.bench.prompt_sets import load_prompts, prompt_text
from app.bench.runner import run_mode
from app.chat.format import prompt_format_of
from app.engine.dflash import Engine, EngineConfig
from app.errors import FlashDeskError
from gguf_tools.quantize import quantize
from gguf_tools.reader import read_gguf

DEFAULT_VARIANTS = ("F16", "Q8_0", "Q4_K_M", "Q4_K_M+Q8_0")


def parse_variant(v: str) -> tuple[str, str | None]:
    """'Q4_K_M+Q8_0' -> ('Q4_K_M', 'Q8_0'); 'F16' -> ('F16', None)."""
    base, _, keep = v.upper().partition("+")
    return base, keep or None


def measure_variant(target: Path, drafter: Path, prompts: list, max_tokens: int, draft_max: int | None,
                    n_ctx: int = 2048) -> dict:
    """Greedy DFlash generation over `prompts` with one drafter file; tau and acceptance."""
    engine = Engine(target, drafter, EngineConfig(n_ctx=n_ctx))
    try:
        fmt = prompt_format_of(engine.target)
        rows = []
        for bp in prompts:
            text, stop = prompt_text(bp, fmt)
            r = run_mode(engine, engine.tokenize(text), "fixed", max_tokens, draft_max, stop)
            rows.append({"id": bp.id, "tau": r["tau"], "drafted": r["drafted"], "accepted": r["accepted"],
                         "steps": r["steps"], "tokens_per_s": r["tokens_per_s"],
                         "accept_by_pos": r["accept_by_pos"], "draft_by_pos": r["draft_by_pos"]})
    finally:
        engine.close()
    drafted = sum(r["drafted"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    n_pos = max((len(r["accept_by_pos"]) for r in rows), default=0)
    by_pos = [sum(r["accept_by_pos"][i] for r in rows if i < len(r["accept_by_pos"])) for i in range(n_pos)]
    return {"tau": round((accepted + steps) / steps, 4) if steps else 0.0,
            "median_tau": round(statistics.median(r["tau"] for r in rows), 4) if rows else 0.0,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "drafted": drafted, "accepted": accepted, "steps": steps, "accept_by_pos": by_pos,
            "median_tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 3) if rows else 0.0,
            "prompts": rows}


def _is_f16_export(drafter: Path) -> bool:
    """A drafter whose layer weights are F16 and whose fc is F32 (what `gguf_tools distill` writes)."""
    types = {t.name: t.type_name for t in read_gguf(drafter).tensors}
    return types.get("fc.weight") == "F32" and types.get("blk.0.ffn_up.weight") == "F16"


def sweep(target: Path, drafter: Path, prompts: list, variants: list[str], out_dir: Path, max_tokens: int,
          draft_max: int | None) -> dict:
    """Quantize `drafter` into each variant and measure it."""
    results = []
    for v in variants:
        base, keep = parse_variant(v)
        if base == "F16" and keep is None and _is_f16_export(drafter):
            # the distill export already is F16 (with fc F32, which an F16 requantization cannot keep)
            path, size = drafter, drafter.stat().st_size
        else:
            q = quantize(drafter, out_dir / f"{drafter.stem}-{v.replace('+', '-keep-')}.gguf", base,
                         keep_sensitive=keep)
            path, size = Path(q.output), q.bytes_out
        m = measure_variant(target, path, prompts, max_tokens, draft_max)
        results.append({"variant": v, "file_type": base, "keep_sensitive": keep, "file": str(path),
                        "bytes": size} | m)
        print(f"{v}: tau {m['tau']:.3f}, acceptance {m['acceptance_rate']:.3f}, {size / 1e6:.1f} MB",
              file=sys.stderr, flush=True)
    return {"target": str(target), "drafter": str(drafter), "n_prompts": len(prompts), "max_tokens": max_tokens,
            "draft_max": draft_max, "variants": results}


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(prog="flashdesk quant-tau", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="the drafter in F16 or F32 (quantized from this)")
    ap.add_argument("--prompts", required=True, help="JSONL prompt file (as for flashdesk bench)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--draft-max", type=int, default=None, help="fixed draft length (default: block size - 1)")
    ap.add_argument("--out-dir", help="keep the quantized drafters here (default: a temporary folder)")
    ap.add_argument("--json", help="also write the full result here")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        prompts = load_prompts(args.prompts, args.limit)
        with tempfile.TemporaryDirectory(prefix="flashdesk-quant-") as tmp:
            out_dir = Path(args.out_dir) if args.out_dir else Path(tmp)
            res = sweep(Path(args.target), Path(args.drafter), prompts, variants, out_dir, args.max_tokens,
                        args.draft_max)
    except (FlashDeskError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    summary = {r["variant"]: {k: r[k] for k in ("tau", "acceptance_rate", "bytes", "accept_by_pos")}
               for r in res["variants"]}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

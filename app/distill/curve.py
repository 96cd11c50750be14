"""The drafter's learning curve: fixed held-out sets, one point per drafter and set.

The held-out prompts are committed (assets/distill/heldout-*.jsonl) so that
every session measures on the same sets, whatever its corpus holds; the corpus
drops all of them before training. "mixed" (96 prompts, 40 of them code) is the
curve since stop 34; "chat" (58 emails, stories and stories in other languages,
drawn in stop 40 from `letters_and_stories(random.Random(4040), 600)` less every
earlier corpus's prompts) follows the kinds the chat bench measures, which the
mixed set lacks. Their replies are the target's own greedy
ones, regenerated on each machine (greedy decoding is deterministic, and the
features and top-K come with them), so a point needs no training data on disk.

A point: the drafter's labelled-token count (the x axis), and what a greedy
verifier would accept at every reply position (app.distill.train.evaluate):
tau with drafts of 3 and with full blocks, acceptance per block position.
The JSON keeps every point the tool measured; the plot is drawn from it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from app.bench.info import run_info  # noqa: E402
from app.bundled import HELDOUT_SETS  # noqa: E402
from app.distill.corpus import CorpusPrompt, load_corpus  # noqa: E402
from app.distill.dataset import DistillData, packed_data  # noqa: E402
from app.distill.export import load_drafter_gguf  # noqa: E402
from app.distill.generate import GenConfig, generate_dataset  # noqa: E402
from app.distill.train import TrainConfig, evaluate  # noqa: E402

HELDOUT_PROMPTS = HELDOUT_SETS["mixed"]


def heldout_prompts(path: Path = HELDOUT_PROMPTS) -> list[CorpusPrompt]:
    return load_corpus(path)


def without_heldout(corpus: list[CorpusPrompt], paths: tuple[Path, ...] = tuple(HELDOUT_SETS.values())
                    ) -> list[CorpusPrompt]:
    """The corpus less every prompt of every held-out set (by text: ids differ between corpora)."""
    held = {p.text for path in paths for p in heldout_prompts(path)}
    return [p for p in corpus if p.text not in held]


def heldout_data(target: Path, work: Path, taps: list[int], prompts: list[CorpusPrompt],
                 progress=print, name: str = "heldout") -> DistillData:
    """The target's greedy replies to the held-out prompts, with features at `taps` (made once per work
    folder and set)."""
    raw, packed = work / name, work / f"{name}-packed-{'-'.join(map(str, taps))}"
    generate_dataset(target, prompts, raw, GenConfig(tap_layers=taps, greedy_fraction=1.0, replies=1),
                     progress=progress)
    return packed_data(raw, packed, taps, progress)


def measure(drafter: Path, target: Path, work: Path, prior_tokens: int | None = None,
            prompts_file: Path = HELDOUT_PROMPTS, progress=print) -> dict:
    """One point of the curve for a drafter GGUF."""
    model, tokens = load_drafter_gguf(drafter, target)
    if tokens is None:
        tokens = prior_tokens
    if tokens is None:
        raise ValueError(f"{drafter}: the file does not say how many tokens it was trained on "
                         f"(pass --prior-tokens; its card says)")
    # the mixed set's folders keep the names they had before there were two sets
    name = "heldout" if prompts_file == HELDOUT_PROMPTS else prompts_file.stem
    data = heldout_data(target, work, list(model.c.target_layers), heldout_prompts(prompts_file), progress, name)
    ev = evaluate(model, data, list(range(len(data))), TrainConfig(block_size=model.c.block_size))
    return {"drafter": drafter.name, "drafter_sha256": hashlib.sha256(drafter.read_bytes()).hexdigest()[:16],
            "tokens": tokens, "sequences": len(data), "prompts_file": prompts_file.name,
            "tau_k3": round(ev["tau_k3"], 4), "tau_block": round(ev["tau"], 4), "block_size": model.c.block_size,
            "positions": ev["positions"], "loss": round(ev["loss"], 4), "tau_by_kind": ev["tau_by_kind"],
            "accept_rate_by_pos": ev["accept_rate_by_pos"], "run": run_info()}


def add_point(curve_json: Path, point: dict) -> dict:
    """Append a point to the curve file (a drafter measured again replaces its earlier point)."""
    curve = json.loads(curve_json.read_text()) if curve_json.exists() else {"points": []}
    curve["points"] = [p for p in curve["points"] if p["drafter_sha256"] != point["drafter_sha256"]] + [point]
    curve["points"].sort(key=lambda p: p["tokens"])
    curve_json.parent.mkdir(parents=True, exist_ok=True)
    curve_json.write_text(json.dumps(curve, indent=2) + "\n")
    return curve


def plot_curve(curve: dict, out: Path) -> Path:
    pts = curve["points"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = [p["tokens"] for p in pts]
    # markers only: points of one token count may be siblings (an A/B from the same start), not a chain
    a.plot(x, [p["tau_k3"] for p in pts], "o", label="tau, drafts of 3")
    a.plot(x, [p["tau_block"] for p in pts], "s", label="tau, blocks of 16")
    for p in pts:
        a.annotate(Path(p["drafter"]).stem, (p["tokens"], p["tau_block"]), fontsize=7, xytext=(3, 4),
                   textcoords="offset points")
    a.set_xscale("log")
    a.set_xlabel("labelled tokens trained on")
    a.set_title("held-out tau (greedy target replies)")
    a.legend()
    for p in pts:
        b.plot(range(1, len(p["accept_rate_by_pos"]) + 1), p["accept_rate_by_pos"], "o-", ms=3,
               label=f"{p['tokens'] / 1e6:.2f}M tokens")
    b.set_xlabel("block position")
    b.set_title("acceptance given the previous ones accepted")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

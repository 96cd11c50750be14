"""The model card written next to a distilled drafter: what it was trained
on, how, for how long, and what it measured (held-out estimates from
training; the llama.cpp bench figures are added when they exist)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from app.distill.dataset import TEXT_KINDS


def write_card(out_gguf: Path, target: Path, ckpt_dir: Path, data_meta: dict, n_sequences: int,
               n_response_tokens: int, kinds: dict[str, int], train_minutes: float, gen_seconds: float | None,
               argv: list[str], bench: dict | None = None, warm_start: tuple[str, int, int] | None = None) -> Path:
    """warm_start: (the drafter training started from, the labelled tokens it had been trained on, its layers)."""
    hist = json.loads((ckpt_dir / "history.json").read_text())
    cfg, history = hist["config"], hist["history"]
    last = history[-1]
    lines = [
        f"# {out_gguf.name}",
        "",
        f"A DFlash drafter for `{target.name}`, distilled by FlashDesk's `flashdesk distill` on this machine's CPU.",
        "",
        "## Reproduce",
        "",
        "```",
        "flashdesk distill " + " ".join(shlex.quote(a) for a in argv),
        "```",
        "",
        "## Data",
        "",
        f"- {n_sequences} sequences. Replies to prompts of the project's own corpus (Python standard-library "
        "functions cut after their docstring, small generated coding tasks, explanations, math word problems, lists, "
        "summaries of Python's documentation, questions over documents, emails, stories, other languages; HumanEval "
        "excluded by name and by 60-character "
        "overlap), written by the target itself in the app's prompt format (plain `User:/Assistant:` for chat, raw "
        "completion for code): 75% of first replies greedy, the rest and every further reply sampled at T=0.8."
        + (" Windows of offline text (Python sources, Debian documentation, man pages; HumanEval and the bench's "
           "prompts excluded) labelled with the target's own top-K at every position." if set(kinds) & set(TEXT_KINDS)
           else ""),
        f"- Sequence kinds: {', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}; {n_response_tokens:,} "
        "labelled tokens.",
        f"- Target features: layer inputs {data_meta['tap_layers']} (bfloat16), top-{data_meta.get('top_k', 32)} "
        "target logits per response token.",
        *([f"- Generation time: {gen_seconds / 60:.0f} min."] if gen_seconds else []),
        "",
        "## Model",
        "",
        f"- {cfg['n_layer']} Gemma-shaped layers ("
        + (f"trained on from `{warm_start[0]}` ({warm_start[1]:,} labelled tokens before these), its weights and "
           "draft vocabulary" + (f"; {cfg['n_layer'] - warm_start[2]} layer(s) added in front of its {warm_start[2]}, "
                                 "copies of the target's with their residual branches at zero"
                                 if warm_start[2] < cfg["n_layer"] else "")
           if warm_start else "initialised from the target's last layers") + "), fc over "
        f"{len(data_meta['tap_layers'])} tapped layers, draft vocabulary {cfg['draft_vocab']} tokens (d2t), "
        f"block size {cfg['block_size']}, mask token = the target's `<mask>`.",
        "",
        "## Training",
        "",
        f"- {cfg['epochs']} epochs, {cfg['anchors_per_seq']} random anchors per sequence per epoch"
        + (f" ({cfg['text_anchors_per_seq']} per labelled text window)" if cfg.get("text_anchors_per_seq") else "")
        + ", block lengths "
        f"{cfg['block_lengths']} (p={cfg['block_probs']}), AdamW lr {cfg['lr']}"
        + (f" (the {cfg['new_layers']} grown layer(s) at {cfg['new_layer_lr']})"
           if cfg.get("new_layers") and cfg.get("new_layer_lr") else "") + ", cosine with warm-up, clip "
        f"{cfg['grad_clip']}, loss weights exp(-(k-1)/{cfg['gamma']}), KL to the target's top-K x {cfg['kl_weight']}"
        + ("; hard labels: the target's argmax at every reply position" if cfg.get("reply_labels") == "argmax" else "")
        + ("; bfloat16 autocast, master weights f32." if cfg.get("bf16") else "."),
        f"- Training time: {train_minutes:.0f} min on this machine's CPU (2 cores).",
        "",
        "## Held-out estimates (PyTorch, greedy sequences, block 16)",
        "",
        "| epoch | loss | tau | tau by kind |",
        "|---|---|---|---|",
        *[f"| {h['epoch']} | {h['loss']:.3f} | {h['tau']:.3f} | {h.get('tau_by_kind', {})} |" for h in history],
        "",
        f"Acceptance rate by block position (last epoch): {last['accept_rate_by_pos']}",
    ]
    if bench:
        lines += ["", "## Measured with llama.cpp (`flashdesk bench`)", "", "```", json.dumps(bench, indent=2), "```"]
    card = out_gguf.with_suffix(".md")
    card.write_text("\n".join(lines) + "\n")
    return card

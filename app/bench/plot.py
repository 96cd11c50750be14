"""A PNG of a `flashdesk bench` result: speedup and tau per category for each
mode (peers, app.bench.peers, hatched), the draft length the adaptive controller
chose over time, and, when peers ran, our best mode over each peer per category."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_bench(result: dict, out: str | Path) -> Path:
    from app.bench.peers import is_peer  # noqa: PLC0415

    cats = list(result["summary"]["by_category"])
    modes = [m for m in result["modes"] if m != "plain"]
    peer_list = [m for m in modes if is_peer(m)]
    fig, axes = plt.subplots(1, 4 if peer_list else 3, figsize=(21 if peer_list else 16, 4.8))
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(cats))
    for i, m in enumerate(modes):
        sp = [result["summary"]["by_category"][c][m]["median_speedup"] for c in cats]
        tau = [result["summary"]["by_category"][c][m]["median_tau"] for c in cats]
        hatch = "//" if m in peer_list else None
        axes[0].bar(x + i * width, sp, width, label=m, hatch=hatch, color=f"C{i % 10}")
        axes[1].bar(x + i * width, tau, width, label=m, hatch=hatch, color=f"C{i % 10}")
    for ax, title in ((axes[0], "median speedup over plain decoding"), (axes[1], "median tau (tokens per step)")):
        ax.set_xticks(x + width * (len(modes) - 1) / 2, cats, rotation=20)
        ax.set_title(title)
        ax.legend()
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    ad = next((m for m in ("adaptive-conf", "adaptive") if m in modes), None)
    if ad:
        for c in cats:
            rows = [r for r in result["prompts"] if r["category"] == c]
            if rows:
                ks = rows[0]["modes"][ad]["k_history"]
                axes[2].plot(range(len(ks)), ks, lw=1, label=f"{c}: {rows[0]['id']}")
        axes[2].set_title(f"draft length chosen per step ({ad}, first prompt per category)")
        axes[2].set_xlabel("step")
        axes[2].legend(fontsize=7)
    if peer_list:
        ax = axes[3]
        w = 0.8 / len(peer_list)
        ours = result["summary"]["by_category"][cats[0]]["peers"]["ours"] if cats else "ours"
        for i, m in enumerate(peer_list):
            r = [result["summary"]["by_category"][c]["peers"]["by_peer"][m]["ours_over_peer"] for c in cats]
            ax.bar(x + i * w, r, w, label=m, hatch="//", color=f"C{modes.index(m) % 10}")  # as in the others
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(x + w * (len(peer_list) - 1) / 2, cats, rotation=20)
        ax.set_title(f"{ours} tokens/s over each peer's (median per prompt)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{Path(result.get('target') or '').name} + {Path(result.get('drafter') or '').name}", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_verify_cost(result: dict, out: str | Path) -> Path:
    """A PNG of a `flashdesk verify-cost` result: pass time relative to one token, per n."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [str(n) for n in result["sizes"]]
    for kind in ("flashdesk", "stock"):
        if kind in result:
            ax.plot([int(n) for n in sizes], [result[kind]["relative"][n] for n in sizes], "o-",
                    label=f"{kind} ({result[kind]['ms']['1']:.1f} ms at n=1)")
    ns = [int(n) for n in sizes]
    ax.plot(ns, ns, ":", color="grey", label="n single-token passes")
    ax.set_xlabel("tokens in the pass (n)")
    ax.set_ylabel("time / time of one token")
    ax.set_title(f"target pass of n tokens after {result['context']} of context")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)

"""A PNG of a `flashdesk bench` result: speedup and tau per category for each
mode (peers, app.bench.peers, hatched), the draft length the adaptive controller
chose over time, and, when peers ran, our best mode over each peer per category."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from app.bench.peers import is_peer  # noqa: E402


def plot_bench(result: dict, out: str | Path) -> Path:
    cats = list(result["summary"]["by_category"])
    modes = [m for m in result["modes"] if m != "plain"]
    peer_list = [m for m in modes if is_peer(m)]
    colour = {m: plt.cm.tab20(i % 20) for i, m in enumerate(modes)}  # one colour per mode in every panel
    fig, axes = plt.subplots(1, 4 if peer_list else 3, figsize=(22 if peer_list else 16, 5.6))
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(cats))
    for i, m in enumerate(modes):
        sp = [result["summary"]["by_category"][c][m]["median_speedup"] for c in cats]
        tau = [result["summary"]["by_category"][c][m]["median_tau"] for c in cats]
        hatch = "//" if m in peer_list else None
        axes[0].bar(x + i * width, sp, width, label=m, hatch=hatch, color=colour[m])
        axes[1].bar(x + i * width, tau, width, hatch=hatch, color=colour[m])
    for ax, title in ((axes[0], "median speedup over plain decoding"), (axes[1], "median tau (tokens per step)")):
        ax.set_xticks(x + width * (len(modes) - 1) / 2, cats, rotation=20)
        ax.set_title(title)
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    # one legend for the bar panels, under them (inside, it hides the bars)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=min(len(modes), 7), fontsize=8)
    ctl = next((m for m in ("hybrid", "adaptive-conf", "adaptive", "lookup") if m in modes), None)
    if ctl:
        for c in cats:
            rows = [r for r in result["prompts"] if r["category"] == c]
            if rows:
                ks = rows[0]["modes"][ctl].get("k_history", [])
                axes[2].plot(range(len(ks)), ks, lw=1, label=f"{c}: {rows[0]['id']}")
        axes[2].set_title(f"draft length chosen per step ({ctl}, first prompt per category)", fontsize=10)
        axes[2].set_xlabel("step")
        axes[2].legend(fontsize=7)
    else:
        axes[2].axis("off")
    if peer_list:
        ax = axes[3]
        w = 0.8 / len(peer_list)
        ours = result["summary"]["by_category"][cats[0]]["peers"]["ours"] if cats else "ours"
        for i, m in enumerate(peer_list):
            r = [result["summary"]["by_category"][c]["peers"]["by_peer"][m]["ours_over_peer"] for c in cats]
            ax.bar(x + i * w, r, w, hatch="//", color=colour[m])
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(x + w * (len(peer_list) - 1) / 2, cats, rotation=20)
        ax.set_title(f"{ours} tokens/s over each peer's (median per prompt)", fontsize=10)
    fig.suptitle(f"{Path(result.get('target') or '').name} + {Path(result.get('drafter') or '').name}", fontsize=9)
    rows_of_legend = -(-len(modes) // 7)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * rows_of_legend, 1, 1))
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_verify_cost(result: dict, out: str | Path) -> Path:
    """A PNG of a `flashdesk verify-cost` result: pass time relative to one token, per n."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [str(n) for n in result["sizes"]]
    for kind in ("flashdesk", "stock", "other"):
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
    return _save(fig, out)


def plot_forced_loop(result: dict, out: str | Path) -> Path:
    """A PNG of an app.bench.forced_loop result: the cost model's tokens/s for drafting k every step
    under the forced profile, and what each mode measured at its k."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    pred = result["predicted_tokens_per_s_by_k"]
    ax.plot(range(len(pred)), pred, "-", color="grey", label=f"predicted tau(k)/c(k) (tau {result['tau']} at 15)")
    for mode, m in result["modes"].items():
        ax.plot([m["k"]], [m["tokens_per_s"]], "o", label=f"{mode}: {m['tokens_per_s']:.1f} tok/s at k={m['k']} "
                                                           f"({m['measured_over_predicted']:.2f}x predicted)")
    ax.set_xlabel("drafts per step (k)")
    ax.set_ylabel("tokens/s")
    ax.set_title("drafts forced at the profile: measured against the cost model")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out)


def plot_context_cost(result: dict, out: str | Path) -> Path:
    """A PNG of a `flashdesk context-cost` result: per context length, the verify of n tokens (ms, the
    measured curve and the cost model's dashed), and the drafter's pass of n-1 drafts."""
    fig, (ax, ad) = plt.subplots(1, 2, figsize=(11, 4.5))
    for at in result["by_context"]:
        ns = sorted(int(n) for n in at["verify_ms"])
        line, = ax.plot(ns, [at["verify_ms"][str(n)] for n in ns], "o-", ms=3, label=f"{at['cells']} cells")
        if "cost_model" in at:
            ax.plot(ns, [at["cost_model"]["verify_ms"][str(n)] for n in ns], "--", color=line.get_color(), lw=0.8)
        if "draft_ms" in at:
            ks = sorted(int(k) for k in at["draft_ms"])
            ad.plot(ks, [at["draft_ms"][str(k)] for k in ks], "o-", ms=3, color=line.get_color(),
                    label=f"{at['cells']} cells (inject {at['inject_row_ms']:.3f} ms/row)")
    ax.set_xlabel("tokens verified (n)")
    ax.set_ylabel("ms per steady step (drafter's work apart)")
    ax.set_title("verify(n) by context (dashed: the cost model)", fontsize=10)
    ad.set_xlabel("drafts (k)")
    ad.set_ylabel("ms per drafter pass")
    ad.set_title("the drafter's pass by context", fontsize=10)
    for a in (ax, ad):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"{Path(result.get('target') or '').name} + {Path(result.get('drafter') or '').name}", fontsize=9)
    return _save(fig, out)


def _save(fig: plt.Figure, out: str | Path) -> Path:
    """Every plot's ending: laid out, written as a PNG, closed."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)

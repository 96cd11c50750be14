"""Training a DFlash drafter on self-distilled data (the published recipe,
docs/design.md, section 4, plus what a CPU budget needs).

- Random anchors in each response, re-drawn every epoch; a block sees the
  context strictly before its anchor and itself, never other blocks.
- Loss on block positions k = 1..B-1 weighted exp(-(k-1)/gamma): cross
  entropy on the target's tokens, plus (optional) KL to the target's own
  top-K distribution at that position (soft labels over the draft vocabulary).
- Block lengths vary (16, 8, 4) so the drafter works for the short drafts an
  adaptive controller picks on a CPU, not only for full blocks.
- AdamW, linear warm-up then cosine decay, gradient clipping; a checkpoint
  per epoch (resumable), held-out loss and an acceptance estimate per epoch.
- Initialisation: the drafter's layers start as copies of the target's last
  layers, fc as the identity on the deepest tap, hidden_norm as that layer's
  attn_norm: at step 0 the injected context K/V are the target's own.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from app.distill.dataset import TEXT_KINDS, DistillData, Sequence
from app.distill.export import LAYER_TENSORS
from app.distill.model import Drafter, DrafterConfig
from app.distill.target_weights import TargetWeights
from gguf_tools.reader import read_gguf


@dataclass
class TrainConfig:
    n_layer: int = 2
    draft_vocab: int = 16384
    block_size: int = 16
    block_lengths: list[int] = field(default_factory=lambda: [16, 8, 4])
    block_probs: list[float] = field(default_factory=lambda: [0.5, 0.3, 0.2])
    anchors_per_seq: int = 24
    # anchors of a labelled text window (TEXT_KINDS), when set: a 2,048-token window holds 20x a reply's
    # positions, and at a reply's count one epoch would read 1-2% of them (None: anchors_per_seq)
    text_anchors_per_seq: int | None = None
    seqs_per_step: int = 4
    epochs: int = 3
    lr: float = 4e-4
    weight_decay: float = 0.01
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    gamma: float = 7.0
    kl_weight: float = 0.5
    kl_temperature: float = 1.0
    init_from_target: bool = True
    holdout: int = 48
    max_steps: int | None = None  # stop early (tests, time budgets)
    seed: int = 0
    threads: int = 0
    device: str = "cpu"  # torch device: cpu or cuda
    bf16: bool = False  # bfloat16 autocast of the forward pass (AVX-512-BF16 CPUs, GPUs); master weights stay f32
    # layers grown in front of a warm start (grow_layers) learn at their own rate: their branches start
    # at zero, and at the warm start's small lr one epoch barely opens them (stop 37)
    new_layers: int = 0
    new_layer_lr: float | None = None
    # the hard label of a reply position: "tokens", the reply's own next token (a sample, in a sampled
    # reply: 22% of them are not the target's argmax in stop 37's data), or "argmax", the target's
    # greedy pick after that prefix, what a greedy verifier accepts (the soft KL labels are the same)
    reply_labels: str = "tokens"


def bf16_is_fast(device: str) -> bool:
    """Whether bfloat16 autocast pays on `device`: a GPU that has it, or a CPU with AVX-512-BF16 or
    AMX-BF16 instructions (Linux's flags). Measured on a 2-core EPYC with avx512_bf16: 100 warm-started
    steps in 0.9 min against 1.7 in f32, the same held-out loss to 4 digits (notes, stop 37)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def bf16_to_tensor(bits: np.ndarray) -> torch.Tensor:
    # np.array copies: memmapped features are read-only
    return torch.from_numpy(np.array(bits).view(np.int16)).view(torch.bfloat16).to(torch.float32)


def choose_draft_vocab(data: DistillData, n_vocab: int, size: int, extra: list[int]) -> np.ndarray:
    """The `size` most frequent response tokens (plus `extra`), sorted by id."""
    counts = data.response_token_counts(n_vocab)
    order = np.argsort(-counts, kind="stable")
    keep = list(dict.fromkeys([*extra, *order[:size].tolist()]))[:size]
    return np.array(sorted(keep), dtype=np.int64)


def build_drafter(target: Path, data: DistillData, cfg: TrainConfig) -> Drafter:
    info = read_gguf(target)
    tw = TargetWeights(target)
    n_embd = info.n_embd
    n_head = int(info.arch_get("attention.head_count"))
    n_kv = int(info.arch_get("attention.head_count_kv", n_head))
    head_dim = int(info.arch_get("attention.key_length", n_embd // n_head))
    gemma = info.arch.startswith("gemma")
    mask_id = info.get("tokenizer.ggml.mask_token_id")
    if mask_id is None:
        tokens = info.get("tokenizer.ggml.tokens") or []
        mask_id = tokens.index("<mask>") if "<mask>" in tokens else None
    if mask_id is None:
        raise ValueError(f"{target}: the vocabulary has no <mask> token to fill draft blocks with")
    c = DrafterConfig(
        n_embd=n_embd, n_layer=cfg.n_layer, n_head=n_head, n_head_kv=n_kv, head_dim=head_dim,
        n_ff=int(info.arch_get("feed_forward_length")), target_layers=list(data.meta["tap_layers"]),
        block_size=cfg.block_size, mask_token_id=int(mask_id),
        rms_eps=float(info.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(info.arch_get("rope.freq_base", 10000.0)),
        embedding_scale=math.sqrt(n_embd) if gemma else 1.0, activation="gelu" if gemma else "silu",
        post_norms=gemma and tw.has("blk.0.post_attention_norm.weight"),
        n_ctx=int(info.arch_get("context_length", 32768)))
    tok = torch.from_numpy(tw.token_embd().copy())
    d2t = choose_draft_vocab(data, tok.shape[0], cfg.draft_vocab, [int(mask_id)])
    head = torch.from_numpy(tw.output_head()[d2t])
    model = Drafter(c, tok, head, torch.from_numpy(d2t))
    if cfg.init_from_target:
        init_from_target(model, tw, info.n_layer)
    return model


def _copy_target_layer(layer: torch.nn.Module, tw: TargetWeights, blk: int) -> None:
    for attr, gname in LAYER_TENSORS.items():
        mod = getattr(layer, attr)
        src = f"blk.{blk}.{gname}.weight"
        if mod is not None and tw.has(src):
            mod.weight.copy_(torch.from_numpy(tw.get(src)).reshape(mod.weight.shape))


def init_from_target(model: Drafter, tw: TargetWeights, n_layer_target: int) -> None:
    """Layers <- the target's last layers; fc <- identity on the deepest tap;
    hidden_norm <- that layer's attn_norm; output_norm <- the target's."""
    c = model.c
    first = n_layer_target - c.n_layer
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            _copy_target_layer(layer, tw, first + i)
        deepest = max(range(len(c.target_layers)), key=lambda j: c.target_layers[j])
        lid = c.target_layers[deepest]
        model.fc.weight.zero_()
        model.fc.weight[:, deepest * c.n_embd:(deepest + 1) * c.n_embd] = torch.eye(c.n_embd)
        if lid < n_layer_target and tw.has(f"blk.{lid}.attn_norm.weight"):
            model.hidden_norm.weight.copy_(torch.from_numpy(tw.get(f"blk.{lid}.attn_norm.weight")))
        model.output_norm.weight.copy_(torch.from_numpy(tw.get("output_norm.weight")))


def grow_layers(model: Drafter, n_layer: int, tw: TargetWeights, n_layer_target: int) -> Drafter:
    """`model` with n_layer layers that computes exactly what it computed: the trained layers stay
    the last ones, each new one goes in front as a copy of the target layer before them with its
    residual branches switched off (post-norm weights, or wo and down, at zero). Training then
    starts from the warm-started drafter's function, and the new layer learns from there (the
    capacity A/B of issue 27: a third layer on top of a warm start, not a cold restart)."""
    add = n_layer - model.c.n_layer
    if add < 0:
        raise ValueError(f"cannot shrink a {model.c.n_layer}-layer drafter to {n_layer} layers")
    if add == 0:
        return model
    grown = Drafter(replace(model.c, n_layer=n_layer), model.tok_embd, model.head, model.d2t)
    state = {}
    for k, v in model.state_dict().items():
        if k.startswith("layers."):
            i, rest = k[len("layers."):].split(".", 1)
            k = f"layers.{int(i) + add}.{rest}"
        state[k] = v
    missing, unexpected = grown.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(tuple(f"layers.{i}." for i in range(add))) for k in missing)
    with torch.no_grad():
        for i in range(add):
            layer = grown.layers[i]
            _copy_target_layer(layer, tw, n_layer_target - n_layer + i)
            for off in ((layer.attn_post_norm, layer.ffn_post_norm) if model.c.post_norms
                        else (layer.wo, layer.down)):
                off.weight.zero_()
    return grown


def _t2d_cpu(model: Drafter) -> np.ndarray:
    if not hasattr(model, "_t2d_np"):
        model._t2d_np = model.t2d.cpu().numpy()
    return model._t2d_np


def make_batch(seq: Sequence, model: Drafter, n_anchor: int, block: int, rng: np.random.Generator,
               all_anchors: bool = False, argmax_labels: bool = False) -> dict | None:
    """Anchors, block tokens, hard labels (draft ids, -100 = ignore) and soft-label rows. The labels of
    offline text are always the target's argmax; a reply's are with `argmax_labels` (TrainConfig.reply_labels)."""
    L = len(seq.tokens)
    lo, hi = seq.n_prompt - 1, L - 2  # anchors: the last prompt token .. the second-to-last token
    if hi < lo:
        return None
    cand = np.arange(lo, hi + 1)
    anchors = cand if all_anchors or len(cand) <= n_anchor else np.sort(rng.choice(cand, n_anchor, replace=False))
    toks = np.full((len(anchors), block), model.c.mask_token_id, dtype=np.int64)
    toks[:, 0] = seq.tokens[anchors]
    pos = anchors[:, None] + np.arange(1, block)[None, :]  # positions the block predicts
    valid = pos <= L - 1
    resp_row = np.where(valid, pos - seq.n_prompt, -1)  # topk row predicting that position
    if seq.kind in TEXT_KINDS or argmax_labels:
        # offline text (or a sampled reply): the label is what the target would write after that prefix
        # (its argmax), not the text's own next token; a block past the first mismatch is still
        # conditioned on the real text (a greedy reply's argmax is its next token: the same labels)
        tgt = np.where(valid, seq.topk_ids[np.maximum(resp_row, 0), 0], 0)
    else:
        tgt = np.where(valid, seq.tokens[np.minimum(pos, L - 1)], 0)
    labels = _t2d_cpu(model)[tgt.astype(np.int64)]
    labels = np.where(valid & (labels >= 0), labels, -100)
    return {"anchors": torch.from_numpy(anchors.astype(np.int64)), "tokens": torch.from_numpy(toks),
            "labels": torch.from_numpy(labels.astype(np.int64)), "resp_row": resp_row}


def block_loss(model: Drafter, seq: Sequence, batch: dict, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    dev = model.d2t.device
    feats = bf16_to_tensor(seq.features).to(dev)
    logits = model(feats, batch["anchors"].to(dev), batch["tokens"].to(dev))[:, 1:, :]  # [N, B-1, V]
    labels = batch["labels"].to(dev)
    b1 = labels.shape[1]
    w = torch.exp(-torch.arange(b1, dtype=torch.float32, device=dev) / cfg.gamma)[None, :].expand_as(labels)
    mask = labels >= 0
    logp = F.log_softmax(logits.float(), dim=-1)  # in f32 under bf16 autocast too
    ce = -logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    wsum = (w * mask).sum().clamp(min=1e-6)
    loss_ce = (ce * w * mask).sum() / wsum
    loss = loss_ce
    loss_kl = torch.zeros(())
    if cfg.kl_weight > 0:
        rows = batch["resp_row"]
        ok = rows >= 0
        r = np.where(ok, rows, 0)
        ids = torch.from_numpy(seq.topk_ids[r].astype(np.int64)).to(dev)  # [N, B-1, K]
        tl = torch.from_numpy(seq.topk_logits[r].astype(np.float32)).to(dev) / cfg.kl_temperature
        did = model.t2d[ids]  # draft ids, -1 outside the draft vocabulary
        inside = did >= 0
        tl = tl.masked_fill(~inside, float("-inf"))
        p_t = torch.softmax(tl, dim=-1).nan_to_num(0.0)
        lp_d = logp.gather(-1, did.clamp(min=0))
        kl_pos = -(p_t * lp_d).sum(-1) + (p_t * p_t.clamp(min=1e-12).log()).sum(-1)
        m2 = torch.from_numpy(ok).to(dev) & inside.any(-1)
        loss_kl = (kl_pos * w * m2).sum() / (w * m2).sum().clamp(min=1e-6)
        loss = loss + cfg.kl_weight * loss_kl
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & mask
    return loss, {"ce": float(loss_ce.detach()), "kl": float(loss_kl.detach()),
                  "top1": float(hit.sum() / mask.sum().clamp(min=1))}


@torch.no_grad()
def evaluate(model: Drafter, data: DistillData, idx: list[int], cfg: TrainConfig) -> dict:
    """Held-out loss, and the acceptance a greedy verifier would give: at
    every response position of greedy sequences, draft a 16-block and count
    the matching prefix (tau = 1 + accepted; tau_k3: the same with drafts of 3)."""
    model.eval()
    rng = np.random.default_rng(0)
    losses, taus, taus_k3 = [], [], []
    by_kind: dict[str, list[float]] = {}
    acc_pos = np.zeros(cfg.block_size - 1)
    n_pos = np.zeros(cfg.block_size - 1)
    for i in idx:
        seq = data[i]
        b = make_batch(seq, model, 10_000, cfg.block_size, rng, all_anchors=True,
                       argmax_labels=cfg.reply_labels == "argmax")
        if b is None:
            continue
        loss, _ = block_loss(model, seq, b, cfg)
        losses.append(float(loss))
        if not seq.greedy:
            continue
        dev = model.d2t.device
        logits = model(bf16_to_tensor(seq.features).to(dev), b["anchors"].to(dev), b["tokens"].to(dev))[:, 1:, :]
        pred = logits.argmax(-1).cpu()
        labels = b["labels"]
        valid = b["resp_row"] >= 0
        match = (pred == labels).numpy() & valid
        run = np.cumprod(match, axis=1)
        acc = run.sum(1)
        taus.extend((1 + acc).tolist())
        taus_k3.extend((1 + np.minimum(acc, 3)).tolist())
        by_kind.setdefault(seq.kind, []).extend((1 + acc).tolist())
        for k in range(cfg.block_size - 1):
            reach = run[:, k - 1] if k > 0 else np.ones(len(acc), bool)
            sel = reach.astype(bool) & valid[:, k]
            n_pos[k] += sel.sum()
            acc_pos[k] += (match[:, k] & sel).sum()
    model.train()
    return {"loss": float(np.mean(losses)) if losses else 0.0, "tau": float(np.mean(taus)) if taus else 0.0,
            "tau_k3": float(np.mean(taus_k3)) if taus_k3 else 0.0, "positions": len(taus),
            "tau_by_kind": {k: round(float(np.mean(v)), 4) for k, v in sorted(by_kind.items())},
            "accept_rate_by_pos": np.round(acc_pos / np.maximum(n_pos, 1), 4).tolist()}


def param_groups(model: Drafter, cfg: TrainConfig) -> list[dict]:
    """The optimizer's groups: the grown layers (the first cfg.new_layers) at new_layer_lr, the rest at lr
    (one schedule scales both)."""
    new = {id(p) for layer in model.layers[:cfg.new_layers] for p in layer.parameters() if p.requires_grad}
    if not new or cfg.new_layer_lr is None:
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    return [{"params": [p for p in model.parameters() if p.requires_grad and id(p) not in new]},
            {"params": [p for p in model.parameters() if id(p) in new], "lr": cfg.new_layer_lr}]


def anchors_for(seq: Sequence, cfg: TrainConfig) -> int:
    """Anchors drawn in one sequence per epoch: a labelled text window's own count where one is set."""
    return cfg.text_anchors_per_seq if cfg.text_anchors_per_seq and seq.kind in TEXT_KINDS else cfg.anchors_per_seq


def train(model: Drafter, data: DistillData, cfg: TrainConfig, ckpt_dir: Path,
          progress: Callable[[str], None] = print) -> dict:
    """Train (resuming from ckpt_dir/last.pt if present); returns the history."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model.to(cfg.device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(123).permutation(len(data))
    held = sorted(order[:cfg.holdout].tolist())
    train_idx = order[cfg.holdout:].tolist()
    steps_per_epoch = math.ceil(len(train_idx) / cfg.seqs_per_step)
    total = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    warm = max(1, int(total * cfg.warmup_frac))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, total)))))
    state = {"step": 0, "epoch": 0, "history": []}
    last = ckpt_dir / "last.pt"
    if last.exists():
        ck = torch.load(last, weights_only=False, map_location=cfg.device)
        if not torch.equal(ck["model"]["d2t"], model.d2t):
            raise ValueError(f"{last} was trained with another draft vocabulary (the data changed?): "
                             f"use a new checkpoint folder")
        # a resumed run is the same run: another lr, epoch count or block mix would continue a
        # schedule made for different settings (the device may change: a run moved to a GPU)
        # a setting added since the checkpoint was written counts at its default (the run that made it)
        made = ck.get("train_config", {})
        was = {k: v for k, v in (asdict(TrainConfig()) | made).items() if k != "device"} if made else {}
        now = {k: v for k, v in asdict(cfg).items() if k != "device"}
        if was and was != now:
            diff = ", ".join(f"{k} {was.get(k)} -> {now.get(k)}" for k in sorted(now) if was.get(k) != now.get(k))
            raise ValueError(f"{last} belongs to another training run ({diff}): delete {ckpt_dir} to start "
                             f"this one, or run with the settings it was made with to resume it")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        state = ck["state"]
        progress(f"resumed at step {state['step']} (epoch {state['epoch']})")
    if state["epoch"] == 0 and state["step"] == 0:
        ev = evaluate(model, data, held, cfg)
        state["history"].append({"epoch": 0, "step": 0, **ev})
        progress(f"before training: held-out loss {ev['loss']:.3f}, tau {ev['tau']:.3f}")
    t0 = time.time()
    while state["epoch"] < cfg.epochs and state["step"] < total:
        ep = state["epoch"]
        perm = np.random.default_rng(cfg.seed + ep).permutation(train_idx)
        start = (state["step"] - ep * steps_per_epoch) * cfg.seqs_per_step
        run = {"ce": 0.0, "kl": 0.0, "top1": 0.0, "n": 0}
        for s0 in range(max(0, start), len(perm), cfg.seqs_per_step):
            opt.zero_grad()
            for i in perm[s0:s0 + cfg.seqs_per_step]:
                seq = data[int(i)]
                block = int(rng.choice(cfg.block_lengths, p=cfg.block_probs))
                b = make_batch(seq, model, anchors_for(seq, cfg), block, rng,
                               argmax_labels=cfg.reply_labels == "argmax")
                if b is None:
                    continue
                with torch.autocast(cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
                    loss, m = block_loss(model, seq, b, cfg)
                (loss.float() / cfg.seqs_per_step).backward()
                for k in ("ce", "kl", "top1"):
                    run[k] += m[k]
                run["n"] += 1
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            state["step"] += 1
            if state["step"] % 25 == 0 and run["n"]:
                el = time.time() - t0
                progress(f"epoch {ep + 1}/{cfg.epochs} step {state['step']}/{total} ce {run['ce'] / run['n']:.3f} "
                         f"kl {run['kl'] / run['n']:.3f} top1 {run['top1'] / run['n']:.3f} "
                         f"lr {sched.get_last_lr()[0]:.2e} {el / 60:.1f} min")
                run = {"ce": 0.0, "kl": 0.0, "top1": 0.0, "n": 0}
            if state["step"] % 200 == 0:
                _save(last, model, opt, sched, state, cfg)
            if state["step"] >= total:
                break
        if state["step"] >= (ep + 1) * steps_per_epoch:
            state["epoch"] = ep + 1
        ev = evaluate(model, data, held, cfg)
        state["history"].append({"epoch": state["epoch"], "step": state["step"], "minutes": (time.time() - t0) / 60,
                                 **ev})
        progress(f"epoch {state['epoch']}: held-out loss {ev['loss']:.3f}, tau {ev['tau']:.3f} "
                 f"{ev['tau_by_kind']}, accept by pos {ev['accept_rate_by_pos'][:6]}")
        _save(last, model, opt, sched, state, cfg)
    (ckpt_dir / "history.json").write_text(json.dumps({"config": asdict(cfg), "history": state["history"]}, indent=2))
    return state


def _save(path: Path, model: Drafter, opt: torch.optim.Optimizer, sched: object, state: dict,
          cfg: TrainConfig) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "state": state, "config": model.c.to_dict(), "train_config": asdict(cfg)}, tmp)
    tmp.rename(path)

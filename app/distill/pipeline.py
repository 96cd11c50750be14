"""flashdesk distill --target T.gguf --out D.gguf [options]

The whole pipeline, resumable at every stage (re-run the same command after
an interruption): build the prompt corpus, let the target write responses
(data/), label offline text with the target (text/, `--stage label`), pack
the chosen tap layers of the chosen sources (packed-*/), train (ckpt-*/),
export the GGUF. `--chunk-minutes` makes generate and label runs that end on
time and resume where they stopped. `--warm-start D.gguf` trains on from a
drafter (its draft vocabulary and weights; e.g. the shipped one), so a new
session's data adds to what an earlier one taught. `--stage curve --drafter
D.gguf` adds a drafter's point to the learning curve (app.distill.curve).
The replies outlive the machine as tokens only: `--stage save-replies
--replies-file F.npz` writes them (under a byte a token; the project keeps
its own in assets/distill/replies/), `--stage relabel --replies-file F.npz`
has a new machine's target read them again (relabelled/; 1.2x generation's
rate here), and training reads them with the replies generated here.
Defaults scale with the target: drafter layers 1 (< 1B parameters), 2 (< 4B)
or 5, five tap layers spread DFlash-style and ending at the deepest layer
input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from app.bench.info import run_info
from app.bundled import default_drafter, is_default_target
from app.distill.card import write_card
from app.distill.corpus import (
    LONG_ASK_TOKENS,
    build_corpus,
    load_corpus,
    save_corpus,
    tokenizer_of,
    without_prompts_of,
)
from app.distill.curve import HELDOUT_SETS, add_point, measure, plot_curve, without_heldout
from app.distill.dataset import packed_data
from app.distill.export import export_gguf, load_drafter_gguf
from app.distill.generate import GenConfig, generate_dataset
from app.distill.offline_text import load_documents, offline_documents, save_documents
from app.distill.reply_tokens import RelabelConfig, relabel_replies, write_reply_tokens
from app.distill.target_weights import TargetWeights
from app.distill.teacher_forced import LabelConfig, label_text
from app.distill.train import TrainConfig, bf16_is_fast, build_drafter, grow_layers, train
from app.engine.llama_objects import LlamaModel, ModelPlacement
from gguf_tools.formats import trained_span
from gguf_tools.reader import read_gguf
from native.ggml_devices import list_devices


def default_taps(n_layer: int, n: int = 5) -> list[int]:
    """n layer inputs spread from 2 to n_layer-1 (the deepest tappable input)."""
    lo, hi = 2, max(2, n_layer - 1)
    return sorted({int(round(lo + i * (hi - lo) / (n - 1))) for i in range(n)})


def default_drafter_layers(n_params: float) -> int:
    return 1 if n_params < 1e9 else 2 if n_params < 4e9 else 5


def gpu_placement() -> ModelPlacement:
    """Every layer of the target on the build's GPUs (llama.cpp spreads them by free memory), or a
    RuntimeError saying there is none: a CPU build ignores a GPU placement, and a run that silently
    decoded on the CPU would take hours where the user planned minutes."""
    gpus = [d for d in list_devices() if d.type in ("gpu", "igpu")]
    if not gpus:
        raise RuntimeError("--gpu: this build of llama.cpp sees no GPU (the CUDA build: FLASHDESK_CUDA=1 make setup)")
    return ModelPlacement(n_gpu_layers=999)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flashdesk distill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", help="drafter GGUF to write (train, export, all)")
    ap.add_argument("--work", help="working folder (default: ~/.cache/flashdesk/distill/<target name>)")
    ap.add_argument("--device", default=None, help="torch device for training: cpu or cuda (default: cuda with --gpu)")
    ap.add_argument("--gpu", action="store_true",
                    help="generate and label with every target layer on the GPU (a CUDA build: FLASHDESK_CUDA=1), "
                         "train on cuda; raise --parallel there (64: a GPU verifies a batch of 64 rows at about the "
                         "cost of one)")
    ap.add_argument("--prompts", type=int, default=3400,
                    help="corpus size (code + chat + document questions); made once per work folder")
    ap.add_argument("--code-share", type=float, default=0.5, help="share of code prompts in the corpus")
    ap.add_argument("--docs-share", type=float, default=0.15, help="share of document questions in the corpus")
    ap.add_argument("--long-docs", type=int, default=0,
                    help="long document questions in the corpus: retrieved over this machine's documentation and "
                         "filled to 1-2.3k tokens of sources, as the bench's document answers read (their replies "
                         "teach the drafter to read far context)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None,
                    help="generate: longer prompts are skipped (default 384, or the long questions' size with "
                         "--long-docs)")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--parallel", type=int, default=16, help="sequences decoded together while generating")
    ap.add_argument("--replies", type=int, default=2,
                    help="replies per prompt while generating: the first, then sampled ones from a copy of its cache")
    ap.add_argument("--gen-taps", help="layer inputs to store while generating (comma list; default: taps + extras)")
    ap.add_argument("--taps", help="layer inputs the drafter reads (comma list; default: the --warm-start's, on the "
                    "bundled target the shipped drafter's, else five spread DFlash-style)")
    ap.add_argument("--layers", type=int, default=None,
                    help="drafter layers (with --warm-start, more than the file has adds layers in front that "
                         "start as no-ops)")
    ap.add_argument("--new-layer-lr", type=float, default=None,
                    help="with --layers growing a warm start: the new layers' learning rate (default: --lr)")
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--anchors", type=int, default=24, help="anchors per sequence per step")
    ap.add_argument("--text-anchors", type=int, default=None,
                    help="anchors per labelled text window per step (default: --anchors; a long window holds "
                         "many more positions than a reply)")
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--kl-weight", type=float, default=0.5)
    ap.add_argument("--reply-labels", choices=["tokens", "argmax"], default="tokens",
                    help="a reply position's hard label: the reply's own next token (sampled in a sampled reply) "
                         "or the target's argmax there (what a greedy verifier accepts)")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--block-lengths", default="16,8,4", help="block lengths drawn in training (comma list)")
    ap.add_argument("--block-probs", default="0.5,0.3,0.2", help="their probabilities (comma list)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="train with bfloat16 autocast, master weights f32 (default: where the CPU or GPU has "
                         "bfloat16 instructions; 1.9x faster at the same loss on an AVX-512-BF16 CPU)")
    ap.add_argument("--seed", type=int, default=0, help="the corpus's draw (a new work folder with a new seed: "
                                                         "new prompts for a warm-started run)")
    ap.add_argument("--skip-prompts-of", help="work folders (comma list) whose corpus prompts this run skips: "
                                               "a later session's data repeats none of an earlier one's prompts")
    ap.add_argument("--warm-start", help="train on from this drafter GGUF (its weights and draft vocabulary)")
    ap.add_argument("--prior-tokens", type=int, default=None,
                    help="labelled tokens the --warm-start or --drafter file was trained on, when it does not say")
    ap.add_argument("--drafter", help="curve: the drafter GGUF to measure")
    ap.add_argument("--curve", default="docs/bench/distill-curve-cpu.json",
                    help="curve: the learning-curve JSON to add the point to (the plot is written next to it)")
    ap.add_argument("--heldout", default="mixed", choices=sorted(HELDOUT_SETS),
                    help="curve: the held-out set (mixed: the curve's own, 40 of 96 prompts code; chat: emails, "
                         "stories and other-language stories; keep one --curve file per set)")
    ap.add_argument("--stage", default="all",
                    choices=["all", "generate", "label", "save-replies", "relabel", "train", "export", "curve"],
                    help="generate: the target's replies (data/); label: the target's labels over offline text "
                         "(text/); save-replies: data/'s replies as tokens only to --replies-file (small enough "
                         "for the repository); relabel: the replies of --replies-file files read again by the "
                         "target (relabelled/<file>/: what a new machine rebuilds instead of generating); all: "
                         "generate, then train and export; curve: a drafter's held-out point")
    ap.add_argument("--replies-file", help="save-replies: the file to write; relabel: the files to read (comma list)")
    ap.add_argument("--chunk-minutes", type=float, default=None,
                    help="generate/label: stop after this many minutes (re-run to resume)")
    ap.add_argument("--json", help="generate/label: write the run's result (what it made, how fast) here")
    ap.add_argument("--label-window", type=int, default=256,
                    help="label: tokens per window of offline text (one prefill each; 2048 teaches the drafter "
                         "far context, as long documents need; a document shorter than it gives one window)")
    ap.add_argument("--label-windows-per-doc", type=int, default=4,
                    help="label: windows of one document at most")
    ap.add_argument("--sources", default="generated",
                    help="what training reads: generated, text, or generated,text (the folders present)")
    ap.add_argument("--dtype", default="f16", choices=["f16", "f32"])
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if args.gpu else "cpu")
    try:
        placement = gpu_placement() if args.gpu else None
    except RuntimeError as e:
        ap.error(str(e))

    target = Path(args.target).expanduser()
    info = read_gguf(target)
    work = Path(args.work).expanduser() if args.work else Path.home() / ".cache" / "flashdesk" / "distill" / target.stem
    # a warm start reads the taps and keeps the layers of the drafter it starts from (more with --layers)
    warm = read_gguf(Path(args.warm_start).expanduser()) if args.warm_start else None
    # without one, on the bundled target the shipped drafter's taps: data made with others could never warm-start it
    taps_of = warm if warm is not None else (
        read_gguf(default_drafter()) if not args.taps and default_drafter() and is_default_target(target) else None)
    drafter_taps = [int(x) for x in taps_of.arch_get("target_layers")] if taps_of else None
    taps = ([int(x) for x in args.taps.split(",")] if args.taps else drafter_taps or default_taps(info.n_layer))
    gen_taps = sorted({*taps, *([int(x) for x in args.gen_taps.split(",")] if args.gen_taps else [])})
    n_params = sum(t.n_elements for t in info.tensors)
    n_layers = max(warm.n_layer, args.layers or 0) if warm else args.layers or default_drafter_layers(n_params)
    say = lambda m: print(f"[distill {time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    say(f"target {target.name}: {info.arch}, {info.n_layer} layers, {n_params / 1e6:.0f}M parameters; "
        f"drafter: {n_layers} layers, taps {taps}; work folder {work}")

    data_dir = work / "data"
    text_dir = work / "text"
    relabelled_dir = work / "relabelled"
    chunk_s = args.chunk_minutes * 60 if args.chunk_minutes is not None else None
    if args.stage == "curve":
        if not args.drafter:
            ap.error("--stage curve needs --drafter")
        point = measure(Path(args.drafter).expanduser(), target, work, args.prior_tokens,
                        prompts_file=HELDOUT_SETS[args.heldout], progress=say)
        curve_json = Path(args.curve)
        curve = add_point(curve_json, point)
        plot_curve(curve, curve_json.with_suffix(".png"))
        say(f"curve point: {json.dumps({k: point[k] for k in ('tokens', 'tau_k3', 'tau_block', 'tau_by_kind')})}; "
            f"{len(curve['points'])} points in {curve_json}")
        return 0
    if args.stage in ("save-replies", "relabel"):
        if not args.replies_file:
            ap.error(f"--stage {args.stage} needs --replies-file")
        try:
            if args.stage == "save-replies":
                res = write_reply_tokens(data_dir, Path(args.replies_file).expanduser())
            else:
                res = {}
                for f in [Path(x.strip()).expanduser() for x in args.replies_file.split(",")]:
                    # a folder per file: corpus ids ("chat-12") repeat across sessions' corpora
                    res[f.name] = relabel_replies(target, f, relabelled_dir / f.name.removesuffix(".npz"),
                                                  RelabelConfig(tap_layers=gen_taps), progress=say,
                                                  stop_after_s=chunk_s, placement=placement)
                    if res[f.name]["prompts_left"]:
                        break
        except ValueError as e:  # no data, another target's file, a file of another format
            ap.error(str(e))
        say(f"{args.stage}: {json.dumps(res)}")
        _write_result(args.json, args.stage, res)
        return 0
    if not args.out:
        ap.error(f"--stage {args.stage} needs --out")
    if args.stage in ("all", "generate"):
        corpus_file = work / "corpus.jsonl"
        if corpus_file.exists():
            corpus = load_corpus(corpus_file)
        else:
            n_code, n_docs = int(args.prompts * args.code_share), int(args.prompts * args.docs_share)
            say("building the prompt corpus (reads the installed Python sources and renders man pages: minutes)")
            sizer = tokenizer_of(LlamaModel(target)) if args.long_docs else None  # long asks are sized in tokens
            corpus = build_corpus(n_code=n_code, n_chat=args.prompts - n_code - n_docs, n_docs=n_docs, seed=args.seed,
                                  n_long_docs=args.long_docs, tokenizer=sizer)
            work.mkdir(parents=True, exist_ok=True)
            save_corpus(corpus, corpus_file)
        corpus = without_heldout(corpus)
        earlier = [Path(x).expanduser() for x in args.skip_prompts_of.split(",")] if args.skip_prompts_of else []
        corpus = without_prompts_of(corpus, earlier)
        say(f"corpus: {len(corpus)} prompts ({corpus_file}; HumanEval, the bench's prompts, the learning "
            f"curve's held-out prompts{' and the prompts of ' + ', '.join(map(str, earlier)) if earlier else ''} "
            "excluded)")
        long_asks = any(p.kind == "docqa-long" for p in corpus)
        res = generate_dataset(target, corpus, data_dir, GenConfig(
            tap_layers=gen_taps, n_parallel=args.parallel, max_new_tokens=args.max_new_tokens,
            max_prompt_tokens=args.max_prompt_tokens or (LONG_ASK_TOKENS[1] if long_asks else 384),
            replies=args.replies), progress=say,
            stop_after_s=chunk_s, placement=placement)
        res["gpu"] = args.gpu
        say(f"generation: {json.dumps(res)}")
        _write_result(args.json, "generate", res)
        if args.stage == "generate":
            return 0
    if args.stage == "label":
        docs_file = work / "documents.jsonl"
        if docs_file.exists():
            docs = load_documents(docs_file)
        else:  # the list a text folder resumes by (installing a package changes what the machine holds)
            docs = offline_documents()
            work.mkdir(parents=True, exist_ok=True)
            save_documents(docs, docs_file)
        say(f"offline text: {len(docs)} documents (Python sources, Debian documentation, man pages)")
        try:
            res = label_text(target, docs, text_dir, LabelConfig(tap_layers=gen_taps, window=args.label_window,
                                                                 max_windows_per_doc=args.label_windows_per_doc),
                             progress=say, stop_after_s=chunk_s, placement=placement)
        except ValueError as e:  # a text folder of another window
            ap.error(str(e))
        res["gpu"] = args.gpu
        say(f"labelling: {json.dumps(res)}")
        _write_result(args.json, "label", res)
        return 0

    # the target's replies: generated here, and relabelled from reply files (each in its own folder)
    replies = [d for d in [data_dir, *sorted(relabelled_dir.glob("*"))] if (d / "meta.json").exists()] or [data_dir]
    sources = {"generated": replies, "text": [text_dir]}
    wanted = [x.strip() for x in args.sources.split(",")]
    if unknown := [x for x in wanted if x not in sources]:
        ap.error(f"--sources: unknown {unknown}; expected generated and/or text")
    tag = "-".join(map(str, taps)) + ("" if wanted == ["generated"] else "-" + "+".join(wanted))
    packed = work / f"packed-{tag}"
    data = packed_data([d for x in wanted for d in sources[x]], packed, taps, say)
    cfg = TrainConfig(n_layer=n_layers, draft_vocab=args.draft_vocab, epochs=args.epochs,
                      anchors_per_seq=args.anchors, text_anchors_per_seq=args.text_anchors, lr=args.lr,
                      gamma=args.gamma, kl_weight=args.kl_weight,
                      reply_labels=args.reply_labels,
                      max_steps=args.max_steps, new_layer_lr=args.new_layer_lr,
                      bf16=bf16_is_fast(args.device) if args.bf16 is None else args.bf16,
                      block_lengths=[int(x) for x in args.block_lengths.split(",")],
                      block_probs=[float(x) for x in args.block_probs.split(",")],
                      holdout=min(48, max(2, len(data) // 10)), device=args.device)
    prior = 0
    if args.warm_start:
        model, prior = load_drafter_gguf(Path(args.warm_start).expanduser(), target)
        prior = prior if prior is not None else args.prior_tokens
        if prior is None:
            ap.error(f"{args.warm_start} does not say how many tokens it was trained on: pass --prior-tokens")
        if list(model.c.target_layers) != taps:
            ap.error(f"{args.warm_start} reads taps {model.c.target_layers}, not --taps {args.taps}")
        if args.layers and args.layers < model.c.n_layer:
            ap.error(f"{args.warm_start} has {model.c.n_layer} layers: --layers {args.layers} cannot drop any")
        cfg.new_layers = n_layers - model.c.n_layer
        model = grow_layers(model, n_layers, TargetWeights(target), info.n_layer)
        cfg.n_layer, cfg.draft_vocab = model.c.n_layer, len(model.d2t)
    else:
        model = build_drafter(target, data, cfg)
    n_data_tokens = int((data.lengths - data.n_prompt).sum())
    say(f"{len(data)} sequences; drafter {model.trainable_parameters() / 1e6:.1f}M trainable parameters, "
        f"draft vocabulary {len(model.d2t)}")
    ckpt = work / (f"ckpt-L{cfg.n_layer}-{tag}" + ("-warm" if args.warm_start else ""))
    t0 = time.time()
    if args.stage in ("all", "train"):
        try:
            state = train(model, data, cfg, ckpt, progress=say)
        except ValueError as e:  # a checkpoint folder of another run (train says which and what to do)
            ap.error(str(e))
        say(f"training done: {json.dumps(state['history'][-1])}")
    else:
        ck = torch.load(ckpt / "last.pt", weights_only=False)
        model.load_state_dict(ck["model"])
    # the farthest context it has learned to read: its data's longest sequence, or a warm start's if longer
    span = max(int(data.lengths.max()), (trained_span(warm) or 0) if warm else 0)
    out = export_gguf(model, target, args.out, dtype=args.dtype, tokens=prior + n_data_tokens, span=span)
    say(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {(time.time() - t0) / 60:.1f} min")
    hist = json.loads((ckpt / "history.json").read_text())["history"]
    card = write_card(out, target, ckpt, data.meta, len(data), n_data_tokens,
                      dict(Counter(data.kinds.tolist())), float(hist[-1].get("minutes", 0.0)),
                      data.meta.get("generation_seconds"), list(argv if argv is not None else sys.argv[1:]),
                      warm_start=(Path(args.warm_start).name, prior, warm.n_layer) if args.warm_start else None)
    say(f"wrote {card}")
    return 0


def _write_result(path: str | None, stage: str, result: dict) -> None:
    if path:
        Path(path).write_text(json.dumps({"run": run_info(), "stage": stage, "result": result}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""Training goes on from a drafter file (a warm start), and the learning curve
measures drafter files on a fixed held-out set: tiny targets, seconds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from app.distill.corpus import CorpusPrompt, save_corpus  # noqa: E402
from app.distill.curve import HELDOUT_SETS, add_point, heldout_prompts, measure, plot_curve, without_heldout  # noqa: E402
from app.distill.export import export_gguf, load_drafter_gguf  # noqa: E402
from app.distill.generate import GenConfig, generate_dataset  # noqa: E402
from gguf_tools.synth import TinyShape, write_tiny_target  # noqa: E402
from tests.test_distill_parity import _random_drafter  # noqa: E402
from tests.test_distill_pipeline import WORDS  # noqa: E402


def _prompts(n: int, seed: int) -> list[CorpusPrompt]:
    rng = random.Random(seed)
    return [CorpusPrompt(f"p{seed}-{i}", "code", " ".join(rng.choice(WORDS) for _ in range(6)), "raw")
            for i in range(n)]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_drafter_file_loads_back_as_the_model_it_was_written_from(dtype: str, tmp_path: Path) -> None:
    target = write_tiny_target(tmp_path / "t.gguf", "gemma3", seed=5)
    model = _random_drafter(target, gemma=True)
    out = export_gguf(model, target, tmp_path / "d.gguf", dtype=dtype, tokens=123_456)
    back, tokens = load_drafter_gguf(out, target)
    assert tokens == 123_456
    # the file keeps eps as float32 and the target's context length
    assert {**back.c.to_dict(), "rms_eps": 0, "n_ctx": 0} == {**model.c.to_dict(), "rms_eps": 0, "n_ctx": 0}
    assert back.c.rms_eps == pytest.approx(model.c.rms_eps)
    assert torch.equal(back.d2t, model.d2t) and torch.equal(back.head, model.head)
    theirs = dict(back.named_parameters())
    for name, p in model.named_parameters():
        want = p.half().float() if dtype == "f16" and p.ndim == 2 and name != "fc.weight" else p
        assert torch.equal(theirs[name], want), name


def test_a_file_that_is_not_a_drafter_is_named(tmp_path: Path) -> None:
    target = write_tiny_target(tmp_path / "t.gguf", "qwen3", seed=1)
    with pytest.raises(ValueError, match="t.gguf.*not a DFlash drafter"):
        load_drafter_gguf(target, target)


def test_warm_started_training_starts_from_the_file_and_counts_its_tokens(tmp_path: Path) -> None:
    from app.cli import main

    target = write_tiny_target(tmp_path / "target.gguf", "gemma3", TinyShape(n_layer=4), seed=4)
    work = tmp_path / "work"
    generate_dataset(target, _prompts(12, 1), work / "data",
                     GenConfig(tap_layers=[1, 2, 3], n_parallel=4, max_new_tokens=16, replies=1))
    first = tmp_path / "first.gguf"
    base = ["distill", "--target", str(target), "--work", str(work), "--stage", "train", "--taps", "1,3",
            "--draft-vocab", "40", "--epochs", "1", "--anchors", "4", "--max-steps", "4",
            "--lr", "5e-3", "--dtype", "f32"]
    assert main([*base, "--out", str(first)]) == 0
    m1, t1 = load_drafter_gguf(first, target)
    assert t1 and t1 > 0  # the data's reply tokens

    second = tmp_path / "second.gguf"
    assert main([*base, "--out", str(second), "--warm-start", str(first)]) == 0
    m2, t2 = load_drafter_gguf(second, target)
    assert t2 == 2 * t1  # the same data again: its tokens counted on top of the first file's
    assert torch.equal(m2.d2t, m1.d2t)  # the draft vocabulary carried over
    hist = json.loads((work / "ckpt-L1-1-3-warm" / "history.json").read_text())["history"]
    cold = json.loads((work / "ckpt-L1-1-3" / "history.json").read_text())["history"]
    # before its first step the warm run measures the first file's model, not a fresh one
    assert hist[0]["loss"] == pytest.approx(cold[-1]["loss"], rel=1e-5)
    assert hist[0]["loss"] != pytest.approx(cold[0]["loss"], rel=1e-2)

    # a layer more on top of the same file: training starts from the file's function, not from scratch
    third = tmp_path / "third.gguf"
    assert main([*base, "--out", str(third), "--warm-start", str(first), "--layers", "2"]) == 0
    assert load_drafter_gguf(third, target)[0].c.n_layer == 2
    assert "1 layer(s) added in front of its 1, copies of the target's" in third.with_suffix(".md").read_text()
    grown = json.loads((work / "ckpt-L2-1-3-warm" / "history.json").read_text())["history"]
    assert grown[0]["loss"] == pytest.approx(cold[-1]["loss"], rel=1e-5)
    with pytest.raises(SystemExit):  # a warm start never drops layers
        main([*base, "--out", str(tmp_path / "x.gguf"), "--warm-start", str(third), "--layers", "1"])


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_a_grown_drafter_computes_what_it_grew_from_and_its_new_layer_learns(arch: str, tmp_path: Path) -> None:
    from app.distill.target_weights import TargetWeights
    from app.distill.train import TrainConfig, grow_layers, param_groups

    target = write_tiny_target(tmp_path / "t.gguf", arch, TinyShape(n_layer=4), seed=3)
    model = _random_drafter(target, gemma=arch == "gemma3")
    grown = grow_layers(model, 3, TargetWeights(target), 4)
    assert grown.c.n_layer == 3 and grow_layers(model, 2, TargetWeights(target), 4) is model
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(20, 2 * model.c.n_embd, generator=g)
    anchors = torch.tensor([3, 9, 15])
    tokens = torch.randint(0, 64, (3, 8), generator=g)
    want = model(feats, anchors, tokens)
    assert torch.allclose(grown(feats, anchors, tokens), want, atol=1e-5)
    # the trained layers moved up one, unchanged; the new one is the target's layer 1 (4 - 3)
    assert torch.equal(grown.layers[1].wq.weight, model.layers[0].wq.weight)
    assert torch.equal(grown.layers[0].wq.weight, torch.from_numpy(
        TargetWeights(target).get("blk.1.attn_q.weight")).reshape(grown.layers[0].wq.weight.shape))
    opt = torch.optim.SGD(grown.parameters(), lr=0.1)
    for _ in range(2):  # its branches start at zero, and open with training
        opt.zero_grad()
        grown(feats, anchors, tokens).logsumexp(-1).mean().backward()
        opt.step()
    assert not torch.allclose(grown(feats, anchors, tokens), want, atol=1e-3)
    # the grown layer may learn at its own rate: its parameters, and only they, in a group of their own
    groups = param_groups(grown, TrainConfig(n_layer=3, lr=1e-4, new_layers=1, new_layer_lr=1e-3))
    assert [g.get("lr") for g in groups] == [None, 1e-3]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in grown.layers[0].parameters()}
    assert len(param_groups(grown, TrainConfig(n_layer=3, new_layers=1))) == 1
    assert grown.layers[0].wq.weight.grad is not None and grown.layers[0].wq.weight.grad.abs().sum() > 0


def test_the_curve_measures_a_drafter_on_the_held_out_prompts(tmp_path: Path) -> None:
    target = write_tiny_target(tmp_path / "t.gguf", "gemma3", TinyShape(n_layer=4), seed=4)
    held = tmp_path / "held.jsonl"
    save_corpus(_prompts(3, 7), held)
    corpus = _prompts(3, 7)[:2] + _prompts(4, 8)
    assert len(without_heldout(corpus, (held,))) == 4  # the held-out texts never reach training
    chat = heldout_prompts(HELDOUT_SETS["chat"])
    assert {p.kind for p in chat} == {"email", "story", "multilingual"} and without_heldout(chat) == []

    model = _random_drafter(target, gemma=True)
    drafter = export_gguf(model, target, tmp_path / "d.gguf", dtype="f32")
    with pytest.raises(ValueError, match="--prior-tokens"):
        measure(drafter, target, tmp_path / "work", prompts_file=held, progress=lambda m: None)
    point = measure(drafter, target, tmp_path / "work", prior_tokens=1000, prompts_file=held, progress=lambda m: None)
    assert point["tokens"] == 1000 and point["sequences"] == 3 and point["positions"] > 0
    assert (tmp_path / "work" / "held").is_dir()  # each set's replies in a folder of its own
    assert 1.0 <= point["tau_k3"] <= 4.0 and point["tau_k3"] <= point["tau_block"] <= 8.0
    assert len(point["accept_rate_by_pos"]) == 7

    curve_json = tmp_path / "curve.json"
    add_point(curve_json, point)
    add_point(curve_json, {**point, "tokens": 2000, "drafter_sha256": "other"})
    curve = add_point(curve_json, point)  # measured again: replaces its point
    assert [p["tokens"] for p in curve["points"]] == [1000, 2000]
    assert plot_curve(curve, tmp_path / "curve.png").stat().st_size > 10_000


def test_bf16_autocast_trains_and_exports_a_drafter_llama_cpp_loads(tmp_path: Path) -> None:
    from app.cli import main
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.params import GenerationParams

    target = write_tiny_target(tmp_path / "target.gguf", "gemma3", TinyShape(n_layer=4), seed=4)
    work = tmp_path / "work"
    generate_dataset(target, _prompts(12, 2), work / "data",
                     GenConfig(tap_layers=[1, 3], n_parallel=4, max_new_tokens=16, replies=1))
    out = tmp_path / "d.gguf"
    assert main(["distill", "--target", str(target), "--work", str(work), "--stage", "train", "--taps", "1,3",
                 "--draft-vocab", "40", "--epochs", "2", "--anchors", "8", "--lr", "5e-3", "--bf16",
                 "--block-lengths", "8", "--block-probs", "1", "--out", str(out)]) == 0
    hist = json.loads((work / "ckpt-L1-1-3" / "history.json").read_text())
    assert hist["config"]["bf16"] and hist["config"]["block_lengths"] == [8]
    assert "bfloat16 autocast, master weights f32" in out.with_suffix(".md").read_text()
    assert hist["history"][-1]["loss"] < hist["history"][0]["loss"]
    e = Engine(target, out, EngineConfig(n_ctx=512))
    p = e.tokenize("the cat sat on the mat")
    plain = [t for ev in e.generate(p, GenerationParams(max_tokens=24, speculative=False)) for t in ev.tokens]
    assert [t for ev in e.generate(p, GenerationParams(max_tokens=24)) for t in ev.tokens] == plain
    e.close()

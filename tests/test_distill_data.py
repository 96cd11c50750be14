"""The two sources of distillation data on a tiny target: replies decoded together in split KV
streams (further replies from a copied prompt cache), and labels over offline text. Every stored
feature row and label is checked against a fresh single-sequence decode of the same tokens."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from app.distill.corpus import CorpusPrompt, HumanEvalGuard, offline_prompts  # noqa: E402
from app.distill.dataset import TEXT_KINDS, DistillData, Sequence, pack, packed_data  # noqa: E402
from app.distill.generate import SIBLING, GenConfig, generate_dataset  # noqa: E402
from app.distill.offline_text import (  # noqa: E402
    OfflineDocument,
    load_documents,
    man_pages,
    read_document,
    save_documents,
)
from app.distill.shards import from_bf16  # noqa: E402
from app.distill.teacher_forced import LabelConfig, label_text  # noqa: E402
from app.distill.train import make_batch  # noqa: E402
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch  # noqa: E402
from gguf_tools.synth import TinyShape, write_tiny_target  # noqa: E402

WORDS = "the a of to and in is it that he was for on are with as his they at one have this from or".split()
TAPS = [1, 2, 3]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target.gguf", "gemma3", TinyShape(n_layer=4), seed=2)


def _fresh(target: Path, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(taps, argmax) of every position of `tokens` decoded alone in a new context."""
    model = LlamaModel(target)
    ctx = LlamaContext(model, ContextConfig(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1))
    ctx.enable_taps(TAPS)
    batch = TokenBatch(512)
    batch.set(tokens, 0, True)
    ctx.decode(batch)
    out = ctx.taps(len(tokens)), ctx.logits_rows(len(tokens)).argmax(1)
    ctx.close()
    model.close()
    return out


def _assert_matches_fresh_decode(target: Path, seq: Sequence, label_rows_from: int) -> None:
    feats, argmax = _fresh(target, [int(t) for t in seq.tokens[:-1]])
    np.testing.assert_allclose(from_bf16(np.asarray(seq.features)), feats, rtol=1 / 64, atol=1e-3)
    # label row j is the target's choice after tokens[:label_rows_from + j]
    want = argmax[label_rows_from - 1:]
    assert np.array_equal(seq.topk_ids[:len(want), 0], want), seq.index


@pytest.mark.parametrize("replies", [2, 3])
def test_replies_in_split_streams_and_further_replies_match_a_lone_decode(target: Path, tmp_path: Path,
                                                                           replies: int) -> None:
    rng = random.Random(0)
    prompts = [CorpusPrompt(f"p{i}", "code", " ".join(rng.choice(WORDS) for _ in range(3 + i % 7)), "raw")
               for i in range(12)]
    cfg = GenConfig(tap_layers=TAPS, n_parallel=4, max_new_tokens=24, shard_size=5, greedy_fraction=1.0, n_threads=1,
                    replies=replies)
    res = generate_dataset(target, prompts, tmp_path / "data", cfg)
    # (the tiny model's replies all run to max_new_tokens, in step: each further reply reuses its own slot's
    # prompt; the copy from another slot is checked below)
    assert res["sequences"] == 12 * replies and res["further_replies"] == 12 * (replies - 1), res
    data = DistillData(pack(tmp_path / "data", tmp_path / "packed", TAPS))
    ids = [str(x) for x in data.prompt_ids]
    further = {n: [i for i, x in enumerate(ids) if x.endswith(f"{SIBLING}{n}")] for n in range(2, replies + 1)}
    assert all(len(v) == 12 for v in further.values()), further
    for i in range(len(data)):
        seq = data[i]
        _assert_matches_fresh_decode(target, seq, seq.n_prompt)
        if seq.greedy:  # a greedy reply is the target's own argmax at every step
            assert np.array_equal(seq.tokens[seq.n_prompt:], seq.topk_ids[:, 0])
    for n, rows in further.items():  # a further reply reads the same prompt as the first, and samples its own
        for i in rows:
            first = data[ids.index(ids[i][:-len(f"{SIBLING}{n}")])]
            assert not data[i].greedy and np.array_equal(data[i].tokens[:first.n_prompt],
                                                         first.tokens[:first.n_prompt])
    # resumable: a second run finds every prompt done
    assert generate_dataset(target, prompts, tmp_path / "data", cfg)["sequences"] == 0


def test_a_prompt_cache_copied_to_another_stream_decodes_as_a_lone_prompt(target: Path) -> None:
    """What a second reply from another slot rests on: seq_cp between split KV streams, the first
    reply's tokens removed, then a token decoded in the copy."""
    model = LlamaModel(target)
    ctx = LlamaContext(model, ContextConfig(n_ctx=4 * 128, n_batch=128, n_ubatch=128, n_threads=1, n_seq_max=4))
    ctx.enable_taps(TAPS)
    prompt = model.tokenize("the cat sat on the mat and the dog", add_special=True)
    reply = model.tokenize(" was in the house", add_special=False)
    batch = TokenBatch(128)
    n = len(prompt) + len(reply)
    batch.set_rows(np.array(prompt + reply, np.int32), np.arange(n, dtype=np.int32), np.full(n, 2, np.int32),
                   np.zeros(n, np.int8))
    ctx.decode(batch)
    ctx.seq_cp(2, 1)
    ctx.seq_rm(len(prompt), -1, seq=1)
    nxt = reply[0] ^ 1
    batch.set_rows(np.array([nxt], np.int32), np.array([len(prompt)], np.int32), np.array([1], np.int32),
                   np.ones(1, np.int8))
    ctx.decode(batch)
    got_taps, got_logits = ctx.taps(1)[0], ctx.logits_rows(1)[0].copy()
    ctx.close()
    model.close()
    feats, _ = _fresh(target, prompt + [nxt])
    np.testing.assert_allclose(got_taps, feats[-1], rtol=1e-4, atol=1e-5)
    fresh_model = LlamaModel(target)
    c2 = LlamaContext(fresh_model, ContextConfig(n_ctx=128, n_batch=128, n_ubatch=128, n_threads=1))
    b2 = TokenBatch(128)
    b2.set(prompt + [nxt], 0, np.arange(len(prompt) + 1) == len(prompt))
    c2.decode(b2)
    np.testing.assert_allclose(got_logits, c2.logits_rows(1)[0], rtol=1e-4, atol=1e-4)
    c2.close()
    fresh_model.close()


def _docs(root: Path, n: int) -> list[OfflineDocument]:
    rng = random.Random(3)
    out = []
    for i in range(n):
        p = root / f"doc{i}.txt"
        p.write_text(" ".join(rng.choice(WORDS) for _ in range(160 + 40 * i)))
        out.append(OfflineDocument(f"prose:{p}", "prose", p))
    return out


def test_labels_over_text_are_the_targets_argmax_with_its_features_and_resume(target: Path, tmp_path: Path) -> None:
    docs = _docs(tmp_path, 4)
    guard = HumanEvalGuard()
    # a window that overlaps an evaluation text is dropped: make the last document one
    text = read_document(docs[-1])
    guard.shingles.update(" ".join(text.split())[i:i + guard.SHINGLE] for i in range(0, 200, 20))
    cfg = LabelConfig(tap_layers=TAPS, window=64, max_windows_per_doc=3, shard_size=2, n_threads=1)
    out = tmp_path / "text"
    first = label_text(target, docs[:2], out, cfg, guard=guard)
    assert first["documents_done"] == 2 and first["windows"] > 0
    assert len(packed_data(out, tmp_path / "packed", TAPS)) == first["windows"]
    res = label_text(target, docs, out, cfg, guard=guard)  # resumes after the two documents done
    assert res["documents_done"] == 4 and res["windows_guarded"] >= 1
    assert label_text(target, docs, out, cfg, guard=guard)["windows"] == 0
    data = packed_data(out, tmp_path / "packed", TAPS)  # packed again: the resumed run added shards
    ids = [str(x) for x in data.prompt_ids]
    assert len(ids) == len(set(ids)) == first["windows"] + res["windows"]
    assert not any(x.startswith(f"prose:{docs[-1].path}#") for x in ids)
    for i in range(len(data)):
        seq = data[i]
        assert seq.kind == "text-prose" and seq.n_prompt == 1 and len(seq.tokens) == 64
        _assert_matches_fresh_decode(target, seq, 1)


def test_a_document_shorter_than_a_long_window_gives_one_window_and_the_window_is_kept(target: Path,
                                                                                       tmp_path: Path) -> None:
    """Long windows (distill --label-window) teach far context: a document shorter than one gives a single
    window of what it has (if it has min_tokens); a folder labelled in one window size refuses another."""
    docs = _docs(tmp_path, 2)
    m = LlamaModel(target)
    n_toks = [len(m.tokenize(read_document(d), add_special=False)) for d in docs]
    n_bos = int(m.add_bos())
    m.close()
    out = tmp_path / "text"
    cfg = LabelConfig(tap_layers=TAPS, window=max(n_toks) + 50, min_tokens=min(n_toks) + 1, n_threads=1)
    res = label_text(target, docs, out, cfg, guard=HumanEvalGuard())
    assert res["windows"] == 1  # the shorter document is below min_tokens, the longer one whole
    seq = packed_data(out, tmp_path / "packed", TAPS)[0]
    assert len(seq.tokens) == n_bos + max(n_toks) and seq.n_prompt == 1
    _assert_matches_fresh_decode(target, seq, 1)
    with pytest.raises(ValueError, match="windows of"):
        label_text(target, docs, out, LabelConfig(tap_layers=TAPS, window=64), guard=HumanEvalGuard())


def test_a_chunk_ends_on_time(target: Path, tmp_path: Path) -> None:
    res = label_text(target, _docs(tmp_path, 3), tmp_path / "text", LabelConfig(tap_layers=TAPS, window=64),
                     stop_after_s=0.0, guard=HumanEvalGuard())
    assert res["documents_done"] == 0 and res["windows"] == 0


def test_text_and_argmax_reply_labels_are_the_targets_choice_not_the_next_token() -> None:
    class _Model:  # what make_batch reads of a drafter: its mask token and draft vocabulary map
        class c:
            mask_token_id = 0
        _t2d_np = np.arange(100)

    tokens = np.arange(10, 30)
    choice = (tokens[1:] + 50) % 100  # the target would have written other tokens
    topk = np.stack([choice, choice], 1)
    argmax = np.concatenate([[tokens[0]], choice])
    # a sampled reply's own tokens by default, the target's argmax with argmax_labels; offline text: always argmax
    for kind, argmax_labels, want in (("code", False, tokens), ("code", True, argmax), (TEXT_KINDS[0], False, argmax)):
        seq = Sequence(0, kind, False, tokens, 1, np.zeros((19, 4), np.uint16), topk, topk.astype(np.float16))
        b = make_batch(seq, _Model(), 4, 4, np.random.default_rng(0), argmax_labels=argmax_labels)
        a = b["anchors"].numpy()
        assert np.array_equal(b["labels"][:, 0].numpy(), want[a + 1]), (kind, argmax_labels)
        assert np.array_equal(b["labels"][:, 2].numpy(), want[a + 3]), (kind, argmax_labels)


def test_a_text_window_draws_its_own_anchor_count() -> None:
    from app.distill.train import TrainConfig, anchors_for  # noqa: PLC0415

    feats = np.zeros((1, 4), np.uint16)
    reply = Sequence(0, "code", True, np.arange(2), 1, feats, np.zeros((1, 2), np.int64), np.zeros((1, 2), np.float16))
    window = Sequence(0, TEXT_KINDS[1], False, np.arange(2), 1, feats, reply.topk_ids, reply.topk_logits)
    assert [anchors_for(s, TrainConfig(anchors_per_seq=32)) for s in (reply, window)] == [32, 32]
    cfg = TrainConfig(anchors_per_seq=32, text_anchors_per_seq=256)
    assert [anchors_for(s, cfg) for s in (reply, window)] == [32, 256]


@pytest.mark.skipif(not Path("/usr/bin/man").exists() or not man_pages(), reason="no man(1) or man pages here")
def test_man_pages_render_to_plain_paragraphs() -> None:
    pages = man_pages()
    text = read_document(next((p for p in pages if p.path.name.startswith("ls.1")), pages[0]))
    assert text is not None and text.startswith("NAME\n") and "\x08" not in text
    assert not any(len(line) > 200 and "  " * 20 in line for line in text.splitlines())  # no padded title line


@pytest.mark.skipif(not Path("/usr/bin/man").exists() or not man_pages(), reason="no man(1) or man pages here")
def test_offline_prompts_ask_about_a_numbered_source_as_docs_ask_does() -> None:
    from app.documents.answer import INSTRUCTIONS  # noqa: PLC0415 - only this test reads it

    chat, asks = offline_prompts(random.Random(1), n_chat=6, n_docs=6)
    assert len(chat) == 6 and {k for k, _ in chat} <= {"summary", "explain"}
    assert len(asks) == 6
    for a in asks:
        assert f"{INSTRUCTIONS}\n\n[1] " in a and a.rstrip().endswith("Assistant:")
        assert "gcloud" not in a or sum("gcloud" in x for x in asks) <= 1


def test_the_document_list_is_saved_as_it_was(tmp_path: Path) -> None:
    """A text folder resumes by counting documents in its own list, not in today's machine."""
    docs = _docs(tmp_path, 3)
    save_documents(docs, tmp_path / "documents.jsonl")
    assert load_documents(tmp_path / "documents.jsonl") == docs


def test_replies_saved_as_tokens_relabel_to_what_generation_stored_and_resume(target: Path, tmp_path: Path) -> None:
    from app.distill.reply_tokens import RelabelConfig, relabel_replies, write_reply_tokens

    rng = random.Random(3)
    prompts = [CorpusPrompt(f"p{i}", "chat" if i % 2 else "code", " ".join(rng.choice(WORDS) for _ in range(4 + i)),
                            "raw") for i in range(8)]
    # greedy and sampled replies, further ones from a prompt's cache, one batch over all of them
    generate_dataset(target, prompts, tmp_path / "data", GenConfig(tap_layers=TAPS, n_parallel=4, max_new_tokens=12,
                                                                   shard_size=5, greedy_fraction=0.5, n_threads=1,
                                                                   replies=2, seed=1))
    saved = write_reply_tokens(tmp_path / "data", tmp_path / "replies.npz")
    assert saved["sequences"] == 16 and saved["reply_tokens"] == 16 * 12, saved
    shard_bytes = sum(s.stat().st_size for s in (tmp_path / "data").glob("shard-*.npz"))
    assert saved["bytes"] * 20 < shard_bytes, (saved, shard_bytes)  # tokens only: what a repository can keep

    cfg = RelabelConfig(tap_layers=TAPS, shard_size=5, n_threads=1)
    stopped = relabel_replies(target, tmp_path / "replies.npz", tmp_path / "re", cfg, stop_after_s=0)
    assert stopped["sequences"] == 0 and stopped["prompts_left"] == 8, stopped
    done = relabel_replies(target, tmp_path / "replies.npz", tmp_path / "re", cfg)
    assert done["sequences"] == 16 and done["prompts_left"] == 0, done
    assert relabel_replies(target, tmp_path / "replies.npz", tmp_path / "re", cfg)["sequences"] == 0

    gen = DistillData(pack(tmp_path / "data", tmp_path / "packed-gen", TAPS))
    rel = DistillData(pack(tmp_path / "re", tmp_path / "packed-re", TAPS))
    where = {str(x): i for i, x in enumerate(rel.prompt_ids)}
    assert sorted(where) == sorted(str(x) for x in gen.prompt_ids)
    assert {bool(g) for g in gen.greedy} == {True, False}
    for i in range(len(gen)):
        a, b = gen[i], rel[where[str(gen.prompt_ids[i])]]
        assert (a.kind, a.greedy, a.n_prompt) == (b.kind, b.greedy, b.n_prompt)
        assert np.array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(from_bf16(np.asarray(b.features)), from_bf16(np.asarray(a.features)),
                                   rtol=1 / 64, atol=1e-3)
        assert np.array_equal(a.topk_ids[:, 0], b.topk_ids[:, 0]), i
        _assert_matches_fresh_decode(target, b, b.n_prompt)


def test_a_reply_file_of_another_target_or_no_file_is_refused_by_name(target: Path, tmp_path: Path) -> None:
    from app.distill.reply_tokens import RelabelConfig, relabel_replies, write_reply_tokens

    other = write_tiny_target(tmp_path / "other.gguf", "gemma3", TinyShape(n_layer=4), seed=5)
    generate_dataset(other, [CorpusPrompt("p0", "code", "the a of", "raw")], tmp_path / "data",
                     GenConfig(tap_layers=TAPS, n_parallel=1, max_new_tokens=4, n_threads=1, replies=1))
    write_reply_tokens(tmp_path / "data", tmp_path / "other.npz")
    cfg = RelabelConfig(tap_layers=TAPS, n_threads=1)
    with pytest.raises(ValueError, match="other.npz: replies of another target"):
        relabel_replies(target, tmp_path / "other.npz", tmp_path / "re", cfg)
    (tmp_path / "junk.npz").write_bytes(b"not a file of replies")
    with pytest.raises(ValueError, match="junk.npz: not a reply-tokens file"):
        relabel_replies(target, tmp_path / "junk.npz", tmp_path / "re", cfg)
    with pytest.raises(ValueError, match="empty: no generated replies"):
        write_reply_tokens(tmp_path / "empty", tmp_path / "x.npz")

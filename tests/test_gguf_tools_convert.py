"""The converter against llama.cpp's reference converter (pinned sdist), on
synthetic z-lab checkpoints, and its converted drafters in the real engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from gguf_tools.convert import ConversionError, convert_checkpoint, is_zlab_checkpoint
from gguf_tools.pair import check_pair
from gguf_tools.synth_hf import write_hf_target, write_zlab_checkpoint

pytest.importorskip("transformers")  # the reference converter imports it
pytest.importorskip("sentencepiece")

from native import config as native_config

_SDIST_NAME = f"llama_cpp_python-{native_config.LLAMA_CPP_PYTHON_VERSION}"
SDIST = native_config.cache_root() / "sdist" / f"{_SDIST_NAME}.tar.gz"  # fetched by `make setup`
_TREE = f"{_SDIST_NAME}/vendor/llama.cpp/"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """convert_hf_to_gguf.py of the pinned llama.cpp tree, extracted from the sdist."""
    if not SDIST.exists():
        pytest.skip(f"{SDIST} missing (run make setup)")
    out = tmp_path_factory.mktemp("refconv")
    with tarfile.open(SDIST) as tf:
        members = [m for m in tf.getmembers()
                   if m.name == _TREE + "convert_hf_to_gguf.py" or m.name.startswith(_TREE + "conversion/")]
        tf.extractall(out, members=members, filter="data")
    return out / _TREE / "convert_hf_to_gguf.py"


def run_reference(script: Path, *args: str) -> None:
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture(scope="module")
def hf_target(reference: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(HF target folder, its GGUF converted by the reference, vocab size)."""
    base = tmp_path_factory.mktemp("hftarget")
    tdir = write_hf_target(base / "tiny-llama")
    out = base / "tiny-llama-f32.gguf"
    run_reference(reference, str(tdir), "--outfile", str(out), "--outtype", "f32")
    return tdir, out, json.loads((tdir / "config.json").read_text())["vocab_size"]


def gguf_contents(path: Path) -> tuple[dict, dict, list[str]]:
    """(metadata key -> (types, value), tensor name -> (type, shape, bytes), tensor order)."""
    r = gguf.GGUFReader(path)
    meta = {k: (tuple(f.types), f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), np.asarray(t.data).tobytes())
               for t in r.tensors}
    return meta, tensors, [t.name for t in r.tensors]


def assert_same_gguf(ref: Path, ours: Path) -> dict:
    rm, rt, ro = gguf_contents(ref)
    om, ot, oo = gguf_contents(ours)
    assert sorted(rm) == sorted(om), (set(rm) ^ set(om))
    for key in rm:
        assert rm[key] == om[key], f"metadata {key}: reference {rm[key]!r:.200} ours {om[key]!r:.200}"
    assert sorted(rt) == sorted(ot), (set(rt) ^ set(ot))
    for name in rt:  # tensor by tensor: type, shape and every byte of the data
        assert rt[name][:2] == ot[name][:2], f"{name}: reference {rt[name][:2]} ours {ot[name][:2]}"
        assert rt[name][2] == ot[name][2], f"{name}: values differ"
    assert ro == oo
    return om


def test_converter_equals_reference_on_zlab_checkpoint(reference: Path, hf_target, tmp_path: Path) -> None:
    tdir, target_gguf, vocab = hf_target
    ckpt = write_zlab_checkpoint(tmp_path / "Tiny-DFlash-b8", vocab_size=vocab, mask_token_id=3,
                                 target_layer_ids=[0, 2], block_size=8)
    assert is_zlab_checkpoint(ckpt)
    ref = tmp_path / "ref.gguf"
    run_reference(reference, str(ckpt), "--target-model-dir", str(tdir), "--outfile", str(ref))
    ours = convert_checkpoint(ckpt, target_gguf, tmp_path / "ours.gguf")
    meta = assert_same_gguf(ref, ours)
    assert meta["dflash.target_layers"][1] == [1, 3]  # HF ids + 1
    assert meta["tokenizer.ggml.mask_token_id"][1] == 3
    assert meta["general.file_type"][1] == gguf.LlamaFileType.MOSTLY_BF16
    assert check_pair(target_gguf, ours, tap_archs=("llama",)).ok


@pytest.mark.parametrize("outtype", ["auto", "q8_0"])
def test_converter_equals_reference_with_every_dflash_option(reference: Path, hf_target, tmp_path: Path,
                                                              outtype: str) -> None:
    """Sharded f16 weights, interleaved RoPE (permuted to NeoX), YaRN, SWA, value
    scale, logit scale and softcap, embedding scale, partial rotary, non-causal."""
    tdir, target_gguf, vocab = hf_target
    ckpt = write_zlab_checkpoint(
        tmp_path / "rich", vocab_size=vocab, mask_token_id=3, target_layer_ids=[0, 1, 2], block_size=10, n_layer=3,
        dtype="float16", shards=2,
        extra_dflash_config={"attention_value_scale": 0.5, "output_multiplier": 0.25, "final_logit_softcapping": 30.0,
                             "input_embedding_scale": 8.0, "use_swa": True, "swa_window_size": 256, "causal": False},
        extra_config={"rope_is_neox_style": False, "partial_rotary_factor": 0.5,
                      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                                       "beta_fast": 32.0, "beta_slow": 1.0}})
    ref = tmp_path / "ref.gguf"
    run_reference(reference, str(ckpt), "--target-model-dir", str(tdir), "--outfile", str(ref), "--outtype", outtype)
    meta = assert_same_gguf(ref, convert_checkpoint(ckpt, target_gguf, tmp_path / "ours.gguf", outtype))
    for key in ("dflash.attention.sliding_window", "dflash.rope.scaling.type", "dflash.attention.value_scale",
                "dflash.logit_scale", "dflash.final_logit_softcapping", "dflash.embedding_scale",
                "dflash.rope.dimension_count", "dflash.attention.causal"):
        assert key in meta, key
    assert meta["dflash.block_size"][1] == 10


def test_converted_drafter_drafts_in_the_engine(hf_target, tmp_path: Path) -> None:
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.params import GenerationParams

    _, target_gguf, vocab = hf_target
    ckpt = write_zlab_checkpoint(tmp_path / "ck", vocab_size=vocab, mask_token_id=3, target_layer_ids=[0, 2],
                                 block_size=8)
    drafter = convert_checkpoint(ckpt, target_gguf, tmp_path / "d.gguf")
    e = Engine(target_gguf, drafter, EngineConfig(n_ctx=256))
    try:
        assert e.block_size == 8 and e.target_layers == [1, 3] and e.mask_token == 3
        prompt = e.tokenize("the quick brown fox")
        plain = [t for ev in e.generate(prompt, GenerationParams(max_tokens=12, speculative=False)) for t in ev.tokens]
        e.reset()
        evs = list(e.generate(prompt, GenerationParams(max_tokens=12)))
        spec = [t for ev in evs for t in ev.tokens]
        assert evs[-1].stats.drafted > 0  # the drafter ran
        assert spec == plain  # tiny F32 target: greedy output is exact
    finally:
        e.close()


@pytest.mark.gemma
def test_convert_for_the_real_gemma_target(gemma_target: Path, tmp_path: Path) -> None:
    """A z-lab-format checkpoint shaped for Gemma 3 270M: its 262k-token tokenizer is
    copied from the real GGUF, the pair checks pass and the engine drafts with it."""
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.params import GenerationParams

    ckpt = write_zlab_checkpoint(tmp_path / "gemma-dflash", hidden_size=640, n_layer=1, n_head=4, n_head_kv=1,
                                 head_dim=256, intermediate_size=1024, vocab_size=262144, mask_token_id=4,
                                 target_layer_ids=[1, 8, 14], block_size=16,
                                 extra_dflash_config={"input_embedding_scale": math.sqrt(640)})
    out = convert_checkpoint(ckpt, gemma_target, tmp_path / "gemma-dflash.gguf")
    rep = check_pair(gemma_target, out)
    assert rep.ok, rep.problems
    e = Engine(gemma_target, out, EngineConfig(n_ctx=512))
    try:
        evs = list(e.generate(e.tokenize("Hello"), GenerationParams(max_tokens=6, draft_max=3)))
        assert evs[-1].stats.drafted > 0 and evs[-1].stats.n_generated == 6
    finally:
        e.close()


# --- bad input: a clear error naming the file, nothing written ----------------------------------------

def _ckpt(tmp_path: Path, vocab: int, **kw) -> Path:
    args = {"vocab_size": vocab, "mask_token_id": 3, "target_layer_ids": [0, 2]} | kw
    return write_zlab_checkpoint(tmp_path / "ck", **args)


@pytest.mark.parametrize("kw, words", [
    ({"hidden_size": 32}, "hidden size 32 but the target's is 64"),
    ({"vocab_size": 50}, "vocabulary of 50 tokens"),
    ({"target_layer_ids": [0, 5]}, "target layer 5, but the target has 4 layers"),
    ({"mask_token_id": 999}, "mask token id 999 is outside"),
])
def test_mismatched_checkpoint_is_rejected(hf_target, tmp_path: Path, kw: dict, words: str) -> None:
    _, target_gguf, vocab = hf_target
    ckpt = _ckpt(tmp_path, vocab, **kw)
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match="does not fit target") as ei:
        convert_checkpoint(ckpt, target_gguf, out)
    assert words in str(ei.value) and str(ckpt) in str(ei.value)
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_truncated_safetensors_is_rejected_and_nothing_is_written(hf_target, tmp_path: Path) -> None:
    _, target_gguf, vocab = hf_target
    ckpt = _ckpt(tmp_path, vocab)
    st = ckpt / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match="truncated") as ei:
        convert_checkpoint(ckpt, target_gguf, out)
    assert str(st) in str(ei.value)
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_corrupt_safetensors_header_is_rejected(hf_target, tmp_path: Path) -> None:
    _, target_gguf, vocab = hf_target
    ckpt = _ckpt(tmp_path, vocab)
    st = ckpt / "model.safetensors"
    raw = bytearray(st.read_bytes())
    raw[8:16] = b"\x00garbage"
    st.write_bytes(bytes(raw))
    with pytest.raises(ConversionError, match="not valid JSON"):
        convert_checkpoint(ckpt, target_gguf, tmp_path / "out.gguf")


def test_not_a_dflash_checkpoint(hf_target, tmp_path: Path) -> None:
    tdir, target_gguf, _ = hf_target
    assert not is_zlab_checkpoint(tdir)
    with pytest.raises(ConversionError, match="not a DFlash drafter"):
        convert_checkpoint(tdir, target_gguf, tmp_path / "out.gguf")
    with pytest.raises(ConversionError, match="not a folder"):
        convert_checkpoint(tmp_path / "nope", target_gguf, tmp_path / "out.gguf")


def test_dflash2_and_unknown_tensors_are_refused(hf_target, tmp_path: Path) -> None:
    _, target_gguf, vocab = hf_target
    ckpt = _ckpt(tmp_path, vocab, extra_dflash_config={"conv_kernel_size": 4, "selector_rank": 8})
    with pytest.raises(ConversionError, match="DFlash2"):
        convert_checkpoint(ckpt, target_gguf, tmp_path / "out.gguf")
    import torch
    from safetensors.torch import save_file

    ckpt = write_zlab_checkpoint(tmp_path / "ck2", vocab_size=vocab, mask_token_id=3, target_layer_ids=[0, 2])
    save_file({"markov_head.weight": torch.zeros(4, 4)}, str(ckpt / "model-extra.safetensors"))
    with pytest.raises(ConversionError, match="'markov_head.weight' is not part of a DFlash drafter"):
        convert_checkpoint(ckpt, target_gguf, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_cli_convert(hf_target, tmp_path: Path) -> None:
    from gguf_tools.__main__ import main

    _, target_gguf, vocab = hf_target
    ckpt = _ckpt(tmp_path, vocab)
    out = tmp_path / "cli.gguf"
    assert main(["convert", str(ckpt), "--target", str(target_gguf), "--out", str(out)]) == 0
    assert check_pair(target_gguf, out, tap_archs=("llama",)).ok
    assert main(["convert", str(ckpt), "--target", str(tmp_path / "missing.gguf"), "--out", str(out)]) == 2


@pytest.fixture(scope="module")
def dflash2_converted(hf_target, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a DFlash2-shaped z-lab checkpoint for the HF target: conv, selector over the top 4, sliding
    window; the GGUF `convert` made of it)."""
    from gguf_tools.synth import DFlash2Shape

    _, target_gguf, vocab = hf_target
    base = tmp_path_factory.mktemp("dflash2-convert")
    ckpt = write_zlab_checkpoint(base / "Tiny-DFlash2", vocab_size=vocab, mask_token_id=3,
                                 target_layer_ids=[0, 2], block_size=8, dflash2=DFlash2Shape())
    return ckpt, convert_checkpoint(ckpt, target_gguf, base / "ours.gguf")


def test_dflash2_equals_reference_and_loads_with_its_selector(reference: Path, hf_target, dflash2_converted,
                                                              tmp_path: Path) -> None:
    """A DFlash2-shaped checkpoint (conv, selector, sliding window): our file equals the reference's
    byte for byte, and the pinned llama.cpp loads it as DFlash2 (its loader checks every conv and
    selector shape against the keys, and refuses a DFlash2 file missing them); FlashDesk's loop drafts
    from it, and the reply is plain decoding's."""
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.params import GenerationParams
    from gguf_tools.formats import DFLASH2, draft_format
    from gguf_tools.reader import read_gguf

    tdir, target_gguf, _ = hf_target
    ckpt, ours = dflash2_converted
    ref = tmp_path / "ref.gguf"
    run_reference(reference, str(ckpt), "--target-model-dir", str(tdir), "--outfile", str(ref))
    meta = assert_same_gguf(ref, ours)
    assert meta["dflash.selector_top_k"][1] == 4 and meta["dflash.attention.sliding_window"][1] == 2048
    assert draft_format(read_gguf(ours)).format == DFLASH2
    assert check_pair(target_gguf, ours, tap_archs=("llama",)).ok
    e = Engine(target_gguf, ours, EngineConfig(n_ctx=256, n_threads=1))
    try:
        assert e.drafter_format == DFLASH2
        prompt = e.tokenize("the quick brown fox")
        runs = [list(e.generate(prompt, GenerationParams(max_tokens=24, speculative=s))) for s in (False, True)]
        plain, spec = ([t for ev in r for t in ev.tokens] for r in runs)
        assert spec == plain and runs[1][-1].stats.drafted > 0
    finally:
        e.close()


@pytest.mark.slow
def test_llama_server_runs_the_converted_dflash2_with_its_selector(hf_target, dflash2_converted) -> None:
    """The GGUF `convert` makes of a DFlash2-shaped checkpoint, as llama-server runs it (`flashdesk bench`'s
    upstream-dflash): loaded with its selector (the loader's line), as draft-dflash, drafting from the
    lattice (no drafter row read by a sampler: llama.cpp's debug log has no draft candidate), and the
    reply is FlashDesk's plain decoding's."""
    from server_once import complete_on_server, plain_tokens

    _, target_gguf, _ = hf_target
    prompt, plain = plain_tokens(target_gguf, "the quick brown fox", 24)
    entry, spec_log, log = complete_on_server("upstream-dflash@3", target_gguf, dflash2_converted[1], prompt, 24)
    assert entry["tokens"] == plain and entry["drafted"] > 0
    assert any("adding speculative implementation 'draft-dflash'" in x for x in spec_log), spec_log
    assert any("DFlash2 conv kernel" in x and "top-k = 4" in x for x in spec_log), spec_log
    assert "draft candidate" not in log

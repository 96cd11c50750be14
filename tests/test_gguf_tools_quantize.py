"""quantize through llama.cpp's quantizer: types, the sensitive-tensor option,
the quantized drafter still pairs, loads and drafts; bad input; the tau sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.distill.quant_tau import main as quant_tau_main
from app.distill.quant_tau import parse_variant
from app.errors import ModelLoadError
from gguf_tools.__main__ import main as tools_main
from gguf_tools.pair import check_pair
from gguf_tools.quantize import SENSITIVE_PATTERNS, QuantizeError, quantize
from gguf_tools.reader import read_gguf

SENSITIVE = ("fc.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight")


def _drafts(target: Path, drafter: Path, n_ctx: int = 256, text: str = "the cat") -> int:
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.params import GenerationParams

    e = Engine(target, drafter, EngineConfig(n_ctx=n_ctx))
    try:
        evs = list(e.generate(e.tokenize(text), GenerationParams(max_tokens=6, draft_max=3)))
        assert evs[-1].stats.n_generated == 6
        return evs[-1].stats.drafted
    finally:
        e.close()


@pytest.mark.parametrize("ftype, expect", [("Q8_0", "Q8_0"), ("Q5_0", "Q5_0")])
def test_quantize_tiny_drafter(tiny_pair: tuple[Path, Path], tmp_path: Path, ftype: str, expect: str) -> None:
    target, drafter = tiny_pair
    res = quantize(drafter, tmp_path / "q.gguf", ftype)
    assert res.bytes_out < res.bytes_in
    assert res.tensor_types["blk.0.ffn_up.weight"] == expect
    assert res.tensor_types["blk.0.attn_norm.weight"] == "F32"  # norms stay F32
    assert read_gguf(res.output).get("dflash.target_layers") == [1, 3]  # metadata survives
    assert check_pair(target, res.output, tap_archs=("qwen3",)).ok
    assert _drafts(target, Path(res.output)) > 0


def test_an_all_f16_drafter_is_refused_because_its_fc_would_overflow(tiny_pair: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="fc.*65504"):
        quantize(tiny_pair[1], tmp_path / "f16.gguf", "F16")
    assert not list(tmp_path.iterdir())


def test_keep_sensitive_keeps_fc_and_kv_at_higher_precision(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, drafter = tiny_pair
    plain = quantize(drafter, tmp_path / "plain.gguf", "Q8_0")
    mixed = quantize(drafter, tmp_path / "mixed.gguf", "Q8_0", keep_sensitive="F16")
    for name in SENSITIVE:
        assert plain.tensor_types[name] == "Q8_0"
        assert mixed.tensor_types[name] == ("F32" if name == "fc.weight" else "F16"), name
    for name in ("blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.1.ffn_down.weight"):
        assert mixed.tensor_types[name] == "Q8_0"
    assert mixed.bytes_out > plain.bytes_out
    assert _drafts(target, Path(mixed.output)) > 0
    assert len(SENSITIVE_PATTERNS) == 3


def test_explicit_tensor_override_through_the_cli(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "o.gguf"
    assert tools_main(["quantize", str(tiny_pair[1]), str(out), "--type", "Q8_0",
                       "--tensor-type", r"ffn_down\.weight$=F16", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tensor_types"]["blk.1.ffn_down.weight"] == "F16"
    assert res["tensor_types"]["blk.1.ffn_up.weight"] == "Q8_0"


def test_quantize_target(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    res = quantize(tiny_pair[0], tmp_path / "t.gguf", "Q8_0")
    assert res.tensor_types["blk.0.attn_q.weight"] == "Q8_0"
    assert check_pair(res.output, tiny_pair[1], tap_archs=("qwen3",)).ok


@pytest.mark.gemma
def test_mixed_q4_drafter_for_gemma_loads_and_drafts(gemma_target: Path, gemma_random_drafter: Path,
                                                     tmp_path: Path) -> None:
    res = quantize(gemma_random_drafter, tmp_path / "g.gguf", "Q4_K_M", keep_sensitive="Q8_0")
    assert res.tensor_types["fc.weight"] == "Q8_0" and res.tensor_types["blk.0.attn_k.weight"] == "Q8_0"
    assert res.tensor_types["blk.0.ffn_down.weight"] in ("Q4_K", "Q5_0", "Q6_K")
    assert res.bytes_out < res.bytes_in * 0.6
    assert check_pair(gemma_target, res.output).ok
    assert _drafts(gemma_target, Path(res.output), n_ctx=512, text="Hello") > 0


def test_bad_inputs_are_clear_errors_and_leave_nothing(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    drafter = tiny_pair[1]
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(drafter.read_bytes()[:20000])
    out = tmp_path / "out.gguf"
    with pytest.raises(ModelLoadError, match="truncated"):
        quantize(trunc, out, "Q8_0")
    with pytest.raises(QuantizeError, match="unknown quantization type 'Q9_X'"):
        quantize(drafter, out, "Q9_X")
    with pytest.raises(QuantizeError, match="unknown tensor type"):
        quantize(drafter, out, "Q8_0", keep_sensitive="Q7")
    with pytest.raises(QuantizeError, match="overwrite the input"):
        quantize(drafter, drafter, "Q8_0")
    q = quantize(drafter, tmp_path / "q8.gguf", "Q8_0")
    with pytest.raises(QuantizeError, match="cannot be requantized"):
        quantize(q.output, out, "Q4_0")
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_tau_sweep_prints_json_per_variant(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    assert parse_variant("q4_k_m+q8_0") == ("Q4_K_M", "Q8_0") and parse_variant("F16") == ("F16", None)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "the cat is on the mat", "format": "raw"}) + "\n")
    full = tmp_path / "full.json"
    rc = quant_tau_main(["--target", str(tiny_pair[0]), "--drafter", str(tiny_pair[1]), "--prompts", str(prompts),
                         "--variants", "Q8_0,Q8_0+F16", "--max-tokens", "8", "--draft-max", "3",
                         "--out-dir", str(tmp_path), "--json", str(full)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary) == {"Q8_0", "Q8_0+F16"}
    detail = json.loads(full.read_text())
    for r in detail["variants"]:
        # the summary is the prompts' counts pooled (tokens per verify pass; accepted / drafted)
        rows = r["prompts"]
        steps, acc, drafted = (sum(x[k] for x in rows) for k in ("steps", "accepted", "drafted"))
        assert (r["steps"], r["accepted"], r["drafted"]) == (steps, acc, drafted) and drafted > 0
        assert summary[r["variant"]]["tau"] == pytest.approx((acc + steps) / steps, abs=1e-4)
        assert summary[r["variant"]]["acceptance_rate"] == pytest.approx(acc / drafted, abs=1e-4)
        assert sum(r["accept_by_pos"]) == acc
        assert all(0 < x["drafted"] <= 3 * x["steps"] for x in rows)  # --draft-max 3 is honoured
    # each variant was measured on its own file, quantized as asked
    files = {r["variant"]: Path(r["file"]) for r in detail["variants"]}
    assert files["Q8_0+F16"] == tmp_path / "tiny-qwen3-dflash-Q8_0-keep-F16.gguf"
    types = {v: {t.name: t.type_name for t in read_gguf(f).tensors} for v, f in files.items()}
    assert types["Q8_0"]["blk.0.ffn_up.weight"] == "Q8_0" == types["Q8_0+F16"]["blk.0.ffn_up.weight"]
    assert types["Q8_0"]["blk.0.attn_k.weight"] == "Q8_0" and types["Q8_0+F16"]["blk.0.attn_k.weight"] == "F16"
    assert types["Q8_0"]["fc.weight"] == "Q8_0" != types["Q8_0+F16"]["fc.weight"]  # kept (F32 stays F32)

"""The `flashdesk` command: generate, bench and doctor print JSON a script can use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main


def test_generate_json_on_tiny_pair(tiny_pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    t, d = tiny_pair
    assert main(["generate", "--target", str(t), "--drafter", str(d), "--prompt", "the cat sat on",
                 "--max-tokens", "20", "--json", "--draft-mode", "fixed"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"text", "prompt_tokens", "tokens", "stats"}
    assert len(out["tokens"]) == 20 and out["draft_mode"] == "fixed" and out["stats"]["drafted"] > 0
    st = out["stats"]
    for k in ("steps", "drafted", "accepted", "tau", "accept_by_pos", "t_draft_s", "t_verify_s", "t_total_s",
              "tokens_per_s"):
        assert k in st
    assert len(st["accept_by_pos"]) == 7  # block size 8
    assert main(["generate", "--target", str(t), "--drafter", str(d), "--prompt", "the cat sat on",
                 "--max-tokens", "20", "--json", "--no-spec"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["tokens"] == out["tokens"] and plain["stats"]["drafted"] == 0 and plain["draft_mode"] == "plain"


@pytest.mark.parametrize("pair", ["tiny_dflash2_pair", "tiny_dspark_pair"])
def test_generate_with_each_dflash_format_is_plain_decoding(pair: str, request: pytest.FixtureRequest,
                                                            capsys: pytest.CaptureFixture) -> None:
    """A DFlash2 and a DSpark drafter (gguf_tools synth) drive the same loop: fixed drafts, the
    hybrid and the adaptive controller all give plain decoding's tokens."""
    t, d = request.getfixturevalue(pair)
    base = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", "the cat sat on", "--max-tokens", "24",
            "--json"]
    assert main([*base, "--no-spec"]) == 0
    plain = json.loads(capsys.readouterr().out)["tokens"]
    for mode in ("fixed", "hybrid", "adaptive"):
        assert main([*base, "--draft-mode", mode]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["tokens"] == plain, mode
        if mode == "fixed":
            assert out["stats"]["drafted"] > 0


def _pass_source_model(source: str, request: pytest.FixtureRequest) -> list[str]:
    """The model options that load `source` (the drafts a pass per token) on tiny random models."""
    if source == "mtp":  # the target's own head: no second file
        return ["--target", str(request.getfixturevalue("tiny_mtp_target")), "--no-drafter"]
    if source == "eagle3":
        target, eagle3 = request.getfixturevalue("tiny_eagle3_pair")
        return ["--target", str(target), "--drafter", str(eagle3)]
    return ["--target", str(request.getfixturevalue("tiny_pair")[0]), "--no-drafter",
            "--draft-model", str(request.getfixturevalue("tiny_draft_model"))]


@pytest.mark.parametrize("source", ["mtp", "eagle3", "draft-model"])
def test_generate_with_each_pass_source_is_plain_decoding(source: str, request: pytest.FixtureRequest,
                                                          capsys: pytest.CaptureFixture) -> None:
    """`flashdesk generate --draft-mode mtp|eagle3|draft-model` end to end: the source's drafts of
    --draft-max every step, and the controller over that source alone, give `--draft-mode plain`'s tokens."""
    base = ["generate", *_pass_source_model(source, request), "--prompt", "the cat sat on the mat and",
            "--max-tokens", "24", "--threads", "1", "--json"]
    assert main([*base, "--draft-mode", "plain"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["stats"]["drafted"] == 0 and len(plain["tokens"]) == 24
    assert main([*base, "--draft-mode", source, "--draft-max", "3"]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert fixed["tokens"] == plain["tokens"] and fixed["draft_mode"] == source
    by_source = {k: v for k, v in fixed["stats"]["drafted_by_source"].items() if v}
    assert by_source == {source: fixed["stats"]["drafted"]} and fixed["stats"]["drafted"] >= 3
    assert main([*base, "--draft-mode", source]) == 0
    ctl = json.loads(capsys.readouterr().out)
    assert ctl["tokens"] == plain["tokens"]
    assert not {k for k, v in ctl["stats"]["drafted_by_source"].items() if v} - {source}


def test_no_mtp_leaves_the_targets_head_unused(tiny_mtp_target: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    """--no-mtp (generate, bench, serve: every command that opens the pair): the target loads without its
    head, so the mtp mode drafts nothing and decodes plain; without it the head drafts."""
    from app.cli import build_parser
    from app.cli.common import open_engine
    from app.cli.serve import cmd_serve

    model = ["--target", str(tiny_mtp_target), "--no-drafter", "--threads", "1"]
    gen = ["generate", *model, "--prompt", "the cat sat on the mat and", "--max-tokens", "16", "--json",
           "--draft-mode", "mtp", "--draft-max", "3"]
    assert main(gen) == 0
    on = json.loads(capsys.readouterr().out)
    assert on["stats"]["drafted_by_source"]["mtp"] > 0
    assert main([*gen, "--no-mtp"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["stats"]["drafted"] == 0 and off["tokens"] == on["tokens"]

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p", "prompt": "the cat sat on", "format": "raw"}) + "\n")
    bench = ["bench", *model, "--prompts", str(prompts), "--mode", "plain,mtp", "--draft-max", "3",
             "--max-tokens", "12", "--no-check", "--json", str(tmp_path / "bench.json")]
    assert main(bench) == 0
    entry = json.loads((tmp_path / "bench.json").read_text())["prompts"][0]["modes"]["mtp"]
    assert entry["drafted_by_source"]["mtp"] > 0 and entry["identical"]
    with pytest.raises(ValueError, match=r"the mode mtp needs .*\(turned off for this load\)"):
        main([*bench, "--no-mtp"])
    capsys.readouterr()

    args = build_parser().parse_args(["serve", *model, "--no-mtp", "--port", "0"])
    assert args.func is cmd_serve  # which opens its pair with open_engine(args), as here
    e = open_engine(args)
    try:
        assert "mtp" not in e.sources and e.mtp_unused == "turned off for this load"
    finally:
        e.close()


def test_generate_reports_a_truncated_drafter_clearly(tiny_pair: tuple[Path, Path],
                                                      capsys: pytest.CaptureFixture) -> None:
    bad = tiny_pair[1].parent / "truncated.gguf"
    bad.write_bytes(tiny_pair[1].read_bytes()[:5000])
    assert main(["generate", "--target", str(tiny_pair[0]), "--drafter", str(bad), "--prompt", "the"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "truncated" in err


def test_bench_hands_out_the_result_so_far_after_each_prompt(tiny_pair: tuple[Path, Path]) -> None:
    """A long bench that is stopped keeps what it measured: the CLI writes these to --json."""
    from app.bench.prompt_sets import BenchPrompt
    from app.bench.runner import bench
    from app.engine.dflash import Engine, EngineConfig

    e = Engine(*tiny_pair, EngineConfig(n_ctx=512, n_threads=1))
    try:
        seen: list[dict] = []
        prompts = [BenchPrompt(id=f"p{i}", prompt=p, category="tiny", format="raw")
                   for i, p in enumerate(["the cat sat on", "a dog ran to"])]
        final = bench(e, prompts, ["plain", "fixed"], max_tokens=8, partial=seen.append)
    finally:
        e.close()
    assert len(seen) == 1 and seen[0]["complete"] is False
    assert [r["id"] for r in seen[0]["prompts"]] == ["p0"] and "complete" not in final
    assert [r["id"] for r in final["prompts"]] == ["p0", "p1"]



def test_bench_repeats_every_mode_and_keeps_the_median_run(tiny_pair: tuple[Path, Path]) -> None:
    """--repeat 3: three runs of every mode per prompt; the entry is the run of median tokens/s, and
    the speedup is between the two medians."""
    from app.bench.prompt_sets import BenchPrompt
    from app.bench.runner import bench, median_run

    assert median_run([{"tokens_per_s": 3.0}, {"tokens_per_s": 1.0}, {"tokens_per_s": 2.0}]) == {
        "tokens_per_s": 2.0, "tokens_per_s_runs": [3.0, 1.0, 2.0]}
    assert median_run([{"tokens_per_s": 4.0}, {"tokens_per_s": 1.0}])["tokens_per_s"] == 1.0  # the lower middle
    from app.engine.dflash import Engine, EngineConfig

    e = Engine(*tiny_pair, EngineConfig(n_ctx=512, n_threads=1))
    try:
        res = bench(e, [BenchPrompt(id="p", prompt="the cat sat on", category="tiny", format="raw")],
                    ["plain", "fixed"], max_tokens=8, repeat=3)
        with pytest.raises(ValueError, match="repeat 0"):
            bench(e, [], ["plain"], repeat=0)
    finally:
        e.close()
    assert res["repeat"] == 3
    m = res["prompts"][0]["modes"]
    for mode in ("plain", "fixed"):
        runs = m[mode]["tokens_per_s_runs"]
        assert len(runs) == 3 and m[mode]["tokens_per_s"] == sorted(runs)[1]
    assert m["fixed"]["speedup"] == pytest.approx(m["fixed"]["tokens_per_s"] / m["plain"]["tokens_per_s"])
    assert m["fixed"]["identical"]

# slow (make test-slow): the bench calibrates a pair it has not seen (~50 s on two cores, the random
# drafter is new every session), then 8 generations and their lossless checks: ~2 min quiet
@pytest.mark.slow
@pytest.mark.gemma
def test_bench_on_gemma_with_a_synthetic_drafter_is_lossless(gemma_target: Path, gemma_random_drafter: Path,
                                                             tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "code", "prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "format": "raw",
                    "category": "code"}) + "\n"
        + json.dumps({"id": "chat", "prompt": "What is the capital of France?", "category": "chat"}) + "\n")
    out = tmp_path / "bench.json"
    png = tmp_path / "bench.png"
    assert main(["bench", "--target", str(gemma_target), "--drafter", str(gemma_random_drafter), "--prompts",
                 str(prompts), "--max-tokens", "16", "--draft-max", "3", "--mode",
                 "plain,plain-again,fixed,adaptive", "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads(out.read_text())
    assert [r["id"] for r in res["prompts"]] == ["code", "chat"]
    assert res["tokens_per_s_definition"].startswith("tokens after the first step")  # the one clock, said
    for r in res["prompts"]:
        f = r["modes"]["fixed"]
        assert f["lossless"] is True and f["hard_mismatches"] == []
        assert {"speedup", "tau", "identical", "near_ties", "tokens_per_s"} <= set(f)
        assert r["modes"]["plain"]["tokens_per_s"] > 0
        again = r["modes"]["plain-again"]  # the noise band: plain decoding is deterministic, only its speed varies
        assert again["identical"] is True and "lossless" not in again
    s = res["summary"]
    assert set(s["by_category"]) == {"code", "chat"}
    assert s["overall"]["fixed"]["lossless"] is True and s["overall"]["adaptive"]["lossless"] is True
    # a random drafter never pays: the controller settles on plain decoding
    ks = res["prompts"][0]["modes"]["adaptive"]["k_history"]
    assert ks.count(0) >= len(ks) // 2
    # the plot drawn again from the JSON alone; a file that is no bench result is said in one line
    again = tmp_path / "again.png"
    assert main(["bench-plot", str(out), "--plot", str(again)]) == 0
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bench-plot", str(prompts), "--plot", str(again)]) == 2


def test_doctor_json() -> None:
    res = subprocess.run([sys.executable, "-m", "app.cli", "doctor", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    from native import config

    variant = config.default_variant()  # cpu; cuda under FLASHDESK_CUDA=1 make test
    assert rep["variant"] == variant and rep["llama_cpp_python"] == "0.3.36"
    assert len(rep["patch_hash"]) == 64
    assert "gemma3" in rep["tap_architectures"]
    cpu = [d for d in rep["devices"] if d["type"] == "cpu"]
    assert cpu and cpu[0]["memory_total"] > 0
    # a CUDA build that sees no GPU says so; the CPU build has nothing to warn of
    no_gpu = variant == "cuda" and not any(d["type"] == "gpu" for d in rep["devices"])
    assert bool(rep["warnings"]) == no_gpu


def test_native_build_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second `make setup` finds the build by its key and builds nothing: the cached build is
    left as it was, and neither the sources nor cmake are touched."""
    from native import build, config

    variant = config.default_variant()
    info = config.build_dir(variant) / "build_info.json"
    before = (info.stat().st_mtime_ns, info.read_bytes())
    res = subprocess.run([sys.executable, "-m", "native.build"], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert res.returncode == 0, res.stderr
    assert f"cached: {config.build_dir(variant)}" in res.stdout + res.stderr
    assert (info.stat().st_mtime_ns, info.read_bytes()) == before

    def no_build(*_a, **_kw):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a cached build must not fetch sources or run cmake")

    monkeypatch.setattr(build, "fetch_sdist", no_build)
    monkeypatch.setattr(build, "run_streamed", no_build)
    assert build.build(variant) == config.build_dir(variant)
    key = config.build_key("cpu")
    assert key.startswith("0.3.36-cpu-") and (config.build_dir("cpu") / "build_info.json").exists()
    assert config.build_key("cpu") != config.build_key("cuda")


def test_cuda_runtime_libs_found_in_load_order(tmp_path: Path) -> None:
    """The CUDA build records cudart and cuBLAS by full path (a PyPI cuBLAS is
    never on the loader's path), for native.lib to preload before libllama."""
    from native.build import cuda_runtime_libs

    toolkit, wheel = tmp_path / "cuda" / "lib64", tmp_path / "cublas" / "lib"
    toolkit.mkdir(parents=True)
    wheel.mkdir(parents=True)
    for f in (toolkit / "libcudart.so.13", toolkit / "libcudart.so.12", wheel / "libcublas.so.13",
              wheel / "libcublasLt.so.13"):
        f.write_bytes(b"")
    got = cuda_runtime_libs([toolkit, tmp_path / "missing", wheel], "13")
    assert got == [str(toolkit / "libcudart.so.13"), str(wheel / "libcublasLt.so.13"), str(wheel / "libcublas.so.13")]
    assert cuda_runtime_libs([toolkit], "12") == [str(toolkit / "libcudart.so.12")]

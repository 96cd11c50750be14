"""The adaptive draft-length controller: k = 0 when drafts are never accepted,
a long k when they always are, deterministic, and never lossy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine.adaptive import AdaptiveDraftLength, new_adaptive_policy
from app.engine.calibration import CostModel, calibrate, expected_tokens
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import StepTiming
from app.engine.params import GenerationParams

# the CPU cost curve measured on Gemma 3 270M (DESIGN.md): verify of n tokens relative to n = 1
CPU_CURVE = [1.0, 1.37, 1.7, 2.0, 2.4, 2.8, 3.2, 3.7, 3.9, 4.1, 4.3, 4.5, 4.7, 4.8, 5.0, 5.1]


def cpu_costs(draft_ms: float = 5.0) -> CostModel:
    return CostModel(verify_s=[0.0] + [0.021 * r for r in CPU_CURVE], draft_s=[0.0] + [draft_ms / 1e3] * 15,
                     inject_s=0.0005)


def replay(policy: AdaptiveDraftLength, accept: callable, steps: int) -> list[int]:  # noqa: ANN001
    ks = []
    for _ in range(steps):
        k = policy.choose()
        ks.append(k)
        policy.observe(k, accept(k), StepTiming(0.0, 0.0, 0.0))
    return ks


def test_picks_plain_decoding_when_drafts_never_pass() -> None:
    ks = replay(AdaptiveDraftLength(cpu_costs(), 15, refresh_costs=False), lambda k: 0, 200)
    assert ks[-100:].count(0) >= 95  # plain decoding, with rare probes
    assert any(k > 0 for k in ks[50:])  # still probing now and then


def test_probes_back_off_while_partial_acceptance_does_not_pay() -> None:
    """Probes that accept a token half the time still leave plain decoding the best choice on the
    CPU curve: they must grow rarer, not reset to every few steps on each acceptance."""
    p = AdaptiveDraftLength(cpu_costs(), 15, refresh_costs=False)
    probes = iter(range(10**6))
    ks = replay(p, lambda k: min(k, next(probes) % 2) if k else 0, 400)  # 1 accepted on every other probe
    assert p.best_k() == 0
    assert sum(k > 0 for k in ks[-200:]) <= 5  # gap grown to probe_max_gap (64)


def test_picks_a_long_draft_when_drafts_always_pass() -> None:
    ks = replay(AdaptiveDraftLength(cpu_costs(), 15, refresh_costs=False), lambda k: k, 200)
    assert min(ks[-50:]) >= 10


def test_resumes_drafting_when_text_becomes_predictable() -> None:
    p = AdaptiveDraftLength(cpu_costs(), 15, refresh_costs=False)
    replay(p, lambda k: 0, 150)
    assert p.best_k() == 0
    ks = replay(p, lambda k: k, 150)
    assert min(ks[-30:]) >= 8


def test_choice_is_deterministic_given_the_same_measurements() -> None:
    rng = np.random.default_rng(0)
    outcomes = rng.integers(0, 16, size=300)
    runs = []
    for _ in range(2):
        p = AdaptiveDraftLength(cpu_costs(), 15)
        it = iter(outcomes.tolist())
        ks = []
        for _ in range(300):
            k = p.choose()
            ks.append(k)
            p.observe(k, min(k, next(it)), StepTiming(0.004, 0.03, 0.035))
        runs.append(ks)
    assert runs[0] == runs[1]


def test_expected_tokens_and_rates_follow_the_model() -> None:
    assert expected_tokens(np.array([0.5, 0.5]), 2) == pytest.approx(1.75)
    p = AdaptiveDraftLength(cpu_costs(), 15, prior=0.99, refresh_costs=False)
    r = p.rates()
    assert r[0] == pytest.approx(1 / (0.021 + 0.0005), rel=1e-6)
    assert np.argmax(r) > 5  # near-certain acceptance pays for long drafts even on a CPU curve


def test_rates_agree_with_the_cost_model_on_noisy_costs() -> None:
    """rates() is vectorised; it must equal E(k) / cost.step_time(k, E(k)), including step_time's
    reading of a noisy, non-monotone cost curve as non-decreasing."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        c = cpu_costs()
        c.verify_s = [0.0, *rng.uniform(0.01, 0.1, 16)]
        c.draft_s = [0.0, *rng.uniform(0.001, 0.02, 15)]
        p = AdaptiveDraftLength(c, int(rng.integers(1, 16)), prior=float(rng.uniform()), refresh_costs=False)
        p.acc[:] = rng.uniform(0, 5, p.k_max)
        p.tried[:] = p.acc + rng.uniform(0, 5, p.k_max)
        a = p.acceptance
        want = [expected_tokens(a, k) / c.step_time(k, expected_tokens(a, k)) for k in range(p.k_max + 1)]
        assert p.rates() == pytest.approx(want, rel=1e-12)


def _generate(e: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:
    out, ev = [], None
    for ev in e.generate(prompt, params, **kw):
        out += ev.tokens
    return out, ev


@pytest.mark.parametrize("always", [True, False])
def test_forced_drafts_on_the_tiny_pair(tiny_pair: tuple[Path, Path], always: bool) -> None:
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat")
    plain, _ = _generate(e, prompt, GenerationParams(max_tokens=150, speculative=False))

    def forced(hist: list[int], k: int) -> list[int]:
        i = len(hist) - len(prompt)
        d = plain[i:i + k]
        return d if always else [(t + 1) % 64 for t in d]

    # a cost model where drafting is cheap relative to verification, as on a GPU
    cost = CostModel(verify_s=[0.0] + [0.01 * (1 + 0.05 * n) for n in range(16)], draft_s=[0.0] + [0.002] * 15,
                     inject_s=0.0001)
    policy = AdaptiveDraftLength(cost, e.block_size - 1, refresh_costs=False)
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=150), policy=policy, draft_override=forced)
    assert out == plain  # identical whatever k is chosen
    ks = ev.stats.k_history
    if always:
        assert np.mean(ks[-10:]) >= e.block_size - 2
    else:
        assert ks[-40:].count(0) >= 34
    e.close()


def test_calibration_is_cached(tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.engine.calibration as calibration

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path / "flashdesk" / "calibration")
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    a = calibrate(e)
    assert len(a.verify_s) == e.block_size + 1 and all(v > 0 for v in a.verify_s[1:])  # n = 1..block
    assert all(d > 0 for d in a.draft_s[1:])
    assert a.plain_tokens_per_s > 0
    files = list((tmp_path / "flashdesk" / "calibration").glob("*.json"))
    assert len(files) == 1
    b = calibrate(e)
    assert b.verify_s == a.verify_s  # read back, not measured again
    pol = new_adaptive_policy(e)
    assert pol.k_max == e.block_size - 1
    assert pol.cost.verify_s == a.verify_s and pol.cost is not a  # its own copy: refreshing it changes no cache
    e.close()


def test_confidence_truncation_learns_where_drafts_fail() -> None:
    p = AdaptiveDraftLength(cpu_costs(), 15, refresh_costs=False, use_confidence=True)
    conf = np.array([0.99, 0.97, 0.95, 0.3, 0.2, 0.1, 0.05])
    for _ in range(60):  # confident drafts pass, unsure ones fail
        k = p.truncate(conf)
        p.observe(k, min(k, 3), StepTiming(0.0, 0.0, 0.0))
    assert p.truncate(conf) == 3
    assert p.truncate(np.array([0.99] * 7)) >= 5  # sure drafts are kept as far as the CPU cost curve pays
    assert p.truncate(np.array([0.05] * 7)) == 0


def test_engine_calls_truncate_with_drafter_confidence(tiny_pair: tuple[Path, Path]) -> None:
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat")
    plain, _ = _generate(e, prompt, GenerationParams(max_tokens=40, speculative=False))
    seen: list[np.ndarray] = []

    class Recorder(AdaptiveDraftLength):
        def truncate(self, conf: np.ndarray) -> int:
            seen.append(conf)
            return min(2, len(conf))

    pol = Recorder(cpu_costs(draft_ms=0.1), e.block_size - 1, prior=0.99, use_confidence=True, refresh_costs=False)
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=40), policy=pol)
    assert out == plain
    assert seen and all(((c > 0) & (c <= 1)).all() for c in seen)
    assert max(ev.stats.k_history) <= 2
    e.close()

"""`flashdesk verify-cost --compare-build`: another native build measured in alternating child
processes (here the cached build against itself, so the two must load and both be measured)."""

from __future__ import annotations

import pytest

from app.bench import verify_cost
from app.bundled import default_target
from native.lib import build_info


def test_compare_build_measures_both_builds():
    root = build_info().lib_dir.parent
    out = verify_cost.run(default_target(), [1, 2], rounds=1, compare_stock=False, compare_build=root)
    assert out["other_build"] == str(root)
    assert set(out["other"]["ms"]) == {"1", "2", "1-again"}
    assert all(v > 0 for v in out["flashdesk_over_other"].values())


def test_compare_build_refuses_a_folder_that_is_not_a_build(tmp_path):
    with pytest.raises(ValueError, match="not a native build folder"):
        verify_cost.run(default_target(), [1], rounds=1, compare_stock=False, compare_build=tmp_path)

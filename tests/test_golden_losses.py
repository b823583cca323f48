"""Golden per-step losses of the tiny scale's training (tests/golden_tiny.py says what they
are computed from: the shipped base, a pinned split, recorded rollouts; no timing, no
sampling). A change that alters SFT or the RL update shows up here as a diff of numbers,
and so does learning switched off (learning rate 0, advantages negated)."""

from __future__ import annotations

import json

import golden_tiny as g
import pytest

pytestmark = pytest.mark.skipif(not g.GOLDEN.is_file() or not g.ROLLOUTS.is_file(),
                                reason="tests/golden/tiny.json not recorded")


def golden() -> dict:
    return json.loads(g.GOLDEN.read_text())


def close(a: float, b: float) -> bool:
    return abs(a - b) <= g.GOLDEN_RTOL * max(abs(b), 1e-3)


def sft_mismatches(losses: list[float]) -> list[tuple]:
    expected = golden()["sft_loss"]
    return [(i + 1, got, want) for i, (got, want) in enumerate(zip(losses, expected))
            if not close(got, want)] + ([("steps", len(losses), len(expected))]
                                        if len(losses) != len(expected) else [])


def rl_mismatches(steps: list[dict]) -> list[tuple]:
    expected = golden()["rl"]
    out = [(i + 1, key, got[key], want[key]) for i, (got, want) in enumerate(zip(steps, expected))
           for key in ("loss", "kl", "grad_norm") if not close(got[key], want[key])]
    updates, want_updates = [s["updates"] for s in steps], [s["updates"] for s in expected]
    return out + ([("updates", updates, want_updates)] if updates != want_updates else [])


def test_the_golden_file_was_made_from_the_shipped_base():
    assert golden()["base_sha256"] == g.base_digest(), (
        "data/base/tiny changed: re-record (python tests/golden_tiny.py record-rollouts; ... write)")


def test_sft_losses_match_the_golden_file(one_thread):
    losses = g.sft_losses()
    assert not sft_mismatches(losses), sft_mismatches(losses)


def test_rl_updates_replayed_from_recorded_rollouts_match_the_golden_file(one_thread):
    steps = g.rl_losses()
    assert not rl_mismatches(steps), rl_mismatches(steps)
    assert all(s["updates"] >= 1 for s in steps)


def test_learning_switched_off_is_caught(one_thread):
    """Learning rate 0 (SFT and RL) and negated advantages each leave the golden numbers."""
    assert sft_mismatches(g.sft_losses(lambda s: s.update(learning_rate=0.0)))
    assert rl_mismatches(g.rl_losses(lambda s: s.update(learning_rate=0.0)))
    assert rl_mismatches(g.rl_losses(negate_advantages=True))

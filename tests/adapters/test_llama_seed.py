from __future__ import annotations

from worker_adapters.llama import engine_seed


def test_32_bit_seeds_are_kept() -> None:
    assert [engine_seed(s) for s in (0, 1, 42, 2**32 - 2)] == [0, 1, 42, 2**32 - 2]


def test_the_random_sentinel_and_wider_seeds_fold_deterministically() -> None:
    for seed in (2**32 - 1, 2**32, 2**40 + 3, 2**63 - 1):
        folded = engine_seed(seed)
        assert 0 <= folded < 2**32 - 1
        assert folded == engine_seed(seed)
    assert engine_seed(2**32) != engine_seed(2**32 + 1)

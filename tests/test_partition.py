"""The cross-backend contract: counter-based draws that follow their documented rule."""

from __future__ import annotations

from kfca_llm.partition import PEER_SALT, mix32, sample_peers


def test_peer_draw_follows_its_contract():
    """sample_peers (vectorised) against its docstring's rule, written out pair by pair."""
    for n, peers, seed in [(2, 1, 0), (7, 3, 12345), (40, 5, 2**32 - 1), (40, 39, 8), (9, None, 1)]:
        key = mix32(seed ^ PEER_SALT)
        expected = []
        for i in range(n):
            others = sorted((j for j in range(n) if j != i), key=lambda j: (mix32(key ^ ((i << 16) | j)), j))
            expected.append(sorted(others[: peers if peers is not None else n]))
        assert sample_peers(n, peers, seed) == expected

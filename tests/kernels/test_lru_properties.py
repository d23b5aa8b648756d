"""Hypothesis properties of the LRU memory update (kernel path; interpret mode on CPU)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_suite.kernels.lru_memory import lru_memory_update

B, M, D = 3, 4, 2


@settings(max_examples=25, deadline=None)
@given(
    pos=st.lists(st.lists(st.integers(-1, 50), min_size=M, max_size=M), min_size=B, max_size=B),
    extra=st.integers(1, 10),
    seed=st.integers(0, 2**16),
)
def test_lru_properties(pos, extra, seed):
    pos = np.array(pos, np.int32)
    anchor = np.full((B,), pos.max() + extra, np.int32)  # time only moves forward
    rng = np.random.default_rng(seed)
    vec = rng.normal(size=(B, M, D)).astype(np.float32)
    cand = vec + 1.0 + rng.random((B, M, D)).astype(np.float32)  # differs from vec everywhere
    new_vec, new_pos = map(np.asarray, lru_memory_update(vec, pos, cand, anchor, alpha=0.5))
    changed = np.any(new_vec != vec, axis=-1) | (new_pos != pos)
    assert np.all(changed.sum(axis=1) == 1)  # exactly one slot per row
    assert np.all(new_pos >= pos)  # no pos ever decreases
    empties_before, empties_after = (pos < 0).sum(1), (new_pos < 0).sum(1)
    assert np.all(empties_after == np.maximum(empties_before - 1, 0))  # never emptier

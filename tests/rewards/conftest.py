"""Shared by the sandbox's tests: the isolation modes this machine can test, and a pool maker
that skips (with the reason) where a mode cannot be had here."""

import os

import pytest

from jaxrl_suite.rewards.sandbox import SandboxPool, UnisolatedError

SANDBOX_MODES = ["root", "userns"] if os.geteuid() == 0 else ["userns"]


@pytest.fixture(scope="module", params=SANDBOX_MODES)
def mode(request):
    return request.param


@pytest.fixture(scope="session")
def make_pool():
    def make(mode, workers=2, **kwargs):
        """A pool of `mode`, or a skip where this machine cannot make one."""
        try:
            return SandboxPool(workers, mode=mode, **kwargs)
        except (RuntimeError, UnisolatedError) as e:
            pytest.skip(f"no sandbox in mode {mode!r} here: {e}")

    return make

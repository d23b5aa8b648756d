"""The tool executors: local process/thread pools and Ray tasks run the same calls with the same
results, in other processes where they should, and pass exceptions through their futures."""

import concurrent.futures as cf
import os
import sys
import threading
import time

import pytest

from jaxrl_suite.algorithms.executors import (
    LocalToolExecutor,
    RayToolExecutor,
    ToolExecutor,
    make_executor,
)
from jaxrl_suite.envs.text.tools import ToolOutput, run_tool

# A Ray instance for the tests: small, no dashboard, no worker logs on the driver. Ray is not
# given ports, so two pytest-xdist workers can each start one.
RAY_INIT_KWARGS = {"include_dashboard": False, "log_to_driver": False,
                   "object_store_memory": 80 * 2**20}


def pid_and_sum(*xs, scale=1):
    return os.getpid(), scale * sum(xs)


def fail(message):
    raise ValueError(message)


def imported(name):
    return name in sys.modules


def wait_at(barrier):
    barrier.wait(timeout=10)  # only passes if the pool runs two calls at once
    return threading.get_ident()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_calls(ex):
    """The same calls on any executor: sums with their pids, and run_tool's error output."""
    sums = [ex.submit(pid_and_sum, i, i + 1, scale=2) for i in range(6)]
    tool = ex.submit(run_tool, "no_such_tool", {"x": 1}, None)
    assert all(isinstance(f, cf.Future) for f in [*sums, tool])
    pairs = [f.result(timeout=60) for f in sums]
    return [s for _, s in pairs], {p for p, _ in pairs}, tool.result(timeout=60)


def test_process_executor_runs_calls_in_worker_processes():
    with LocalToolExecutor(2) as ex:
        assert isinstance(ex, ToolExecutor) and ex.workers == 2
        workers = ex.warm()
        assert len(workers) == 2 and os.getpid() not in workers
        sums, pids, out = _run_calls(ex)
    assert sums == [2 * (2 * i + 1) for i in range(6)]
    assert pids <= workers
    assert isinstance(out, ToolOutput) and not out.ok
    assert out.text.startswith("error: unknown tool 'no_such_tool'")
    # shutdown() (by __exit__) joined the workers and refuses new calls
    assert not any(_alive(pid) for pid in workers)
    with pytest.raises(RuntimeError):
        ex.submit(pid_and_sum, 1)
    ex.shutdown()  # idempotent


def test_process_executor_uses_forkserver_or_spawn_not_fork():
    with LocalToolExecutor(1) as ex:
        assert ex.start_method in ("forkserver", "spawn")
        assert ex._pool._mp_context.get_start_method() == ex.start_method
    with LocalToolExecutor(1, kind="thread") as ex:
        assert ex.start_method is None


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_exceptions_propagate_through_the_future(kind):
    with make_executor(kind, 1) as ex:
        future = ex.submit(fail, "bad input")
        with pytest.raises(ValueError, match="bad input"):
            future.result(timeout=60)
        assert ex.submit(pid_and_sum, 3, 4).result(timeout=60)[1] == 7  # the worker survived


def test_thread_executor_runs_calls_concurrently_in_this_process():
    barrier = threading.Barrier(2)
    with make_executor("thread", 2) as ex:
        assert isinstance(ex, LocalToolExecutor) and ex.kind == "thread"
        assert ex.warm() == {os.getpid()}
        idents = [f.result(timeout=30) for f in [ex.submit(wait_at, barrier) for _ in range(2)]]
        sums, pids, out = _run_calls(ex)
    assert len(set(idents)) == 2
    assert sums == [2 * (2 * i + 1) for i in range(6)] and pids == {os.getpid()}
    assert not out.ok
    with pytest.raises(RuntimeError):
        ex.submit(pid_and_sum, 1)


def test_preload_imports_modules_in_each_worker():
    with LocalToolExecutor(1) as ex:
        assert not ex.submit(imported, "wave").result(timeout=60)
    with LocalToolExecutor(1, preload=["wave"]) as ex:
        assert ex.submit(imported, "wave").result(timeout=60)
    with LocalToolExecutor(1, preload=["no_such_module_xyz"]) as ex:  # a failed initializer
        with pytest.raises(cf.process.BrokenProcessPool):
            ex.submit(pid_and_sum, 1).result(timeout=60)


def test_bad_kinds_and_worker_counts_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown executor kind 'gpu'") as info:
        make_executor("gpu", 2)
    assert "\n" not in str(info.value) and "process, thread, ray" in str(info.value)
    with pytest.raises(ValueError, match="'fork'"):
        LocalToolExecutor(2, kind="fork")
    with pytest.raises(ValueError, match="workers >= 1"):
        LocalToolExecutor(0)


def test_ray_executor_without_ray_names_the_agents_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"\[agents\]") as info:
        RayToolExecutor()
    assert "\n" not in str(info.value)


class FakeRay:
    """The part of Ray's API RayToolExecutor uses, recording the calls."""

    def __init__(self, initialized=False):
        self.initialized, self.init_calls, self.shutdowns = initialized, [], 0

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.init_calls.append(kwargs)
        self.initialized = True

    def shutdown(self):
        self.shutdowns += 1
        self.initialized = False

    def remote(self, **options):
        return lambda fn: fn

    def cluster_resources(self):
        return {"CPU": 6.0, "memory": 1e9}


@pytest.mark.parametrize("address, expected", [
    (None, {"address": None, "num_cpus": 3, "include_dashboard": False, "log_to_driver": False}),
    ("auto", {"address": "auto", "num_cpus": None, "log_to_driver": False}),
    ("ray://head:10001", {"address": "ray://head:10001", "num_cpus": None,
                          "log_to_driver": False}),
])
def test_ray_executor_init_arguments_and_ownership(monkeypatch, address, expected):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    ex = make_executor("ray", 3, address=address, init_kwargs={"log_to_driver": False})
    assert fake.init_calls == [expected] and ex.owns_ray and ex.workers == 6
    ex.shutdown()
    ex.shutdown()
    assert fake.shutdowns == 1
    running = FakeRay(initialized=True)  # a Ray this process started before: used, not stopped
    monkeypatch.setitem(sys.modules, "ray", running)
    with RayToolExecutor(address=address, num_cpus=3) as ex:
        assert not ex.owns_ray
    assert running.init_calls == [] and running.shutdowns == 0


# ---- Ray ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_env():
    """Ray's module, with this test module's functions pickled by value (Ray workers cannot
    import a test module by name), no usage stats, and no token auth (which would write
    ~/.ray/auth_token, racing with a second pytest-xdist worker doing the same)."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.delenv("RAY_ADDRESS", raising=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        try:
            yield ray
        finally:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


# Runs before `ray_instance` starts Ray (a module's tests run in file order on each xdist worker).
def test_ray_executor_that_started_ray_shuts_it_down(ray_env):
    ray = ray_env
    assert not ray.is_initialized(), "the module's Ray instance is up before this test"
    start = time.perf_counter()
    with make_executor("ray", 1, init_kwargs=RAY_INIT_KWARGS) as ex:
        print(f"ray.init by the executor: {time.perf_counter() - start:.1f} s")
        assert isinstance(ex, RayToolExecutor) and ex.owns_ray and ex.workers == 1
        assert ray.is_initialized()
        pid, total = ex.submit(pid_and_sum, 1, 2).result(timeout=60)
        assert total == 3 and pid != os.getpid()
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(pid_and_sum, 1)


@pytest.fixture(scope="module")
def ray_instance(ray_env):
    """A local Ray instance of 2 CPUs this module shares (started here, not by an executor)."""
    ray = ray_env
    start = time.perf_counter()
    ray.init(num_cpus=2, **RAY_INIT_KWARGS)
    print(f"ray.init: {time.perf_counter() - start:.1f} s")
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_executor_matches_the_local_executor(ray_instance):
    """One test uses the module's instance, so pytest-xdist starts it on one worker only."""
    ray = ray_instance
    with RayToolExecutor() as ex:
        assert isinstance(ex, ToolExecutor)
        assert not ex.owns_ray and ex.workers == 2
        ray_sums, ray_pids, ray_out = _run_calls(ex)
        future = ex.submit(fail, "bad tool")
        with pytest.raises(ValueError, match="bad tool"):
            future.result(timeout=60)
    with LocalToolExecutor(2) as local:
        local_sums, _, local_out = _run_calls(local)
    assert ray_sums == local_sums == [2 * (2 * i + 1) for i in range(6)]
    assert ray_out == local_out and not ray_out.ok
    assert os.getpid() not in ray_pids
    # the executor did not own the fixture's Ray instance, so its shutdown left it running
    assert ray.is_initialized()
    assert ray.get(ray.remote(pid_and_sum).remote(5, 6))[1] == 11
    # while Ray is up in this process a new executor uses it: ray.init is not called again,
    # and address, num_cpus (make_executor's 8) and init_kwargs are not used
    with make_executor("ray", 8, address="auto", init_kwargs={"no_such_option": 1}) as ex:
        assert not ex.owns_ray and ex.workers == 2
        assert ex.submit(pid_and_sum, 1, 1, scale=3).result(timeout=60)[1] == 6
    assert ray.is_initialized()

"""rewards.sandbox: hostile programs score 0 with the right status, and the parent and the pool
keep serving the next program.

Every attack runs twice: through the full sandbox (the audit hook names what it tried) and
with the hook off (`audit=False`), where only the kernel's limits stand: namespaces, read-only
mounts, the dropped uid, the rlimits and the seccomp filter. And every test with a pool runs in
each isolation mode this machine has: "root" and "userns" as root (CI; there the user namespace
is entered by an unused uid standing in for the user), "userns" otherwise. The isolation itself
(hidden files, environment, network, capabilities, the unprivileged user) is tested in
test_sandbox_isolation.py.
"""

import os
import socket
import time
import uuid

import pytest

from jaxrl_suite.rewards.sandbox import (
    Check,
    Limits,
    SandboxPool,
    SandboxResult,
    parse_tests,
    run_tests,
)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/ns/mnt"),
                                reason="the sandbox needs Linux namespaces and /proc")

GOOD = "def f(x):\n    return x * 3 + 1\n"
TESTS = "assert f(2) == 7\nassert f(5) == 16\nassert 31 == f(10)\n"

@pytest.fixture(scope="module")
def pool(make_pool, mode):
    with make_pool(mode, limits=Limits(timeout_s=1.0)) as p:
        assert p.mode == p.isolation["mode"] == mode
        yield p


@pytest.fixture(scope="module")
def kernel_pool(make_pool, mode):
    """The kernel's limits alone: no audit hook."""
    with make_pool(mode, limits=Limits(timeout_s=1.0), audit=False) as p:
        yield p


def sandbox_processes() -> list[int]:
    """Live processes owned by one of this test process's sandbox uids (another pytest-xdist
    worker's sandboxes have their own uids, 1,000,000 + 64 * its pid + slot)."""
    first = 1_000_000 + 64 * os.getpid()
    pids = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and first <= os.stat(f"/proc/{p}").st_uid < first + 64:
                pids.append(int(p))
        except FileNotFoundError:
            pass
    return pids


def run_attack(pool, program, tests=TESTS):
    """Runs the attack, then a good program on the same pool; returns the attack's result."""
    attack, good = pool.run([program, GOOD], [tests, TESTS])
    assert good.status == "ok" and good.reward == 1.0, good
    assert attack.reward == 0.0, attack
    deadline = time.monotonic() + 2.0
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == [], "a sandboxed process outlived its run"
    return attack


def test_good_and_wrong_programs(pool):
    good, wrong, partial, stdlib = pool.run(
        [GOOD, "def f(x):\n    return x * 3\n", "def f(x):\n    return 7\n",
         "import math, itertools, collections, re, functools\n"
         "def f(x):\n    return math.prod([3, x]) + len(re.findall('a', 'a'))\n"], TESTS)
    assert (good.status, good.passed, good.total, good.reward) == ("ok", 3, 3, 1.0)
    assert (wrong.status, wrong.passed, wrong.reward) == ("failed", 0, 0.0)
    assert (partial.status, partial.passed) == ("failed", 1)
    assert partial.reward == pytest.approx(1 / 3)
    assert stdlib.status == "ok", stdlib
    assert pool.isolation["uid_dropped"] == (os.geteuid() == 0)


def test_run_tests_and_output():
    r = run_tests("print('hello')\n" + GOOD, TESTS)
    assert isinstance(r, SandboxResult) and r.status == "ok" and r.output == "hello\n"


TIMEOUTS = {
    "infinite loop": "while True:\n    pass\n",
    "sleep": "import time\ntime.sleep(1000)\n",
    "ignores SIGXCPU": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                       "while True:\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(TIMEOUTS))
def test_timeouts(pool, name):
    start = time.monotonic()
    assert run_attack(pool, TIMEOUTS[name]).status == "timeout"
    assert time.monotonic() - start < 10


def test_timeout_in_a_test_call(kernel_pool):
    r = run_attack(kernel_pool, "def f(x):\n    while True:\n        pass\n")
    assert r.status == "timeout", r


# attack -> (status with the audit hook, statuses with the kernel alone)
ATTACKS = {
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "forbidden", {"error"}),
    "thread bomb": ("import threading, time\nwhile True:\n    threading.Thread("
                    "target=time.sleep, args=(100,), daemon=True).start()\n", "error", {"error"}),
    "double-fork daemon": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                           "    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\n",
                           "forbidden", {"failed"}),
    "10 GB": ("x = bytearray(10 ** 10)\n", "memory", {"memory"}),
    "10 GB in a call": ("def f(x):\n    return len([0] * 10 ** 10)\n", "memory", {"memory"}),
    "recursion crash": ("import sys\nsys.setrecursionlimit(10 ** 6)\ndef r(n):\n"  # C stack
                        "    return sorted([1], key=lambda v: r(n + 1))\nr(0)\n", "error",
                        {"error"}),
    "recursion": ("def f(x):\n    return f(x + 1)\n", "failed", {"failed"}),
    "os.system": ("import os\nos.system('echo hi')\n", "forbidden", {"failed"}),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])\n", "forbidden", {"failed"}),
    "kill the parent": ("import os\nos.kill(os.getppid(), 9)\n", "forbidden", {"error"}),
    "1 GB of output": ("import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 10 ** 6)\n",
                       "output_limit", {"output_limit"}),
    "ctypes segfault": ("import ctypes\nctypes.string_at(0)\n", "forbidden", {"error"}),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attacks(pool, kernel_pool, name):
    program, audited, kernel = ATTACKS[name]
    r = run_attack(pool, program)
    assert r.status == audited, r
    r = run_attack(kernel_pool, program)
    assert r.status in kernel, r
    assert os.getppid() > 0  # the test process and its parent are alive


def test_crashes_name_the_signal(kernel_pool):
    r = run_attack(kernel_pool, "import ctypes\nctypes.string_at(0)\n")
    assert "SIGSEGV" in r.detail


def test_socket_connect_to_a_local_listener(pool, kernel_pool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
               "s.sendall(b'pwned')\n" + GOOD)
    try:
        assert run_attack(pool, program).status == "forbidden"
        assert run_attack(kernel_pool, program).status == "error"
        with pytest.raises(socket.timeout):
            server.accept()  # nobody connected
    finally:
        server.close()


@pytest.mark.parametrize("impl", ["bpf", "pyseccomp"])
def test_network_without_a_namespace_uses_seccomp(make_pool, mode, impl):
    if impl == "pyseccomp":
        pytest.importorskip("pyseccomp")
    elif os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip(f"the built-in seccomp filter does not know {os.uname().machine}")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    program = (f"import socket\nsocket.create_connection(('127.0.0.1', "
               f"{server.getsockname()[1]}), timeout=1)\n" + GOOD)
    try:
        with make_pool(mode, 1, audit=False, namespaces=("mount", "pid", "ipc", "uts"),
                       seccomp=impl) as p:
            assert p.isolation["seccomp"] == impl and not p.isolation.get("network")
            r = p.run([program], TESTS)[0]
        assert r.status == "error" and "PermissionError" in r.detail
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_writes_outside_the_workdir(pool, kernel_pool, tmp_path):
    targets = [str(tmp_path / "pwned"), f"/var/tmp/jaxrl-sandbox-{uuid.uuid4().hex}"]
    program = "".join(f"open({t!r}, 'w').write('x')\n" for t in targets) + GOOD
    assert run_attack(pool, program).status == "forbidden"
    assert run_attack(kernel_pool, program).status == "error"
    # inside its own working directory a program may write
    inside = "open('scratch.txt', 'w').write('x')\n" + GOOD
    assert pool.run([inside], TESTS)[0].status == "ok"
    for t in targets:
        assert not os.path.exists(t)


def test_parent_environment_is_not_readable(pool, kernel_pool, monkeypatch):
    monkeypatch.setenv("JAXRL_SANDBOX_SECRET", "s3cret")
    program = (
        "import os\n"
        "def f(x):\n"
        "    found = os.environ.get('JAXRL_SANDBOX_SECRET', 'none')\n"
        "    for p in os.listdir('/proc'):\n"
        "        try:\n"
        "            data = open('/proc/%s/environ' % p, 'rb').read()\n"
        "        except Exception:\n"
        "            continue\n"
        "        for item in data.split(b'\\0'):\n"
        "            if item.startswith(b'JAXRL_SANDBOX_SECRET='):\n"
        "                found = item.split(b'=', 1)[1].decode()\n"
        "    return found\n")
    for p in (pool, kernel_pool):
        r = run_attack(p, program, "assert f(0) == 's3cret'\n")
        assert r.status == "failed"


FAKES = {
    "sys.exit(0) first": "import sys\nsys.exit(0)\n",
    "os._exit(0) first": "import os\nos._exit(0)\n",
    "exit after defining": "def f(x):\n    return 0\nraise SystemExit(0)\n",
    "redefine AssertionError": "import builtins\nclass Never(Exception):\n    pass\n"
                               "builtins.AssertionError = Never\nAssertionError = Never\n"
                               "def f(x):\n    return 0\n",
    "always-equal object": "class Any:\n    def __eq__(self, other):\n        return True\n"
                           "def f(x):\n    return Any()\n",
    "int subclass equal to all": "class I(int):\n    def __eq__(self, other):\n"
                                 "        return True\n    __hash__ = int.__hash__\n"
                                 "def f(x):\n    return I(0)\n",
    "write fake result lines": "import os\nfor i in range(3):\n"
                               "    os.write(3, b'R %d True\\n' % i)\nos.write(3, b'D\\n')\n"
                               "os._exit(0)\n",
    "patch the harness": "import sys\ng = sys._getframe(1).f_globals\n"
                         "g['_plain'] = lambda v, depth=0: True\n"
                         "g['_repr'] = lambda v: 'True'\ndef f(x):\n    return None\n",
    "print a pass report": "print('3 of 3 asserts hold\\nOK')\nimport os\nos._exit(0)\n",
}


@pytest.mark.parametrize("name", sorted(FAKES))
def test_faked_passes_score_zero(pool, kernel_pool, name):
    for p in (pool, kernel_pool):
        r = run_attack(p, FAKES[name])
        assert r.passed == 0 and r.status in ("error", "failed"), r


def test_parse_tests():
    exprs, checks = parse_tests("assert f(1) == [1, 2]\nassert (3, 'a') == g(2)\n"
                                "assert h(1)\nassert not h(2)\nassert f(1) == g(1)\n")
    assert exprs == ["f(1)", "g(2)", "h(1)", "h(2)", "f(1)", "g(1)"]
    assert checks == [Check("equal", (0,), [1, 2]), Check("equal", (1,), (3, "a")),
                      Check("true", (2,)), Check("false", (3,)), Check("same", (4, 5))]
    assert [c.opaque for c in checks] == [False, False, True, True, True]
    with pytest.raises(ValueError, match="tests line 2: only assert statements"):
        parse_tests("assert f(1) == 1\nimport os\n")
    with pytest.raises(ValueError, match="tests line 1: not valid Python"):
        parse_tests("assert f(1 ==\n")


def test_opaque_asserts_are_counted(pool):
    r = pool.run(["def f(x):\n    return x > 0\n"], "assert f(1)\nassert not f(-1)\n")[0]
    assert r.status == "ok" and "2 judged on values the program reports" in r.detail


def test_bad_input_is_one_line_errors(pool):
    with pytest.raises(ValueError, match="2 programs but 1 tests"):
        pool.run(["a", "b"], ["assert a == 1"])
    with pytest.raises(ValueError, match="workers must be >= 1"):
        SandboxPool(0)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        Limits(timeout_s=0)
    big = pool.run(["x = 1\n" * 20_000], "assert x == 1\n")[0]
    assert big.status == "error" and "bytes is over" in big.detail


def test_only_four_descriptors_reach_the_program(pool):
    """stdin, stdout, stderr and the result pipe: no launcher or parent descriptor leaks in."""
    program = ("import os\ndef f(x):\n    n = 0\n    for fd in range(4, 4096):\n        try:\n"
               "            os.fstat(fd)\n            n += 1\n        except OSError:\n"
               "            pass\n    return n\n")
    held = [os.pipe() for _ in range(64)]  # the sandbox's own pipes get numbers above 128
    try:
        r = pool.run([program], "assert f(0) == 0\n")[0]
    finally:
        for a, b in held:
            os.close(a)
            os.close(b)
    assert r.status == "ok", r


def test_failure_names_the_first_failing_assert(pool):
    """SandboxResult.failure: the first assert that did not hold and the value the program
    gave (hand-computed here); "" when every assert holds or the program did not finish."""
    programs = {
        "wrong": "def f(x):\n    return x * 3\n",  # f(2) = 6
        "second": "def f(x):\n    return 7 if x == 2 else x * 3\n",  # f(5) = 15
        "raises": "def f(x):\n    return 7 if x == 2 else 1 // 0\n",
        "literal left": "def f(x):\n    return x * 3 + 1 if x < 10 else 0\n",
        "long": "def f(x):\n    return list(range(100))\n",
        "good": GOOD,
        "crash": "raise SystemExit(0)\n",
    }
    results = dict(zip(programs, pool.run(list(programs.values()), TESTS), strict=True))
    assert results["wrong"].failure == "f(2) should be 7, got 6"
    assert results["second"].failure == "f(5) should be 16, got 15"
    assert results["raises"].failure == "f(5) should be 16, raised ZeroDivisionError"
    assert results["literal left"].failure == "f(10) should be 31, got 0"
    long = results["long"].failure
    assert long.startswith("f(2) should be 7, got [0, 1, 2, ") and long.endswith("...")
    assert len(long) < 80
    assert (results["good"].status, results["good"].failure) == ("ok", "")
    assert (results["crash"].status, results["crash"].failure) == ("error", "")
    same = pool.run(["def f(x):\n    return x\n"], "assert f(0) == f(1)\nassert not f(1)\n")[0]
    assert same.failure == "f(0) should equal f(1), got 0 and 1"
    assert SandboxResult(1, 2, "failed").failure == ""  # the field is optional

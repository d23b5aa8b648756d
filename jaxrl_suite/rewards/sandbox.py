"""A sandbox for model-written programs: run a program against assert tests, isolated.

Model-written code is hostile input, and the machines that run this suite (CI included) run as
root, so every limit here is one that binds root's child: the program runs as an unused uid.

`run_tests(program, tests)` returns `SandboxResult(passed, total, status, detail)`; the reward of
a completion is `result.reward` = passed / total when the program ran to the end (status "ok" or
"failed") and 0.0 otherwise. `SandboxPool(workers).run(programs, tests)` runs batches of them
concurrently (threads, each waiting on its own sandboxed process).

**Isolation** (`_sandbox_launcher.py`, Linux). Each program runs in a fresh process tree:
  * new mount, PID, network, IPC and UTS namespaces, where the kernel allows them (each is
    tried on its own; `SandboxPool.isolation` says which are in force);
  * every mount read-only; a fresh tmpfs (file_mb) as the working directory; a private /proc
    that shows only the sandbox's processes;
  * an empty environment; `python -I -S -B` (no site-packages, no user paths): the standard
    library only;
  * as an unprivileged uid/gid, unique to this process and slot, with no supplementary groups
    and `no_new_privs`; RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC,
    RLIMIT_STACK and no core files;
  * no network: the new network namespace has only a down loopback. Where none can be made, a
    seccomp filter fails socket(2) for AF_INET/AF_INET6/AF_NETLINK/AF_PACKET, if `pyseccomp`
    is installed (the `sandbox` extra); else the network is NOT isolated and `isolation` says so;
  * a wall-clock timeout that kills the namespace's init, which takes every process in the
    namespace with it (a double-forked daemon included); without a PID namespace, every process
    of the sandbox uid is killed instead;
  * stdout and stderr captured and cut at `output_bytes`: a program that writes more is killed
    (status "output_limit").
  An audit hook inside the sandbox (`_sandbox_harness.py`) also stops, and names, process
  creation, signals, sockets, ctypes and writes outside the working directory (status
  "forbidden"). It is a second layer that reports what was tried; the kernel's limits above are
  the boundary, and the tests check them with the hook switched off too.

**The harness cannot be fooled.** `tests` is parsed here (with `ast`, never evaluated here):
each line is an assert. For `assert <expr> == <literal>` (either side) only the expression
enters the sandboxed process; it reports the expression's value, which must be built of exact
builtin types, through fd 3, and this process compares it with the literal, which the program
never sees. Exiting early (`sys.exit(0)`, `os._exit(0)`), redefining `assert` or
`AssertionError`, monkeypatching the test code or writing fake result lines (the first line per
expression counts, as one guess) cannot raise the pass count beyond what computing the values
would. The exit status is not trusted. Asserts of other shapes (`assert g(x)`, `assert not
g(x)`, `assert a(x) == b(y)`) are judged on values the program's process reports for the
expressions; a program that monkeypatches a function such an assert calls can fake them. Our
generated code tasks use only the literal form; `SandboxResult.detail` counts the other kind.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import marshal
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STATUSES = ("ok", "failed", "timeout", "memory", "output_limit", "forbidden", "error")
NAMESPACES = ("mount", "pid", "network", "ipc", "uts")
MAX_PROGRAM_BYTES = 64 * 1024
STARTUP_S = 1.0  # added to timeout_s for the wall clock: two interpreter starts on a busy machine
_UID_BASE = 1_000_000  # sandbox uid = _UID_BASE + 64 * pid + slot: unused, and unique per process
_SLOTS_PER_PROCESS = 64
_HERE = Path(__file__).resolve().parent
_LAUNCHER = (_HERE / "_sandbox_launcher.py").read_text()
_HARNESS = (_HERE / "_sandbox_harness.py").read_text()


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """The outcome of one program.

    Attributes:
      passed, total: asserts that held, and all asserts of the tests.
      status: one of STATUSES: "ok" (all passed), "failed" (ran, some failed), "timeout",
        "memory", "output_limit", "forbidden", "error" (crash, exception, early exit).
      detail: why, in one line.
      output: the start of what the program printed (at most 2,000 characters).
      failure: the first assert that did not hold, with the value the program gave, when the
        program ran to the end (status "failed"), e.g. "f(5) should be 17, got 16" or
        "f(5) should be 17, raised ZeroDivisionError"; "" otherwise.
    """

    passed: int
    total: int
    status: str
    detail: str = ""
    output: str = ""
    failure: str = ""

    @property
    def reward(self) -> float:
        """passed / total if the program ran to the end, else 0.0."""
        if self.status not in ("ok", "failed") or not self.total:
            return 0.0
        return self.passed / self.total


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one run.

    Attributes:
      timeout_s: wall-clock seconds for the program and its tests (plus STARTUP_S for the
        interpreter's start); CPU seconds are capped at ceil(timeout_s), with SIGKILL one
        second later for a program that ignores SIGXCPU.
      memory_mb: address space (RLIMIT_AS) of the sandboxed interpreter.
      output_bytes: stdout + stderr captured before the program is killed.
      file_mb: RLIMIT_FSIZE, and the size of the tmpfs working directory.
      nofile, nproc, stack_mb: open files, processes + threads of the sandbox uid, stack size.
    """

    timeout_s: float = 2.0
    memory_mb: int = 256
    output_bytes: int = 64 * 1024
    file_mb: int = 16
    nofile: int = 64
    nproc: int = 16
    stack_mb: int = 8

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"sandbox {field.name} must be > 0, got "
                                 f"{field.name}={getattr(self, field.name)}")


@dataclasses.dataclass(frozen=True)
class Check:
    """One assert: `kind` "equal" (value(exprs[0]) == expected), "same" (value(exprs[0]) ==
    value(exprs[1])), "true" / "false" (truth of value(exprs[0])). `opaque`: judged on values
    the program's process reports for expressions that may call code it can monkeypatch."""

    kind: str
    exprs: tuple[int, ...]
    expected: object = None

    @property
    def opaque(self) -> bool:
        return self.kind != "equal"


def _literal(node: ast.expr):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def parse_tests(tests: str) -> tuple[list[str], list[Check]]:
    """Splits assert tests into the expressions the sandbox evaluates and the checks done here.

    Each statement must be an `assert`; `assert e == <literal>` (or `<literal> == e`) is the
    trusted form. Raises ValueError naming the line of any other statement.
    """
    try:
        tree = ast.parse(tests)
    except SyntaxError as e:
        raise ValueError(f"tests line {e.lineno}: not valid Python ({e.msg})") from None
    exprs: list[str] = []
    checks: list[Check] = []

    def expr(node: ast.expr) -> int:
        exprs.append(ast.unparse(node))
        return len(exprs) - 1

    for stmt in tree.body:
        if not isinstance(stmt, ast.Assert):
            raise ValueError(f"tests line {stmt.lineno}: only assert statements are allowed, "
                             f"got {type(stmt).__name__}")
        test = stmt.test
        if (isinstance(test, ast.Compare) and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)):
            left, right = test.left, test.comparators[0]
            ok_r, value_r = _literal(right)
            ok_l, value_l = _literal(left)
            if ok_r and not ok_l:
                checks.append(Check("equal", (expr(left),), value_r))
            elif ok_l and not ok_r:
                checks.append(Check("equal", (expr(right),), value_l))
            else:
                checks.append(Check("same", (expr(left), expr(right))))
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            checks.append(Check("false", (expr(test.operand),)))
        else:
            checks.append(Check("true", (expr(test),)))
    if not checks:
        raise ValueError("tests: no assert statements")
    return exprs, checks


# -- sandbox uids --------------------------------------------------------------------------

_slot_lock = threading.Lock()
_free_slots: list[int] = []
_next_slot = [0]


def _acquire_slot() -> int:
    with _slot_lock:
        if _free_slots:
            return _free_slots.pop()
        if _next_slot[0] >= _SLOTS_PER_PROCESS:
            raise RuntimeError(f"more than {_SLOTS_PER_PROCESS} concurrent sandboxed programs")
        _next_slot[0] += 1
        return _next_slot[0] - 1


def _release_slot(slot: int) -> None:
    with _slot_lock:
        _free_slots.append(slot)


def _slot_uid(slot: int) -> int:
    if os.geteuid() != 0:
        return os.getuid()  # not root: the program runs as the calling user (no uid drop)
    return _UID_BASE + _SLOTS_PER_PROCESS * os.getpid() + slot


def _python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _seccomp_path() -> str | None:
    spec = importlib.util.find_spec("pyseccomp")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).resolve().parent.parent if spec.submodule_search_locations
               else Path(spec.origin).resolve().parent)


# -- one run ------------------------------------------------------------------------------

def _read_all(fds: dict[int, int], deadline: float, on_over) -> dict[int, bytes]:
    """Reads the pipes `fds` (fd -> byte cap) until EOF on all or the deadline; a pipe over its
    cap calls on_over(fd) once and is closed."""
    sel = selectors.DefaultSelector()
    data = {fd: bytearray() for fd in fds}
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(fds)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(timeout=left):
            fd = key.fd
            chunk = os.read(fd, 1 << 16)
            if chunk and len(data[fd]) + len(chunk) <= fds[fd]:
                data[fd] += chunk
                continue
            if chunk:  # over the cap
                data[fd] += chunk[: fds[fd] - len(data[fd])]
                on_over(fd)
            sel.unregister(fd)
            open_fds.discard(fd)
    sel.close()
    return {fd: bytes(b) for fd, b in data.items()}


def _parse_results(text: str, n_exprs: int) -> dict:
    """The harness's lines: the first value per expression, and the markers."""
    values: dict[int, object] = {}
    errors: dict[int, str] = {}
    marks: dict[str, str] = {}
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("R", "E"):
            index, _, payload = rest.partition(" ")
            if not index.isdigit() or int(index) >= n_exprs:
                continue
            i = int(index)
            if i in values or i in errors:
                continue  # the first line per expression counts
            if tag == "E":
                errors[i] = payload
                continue
            try:
                values[i] = ast.literal_eval(payload)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                errors[i] = "unreadable value"
        elif tag in ("S", "D", "X", "M", "F"):
            marks.setdefault(tag, rest)
    return {"values": values, "errors": errors, "marks": marks}


_FAILURE_VALUE_CHARS = 40  # each value's repr in SandboxResult.failure is cut to this


def _cut(text: str, n: int = _FAILURE_VALUE_CHARS) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _failure(check: Check, exprs: Sequence[str], results: dict) -> str:
    """One line on a check that did not hold: what it wanted and what the program gave, e.g.
    "f(5) should be 17, got 16", "f(5) should be 17, raised ZeroDivisionError"."""
    names = [_cut(exprs[i], 2 * _FAILURE_VALUE_CHARS) if i < len(exprs) else "?"
             for i in check.exprs]
    wanted = {"equal": f"should be {_cut(repr(check.expected))}",
              "same": f"should equal {names[-1]}",
              "true": "should be true", "false": "should be false"}[check.kind]
    values = [_cut(repr(results["values"][i])) for i in check.exprs if i in results["values"]]
    if len(values) == len(check.exprs):
        return f"{names[0]} {wanted}, got {' and '.join(values)}"
    got = []
    for i in check.exprs:
        if i in results["values"]:
            got.append(f"got {_cut(repr(results['values'][i]))}")
        else:  # an exception's name, or the reason the value was not read
            error = results["errors"].get(i, "no value")
            got.append(error if " " in error else f"raised {_cut(error)}")
    return f"{names[0]} {wanted}, {' and '.join(got)}"


def _judge(check: Check, values: dict) -> bool:
    if any(i not in values for i in check.exprs):
        return False
    try:
        got = values[check.exprs[0]]
        if check.kind == "equal":
            return bool(got == check.expected)
        if check.kind == "same":
            return bool(got == values[check.exprs[1]])
        return bool(got) == (check.kind == "true")
    except Exception:  # noqa: BLE001 - comparing plain data; anything odd is a failure
        return False


class SandboxPool:
    """Runs programs against assert tests, each in its own sandbox, `workers` at a time.

    Usage:
      with SandboxPool(workers=4) as pool:
          results = pool.run(programs, tests)       # list[SandboxResult], in order
      [r.reward for r in results]

    `audit=False` switches off the in-sandbox audit hook, leaving only the kernel's limits
    (for testing them). `namespaces` picks which namespaces to try (default: all).
    The constructor runs one trivial program and raises RuntimeError if the sandbox cannot be
    set up; `isolation` then records what is in force.
    """

    def __init__(self, workers: int = 2, *, limits: Limits | None = None, audit: bool = True,
                 namespaces: Sequence[str] = NAMESPACES, seccomp: bool = True):
        if workers < 1:
            raise ValueError(f"sandbox workers must be >= 1, got workers={workers}")
        unknown = sorted(set(namespaces) - set(NAMESPACES))
        if unknown:
            raise ValueError(f"sandbox namespaces: unknown {unknown}; expected some of "
                             f"{list(NAMESPACES)}")
        if sys.platform != "linux":
            raise RuntimeError(f"the sandbox needs Linux (namespaces, rlimits); this is "
                               f"{sys.platform}")
        self.workers = workers
        self.limits = limits or Limits()
        self.audit = audit
        self.namespaces = tuple(namespaces)
        self._seccomp = _seccomp_path() if seccomp else None
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="sandbox")
        self.isolation: dict = {}
        probe = self.run(["x = 1"], ["assert x == 1"])[0]
        if probe.status != "ok":
            self.close()
            raise RuntimeError(f"the sandbox does not work here: {probe.status}: {probe.detail}")

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, programs: Sequence[str], tests: Sequence[str] | str, *,
            timeout_s: float | None = None, memory_mb: int | None = None) -> list[SandboxResult]:
        """Runs programs[i] against tests[i] (one tests string for all, if a str)."""
        if isinstance(tests, str):
            tests = [tests] * len(programs)
        if len(tests) != len(programs):
            raise ValueError(f"sandbox: {len(programs)} programs but {len(tests)} tests")
        limits = self.limits
        if timeout_s is not None or memory_mb is not None:
            limits = dataclasses.replace(
                limits, timeout_s=limits.timeout_s if timeout_s is None else timeout_s,
                memory_mb=limits.memory_mb if memory_mb is None else memory_mb)
        parsed = [parse_tests(t) for t in tests]
        futures = [self._executor.submit(self._run_one, p, e, c, limits)
                   for p, (e, c) in zip(programs, parsed, strict=True)]
        return [f.result() for f in futures]

    def _run_one(self, program: str, exprs: list[str], checks: list[Check],
                 limits: Limits) -> SandboxResult:
        total = len(checks)
        if not isinstance(program, str):
            return SandboxResult(0, total, "error", f"program is {type(program).__name__}, "
                                 "not str")
        data = program.encode("utf-8", "replace")
        if len(data) > MAX_PROGRAM_BYTES:
            return SandboxResult(0, total, "error", f"program of {len(data)} bytes is over "
                                 f"{MAX_PROGRAM_BYTES}")
        slot = _acquire_slot()
        try:
            return self._launch(program, exprs, checks, limits, _slot_uid(slot))
        finally:
            _release_slot(slot)

    def _launch(self, program, exprs, checks, limits: Limits, uid: int) -> SandboxResult:
        workdir = tempfile.mkdtemp(prefix="jaxrl-sandbox-")
        os.chmod(workdir, 0o755)
        pipes = [os.pipe() for _ in range(3)]  # output, results, launcher status
        (out_r, out_w), (res_r, res_w), (st_r, st_w) = pipes
        python = _python()
        cfg = {
            "uid": uid, "gid": uid if os.geteuid() == 0 else os.getgid(),
            "workdir": workdir, "workdir_bytes": limits.file_mb << 20,
            "output_fd": out_w, "result_fd": res_w, "status_fd": st_w,
            "namespaces": list(self.namespaces), "host_mnt_ns": os.readlink("/proc/self/ns/mnt"),
            "expose": sorted({sys.base_prefix, os.path.dirname(python)}),
            "python": python, "harness": _HARNESS, "seccomp_path": self._seccomp,
            "wall_s": limits.timeout_s + STARTUP_S,
            "limits": {"address_space": limits.memory_mb << 20, "fsize": limits.file_mb << 20,
                       "nofile": limits.nofile, "nproc": limits.nproc,
                       "stack": limits.stack_mb << 20, "cpu_s": math.ceil(limits.timeout_s)},
        }
        over: set[int] = set()
        proc = None
        try:
            proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", _LAUNCHER, json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=st_w,
                pass_fds=(out_w, res_w, st_w), start_new_session=True, env={})
            for fd in (out_w, res_w, st_w):
                os.close(fd)
            try:
                proc.stdin.write(marshal.dumps((program, exprs, workdir, self.audit)))
                proc.stdin.close()
            except OSError:
                pass

            def on_over(fd):
                over.add(fd)
                if fd != st_r:
                    try:
                        proc.send_signal(signal.SIGTERM)  # the launcher kills the sandbox
                    except ProcessLookupError:
                        pass

            deadline = time.monotonic() + cfg["wall_s"] + 5.0
            caps = {out_r: limits.output_bytes,
                    res_r: (len(exprs) + 8) * 100_200, st_r: 1 << 16}
            got = _read_all(caps, deadline, on_over)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            for fd in (out_r, res_r, st_r):
                os.close(fd)
            if proc is None:
                for fd in (out_w, res_w, st_w):
                    os.close(fd)
            shutil.rmtree(workdir, ignore_errors=True)
        status = {}
        said = []
        for line in got[st_r].decode("utf-8", "replace").splitlines():
            try:
                status.update(json.loads(line))
            except ValueError:
                said.append(line)
        if "isolation" in status:
            self.isolation = status["isolation"]
        output = got[out_r].decode("utf-8", "replace")
        results = _parse_results(got[res_r].decode("utf-8", "replace"), len(exprs))
        return self._verdict(checks, results, status, said, output, out_r in over or
                             res_r in over, limits, exprs)

    def _verdict(self, checks, results, status, said, output, over_output, limits, exprs=()
                 ) -> SandboxResult:
        total = len(checks)
        marks = results["marks"]
        child = status.get("child", {})
        launcher = status.get("launcher", {})
        out = output[:2000]

        def result(st, detail, passed=0):
            return SandboxResult(passed, total, st, detail, out)

        if over_output:
            return result("output_limit", f"more than {limits.output_bytes} bytes of output")
        if launcher.get("timeout"):
            return result("timeout", f"ran past {limits.timeout_s:g} s (wall clock)")
        if "setup_error" in status:
            return result("error", f"sandbox setup: {status['setup_error']}")
        if "F" in marks:
            return result("forbidden", f"stopped: {marks['F']}")
        if "M" in marks:
            return result("memory", f"out of memory ({limits.memory_mb} MB address space)")
        sig = child.get("signal")
        if sig == signal.SIGXCPU or sig == signal.SIGKILL and child.get("cpu_s", 0) >= math.ceil(
                limits.timeout_s) - 0.1:
            return result("timeout", f"ran past {math.ceil(limits.timeout_s)} s of CPU time")
        if "X" in marks:
            return result("error", f"the program raised {marks['X']}")
        if "D" not in marks:
            if sig is not None:
                name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ \
                    else str(sig)
                why = f"killed by {name}"
            elif child:
                why = f"exited with status {child.get('exit')}"
            else:
                why = "the sandbox did not start" + (f" ({' '.join(said)[:200]})" if said else "")
            return result("error", f"{why} before the tests finished")
        held = [_judge(c, results["values"]) for c in checks]
        passed = sum(held)
        opaque = sum(c.opaque for c in checks)
        detail = f"{passed} of {total} asserts hold"
        if opaque:
            detail += f" ({opaque} judged on values the program reports)"
        if results["errors"]:
            first = min(results["errors"])
            detail += f"; assert {first + 1}: {results['errors'][first]}"
        if passed == total:
            return result("ok", detail, passed)
        failure = _failure(checks[held.index(False)], exprs, results)
        return dataclasses.replace(result("failed", detail, passed), failure=failure)


_default: list[SandboxPool] = []
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
    """The process's shared pool (workers = min(4, cpu count)), made on first use."""
    with _default_lock:
        if not _default:
            _default.append(SandboxPool(workers=min(4, os.cpu_count() or 1)))
        return _default[0]


def run_tests(program: str, tests: str, *, timeout_s: float = 2.0,
              memory_mb: int = 256) -> SandboxResult:
    """Runs `program` against the assert lines of `tests` in the sandbox (`default_pool`)."""
    return default_pool().run([program], [tests], timeout_s=timeout_s,
                              memory_mb=memory_mb)[0]


__all__ = [
    "NAMESPACES",
    "STATUSES",
    "Check",
    "Limits",
    "SandboxPool",
    "SandboxResult",
    "default_pool",
    "parse_tests",
    "run_tests",
]

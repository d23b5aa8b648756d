"""A sandbox for model-written programs: run a program against assert tests, isolated.

Model-written code is hostile input: it must not read the user's files or the trainer's
environment (tokens such as HF_TOKEN), reach the network, write outside its working directory,
signal or trace other processes, or outlive its run.

`run_tests(program, tests)` returns `SandboxResult(passed, total, status, detail)`; the reward of
a completion is `result.reward` = passed / total when the program ran to the end (status "ok" or
"failed") and 0.0 otherwise. `SandboxPool(workers).run(programs, tests)` runs batches of them
concurrently (threads, each waiting on its own sandboxed process).

**Modes** (`SandboxPool.mode`, also `isolation["mode"]`), chosen unless forced (`mode=`, or
$JAXRL_SANDBOX_MODE):
  * "root" (the trainer runs as root, e.g. CI): the program runs as an unused uid
    (1,000,000 + 64 * pid + slot, checked to have no passwd or group entry and to own no
    process, else the next of + k * 2**28 that is free), with no supplementary groups.
  * "userns" (not root; the kernel allows unprivileged user namespaces): a user namespace in
    which the one inside id 1000 maps to the user's uid/gid (setgroups denied), owning the other
    namespaces. The program runs as inside uid 1000, not 0, so it has no capability at all
    (CapEff 0), even in its namespaces; outside it is the user, so the mounts hide the user's
    files. The mount and PID namespaces are required.
  * "unisolated" (neither): no namespaces; the program runs as the user and can read the user's
    files and the trainer's /proc/<pid>/environ; only the seccomp filter keeps it off the
    network and from signalling the user's processes, and the rlimits bound it. `run_tests` and
    `SandboxPool` refuse this mode with UnisolatedError (one line) unless
    `allow_unisolated=True`.
  Forcing "userns" or "unisolated" as root (tests) runs the program as an unused uid that
  stands for the user (an interpreter the uid cannot reach, e.g. under a 0700 /root, works in
  "userns" mode only).

**Isolation** (`_sandbox_launcher.py`, Linux). Each program runs in a fresh process tree:
  * new mount, PID, network, IPC and UTS namespaces ("root" and "userns" modes; in "root" mode
    each is tried on its own; `isolation` says which are in force);
  * every mount read-only; the home and temporary directories ($HOME, the user's home, /root,
    /home, /tmp, /var/tmp, /run, /dev/shm, /dev/mqueue, the directory holding the working
    directories, `hide=`) covered with an empty read-only tmpfs, with only the interpreter's
    install tree bound back read-only where it lies below one of them; a fresh tmpfs
    (file_mb, max_files inodes) as the working directory; a private /proc that shows only the
    sandbox's processes (in "userns" mode an empty /proc where the kernel refuses a new one);
  * an empty environment; `python -I -S -B` (no site-packages, no user paths): the standard
    library only;
  * no capabilities, `no_new_privs`, and the uid above; RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE,
    RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_STACK and no core files;
  * a seccomp filter, in every mode (built by the launcher on x86_64 and aarch64, else by
    pyseccomp where installed, the `sandbox` extra; `isolation["seccomp"]` names it): socket(2)
    and socketpair(2) of every family (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET...),
    io_uring, kill/tgkill/pidfds, ptrace, bpf, unshare/setns/clone with namespace flags, the
    mount syscalls and more fail with EPERM (see the launcher);
  * no network: the new network namespace has only a down loopback, and no socket can be made
    (seccomp); without a network namespace the filter alone stands;
  * a wall-clock timeout that kills the namespace's init, which takes every process in the
    namespace with it (a double-forked daemon included); without a PID namespace, the launcher
    (a child subreaper) kills every descendant left, and as root every process of the uid;
  * stdout and stderr captured and cut at `output_bytes`: a program that writes more is killed
    (status "output_limit"); more than `max_files` files and directories in the working
    directory is status "file_limit" (the tmpfs has no inode for the next one; without a mount
    namespace a count every 20 ms kills the program).
  An audit hook inside the sandbox (`_sandbox_harness.py`) also stops, and names, process
  creation, signals, sockets, ctypes, subinterpreters, gc introspection and writes outside the
  working directory (status "forbidden"). Its state is a closure the program cannot reach (no
  flag in the harness's globals). It is a second layer that reports what was tried; the
  kernel's limits above are the boundary, and the tests check them with the hook (and the
  seccomp filter) switched off too.

**Limits of the isolation.** In "userns" mode the program is the user outside: files outside the
covered directories that the user can read (a project directory outside $HOME, /etc, /opt...)
stay readable, read-only (cover more with `hide=`); unprivileged code cannot drop the user's
supplementary groups (they show as 65534 inside), so files readable by those groups stay
readable; Unix sockets the user or its groups may connect to (a Docker socket...) are out of
reach because no socket can be made (seccomp) and, under /run and the covered directories,
because they are hidden; with seccomp=False a socket file elsewhere would be reachable.
"unisolated" isolates nothing but what the filter and the rlimits do.

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
import grp
import importlib.util
import json
import marshal
import math
import os
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STATUSES = ("ok", "failed", "timeout", "memory", "output_limit", "file_limit", "forbidden",
            "error")
NAMESPACES = ("mount", "pid", "network", "ipc", "uts")
MODES = ("root", "userns", "unisolated")
MODE_ENV = "JAXRL_SANDBOX_MODE"  # forces the mode of pools made without `mode=` (tests, CI)
MAX_PROGRAM_BYTES = 64 * 1024
STARTUP_S = 1.0  # added to timeout_s for the wall clock: two interpreter starts on a busy machine
_UID_BASE = 1_000_000  # sandbox uid = _UID_BASE + 64 * pid + slot: unused, and unique per process
_SLOTS_PER_PROCESS = 64
_UID_STRIDE = 1 << 28  # > 64 * the largest pid: the next candidates of a uid in use
_UID_MAX = (1 << 32) - 2  # (uid_t)-1 is no uid
_INNER_ID = 1000  # the program's uid and gid inside the user namespace ("userns" mode)
# covered with an empty read-only tmpfs wherever there is a mount namespace, with $HOME, the
# home directory of the effective uid and the directory of the working directories
_HIDDEN = ("/root", "/home", "/tmp", "/var/tmp", "/run", "/var/run", "/var/lock", "/dev/shm",
           "/dev/mqueue")
_HERE = Path(__file__).resolve().parent
_LAUNCHER = (_HERE / "_sandbox_launcher.py").read_text()
_HARNESS = (_HERE / "_sandbox_harness.py").read_text()


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """The outcome of one program.

    Attributes:
      passed, total: asserts that held, and all asserts of the tests.
      status: one of STATUSES: "ok" (all passed), "failed" (ran, some failed), "timeout",
        "memory", "output_limit", "file_limit" (made more than Limits.max_files files and
        directories in its working directory), "forbidden", "error" (crash, exception, early
        exit).
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
      max_files: files and directories the program may make in its working directory: the
        tmpfs's inode count (the next one fails with ENOSPC), or without a mount namespace a
        count every 20 ms that kills the program; more is status "file_limit".
      nofile, nproc, stack_mb: open files, processes + threads of the sandbox uid, stack size.
    """

    timeout_s: float = 2.0
    memory_mb: int = 256
    output_bytes: int = 64 * 1024
    file_mb: int = 16
    max_files: int = 1024
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


def _account_exists(uid: int) -> bool:
    """Whether `uid` has a passwd entry, or its number a group entry."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
        except OverflowError:
            return True
    return False


def _uids_of_processes() -> set[int]:
    """Every real, effective, saved and filesystem uid of the processes in /proc."""
    uids: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        uids.update(int(u) for u in line.split()[1:])
                        break
        except (OSError, ValueError):
            pass
    return uids


_UID_RECHECK_S = 5.0  # a slot's uid is checked again when its last check is older
_uid_checked: dict[tuple[int, int], tuple[int, float]] = {}  # (pid, slot) -> (uid, when)


def _slot_uid(slot: int) -> int:
    """The unused uid of `slot` (root only): _UID_BASE + 64 * pid + slot, unique to this process
    and slot; if that one has a passwd (or group) entry or owns a process, the next of
    candidate + k * 2**28 that has neither (still unique to the pid and slot). The check reads
    every /proc/<pid>/status, so its answer is kept for _UID_RECHECK_S seconds."""
    key, now = (os.getpid(), slot), time.monotonic()
    with _slot_lock:
        checked = _uid_checked.get(key)
    if checked is not None and now - checked[1] < _UID_RECHECK_S:
        return checked[0]
    processes = _uids_of_processes()
    uid = _UID_BASE + _SLOTS_PER_PROCESS * os.getpid() + slot
    while uid <= _UID_MAX:
        if uid not in processes and not _account_exists(uid):
            with _slot_lock:
                _uid_checked[key] = (uid, now)
            return uid
        uid += _UID_STRIDE
    raise RuntimeError(f"no unused uid for sandbox slot {slot} of process {os.getpid()}")


def _python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


_BPF_MACHINES = ("x86_64", "aarch64")  # where the launcher builds the seccomp filter itself


def _seccomp_path() -> str | None:
    spec = importlib.util.find_spec("pyseccomp")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).resolve().parent.parent if spec.submodule_search_locations
               else Path(spec.origin).resolve().parent)


def _seccomp_impl(choice: bool | str) -> str | None:
    """The seccomp filter's builder: "bpf" (the launcher's own, x86_64 and aarch64), else
    "pyseccomp" where installed (the `sandbox` extra), else None; False: none; a name: that."""
    if choice is False:
        return None
    if choice not in (True, "bpf", "pyseccomp"):
        raise ValueError(f"sandbox seccomp must be True, False, 'bpf' or 'pyseccomp', got "
                         f"{choice!r}")
    if choice == "bpf" and os.uname().machine not in _BPF_MACHINES:
        raise ValueError(f"sandbox seccomp 'bpf' knows {list(_BPF_MACHINES)}, not "
                         f"{os.uname().machine}")
    if choice == "pyseccomp" and _seccomp_path() is None:
        raise ValueError("sandbox seccomp 'pyseccomp': pyseccomp is not installed (the "
                         "`sandbox` extra)")
    if choice is True:
        if os.uname().machine in _BPF_MACHINES:
            return "bpf"
        return "pyseccomp" if _seccomp_path() is not None else None
    return choice


def _expose_paths(python: str) -> list[str]:
    """The interpreter's install trees (the harness runs `python -I -S -B`: the standard
    library only), none inside another."""
    paths = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix,
                                                  os.path.dirname(python))}, key=len)
    kept: list[str] = []
    for p in paths:
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


def _hidden_paths(workdir: str, extra: Sequence[str]) -> list[str]:
    """The directories covered with an empty tmpfs: _HIDDEN, $HOME, the effective user's home,
    the directory holding `workdir` and `extra`; existing directories other than /, none inside
    another."""
    candidates = [*_HIDDEN, os.environ.get("HOME") or "", os.path.dirname(workdir), *extra]
    try:
        candidates.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    paths = set()
    for c in candidates:
        if c and os.path.isabs(c):
            real = os.path.realpath(c)
            if real != "/" and os.path.isdir(real):
                paths.add(real)
    kept: list[str] = []
    for p in sorted(paths, key=len):
        if not any(p.startswith(k + "/") for k in kept):
            kept.append(p)
    return kept


def _remove_tree(path: str) -> None:
    """rmtree, giving back first the owner's rights that a program took away (chmod 000)."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    todo = [path]
    while todo:
        p = todo.pop()
        try:
            if stat.S_ISDIR(os.lstat(p).st_mode):
                os.chmod(p, 0o700)
                todo.extend(os.path.join(p, name) for name in os.listdir(p))
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


class UnisolatedError(RuntimeError):
    """The sandbox cannot isolate programs here (not root, no user namespaces) and the caller
    did not pass allow_unisolated=True."""


class _UsernsUnavailable(RuntimeError):
    pass


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

    `mode` (one of MODES; default: $JAXRL_SANDBOX_MODE, else chosen): "root" (as root), else
    "userns" where the kernel allows unprivileged user namespaces, else "unisolated", which is
    refused (UnisolatedError, one line) unless `allow_unisolated=True`. Forcing "userns" or
    "unisolated" as root runs the program as an unused uid standing in for the user (tests).
    `audit=False` switches off the in-sandbox audit hook and `seccomp=False` the seccomp filter,
    leaving the namespaces, mounts, uid and rlimits (for testing them). `namespaces` picks which
    namespaces to try (default: all; "userns" mode needs mount and pid). `hide`: more
    directories to cover with an empty tmpfs, besides the home and temporary directories.
    The constructor runs one trivial program and raises RuntimeError if the sandbox cannot be
    set up; `mode` and `isolation` (a dict, its "mode" included) then record what is in force.
    """

    def __init__(self, workers: int = 2, *, limits: Limits | None = None, audit: bool = True,
                 namespaces: Sequence[str] = NAMESPACES, seccomp: bool | str = True,
                 mode: str | None = None, allow_unisolated: bool = False,
                 hide: Sequence[str] = ()):
        if workers < 1:
            raise ValueError(f"sandbox workers must be >= 1, got workers={workers}")
        unknown = sorted(set(namespaces) - set(NAMESPACES))
        if unknown:
            raise ValueError(f"sandbox namespaces: unknown {unknown}; expected some of "
                             f"{list(NAMESPACES)}")
        if sys.platform != "linux":
            raise RuntimeError(f"the sandbox needs Linux (namespaces, rlimits); this is "
                               f"{sys.platform}")
        requested = mode or os.environ.get(MODE_ENV) or None
        if requested not in (None, *MODES):
            raise ValueError(f"sandbox mode must be one of {list(MODES)}, got {requested!r}")
        if requested == "root" and os.geteuid() != 0:
            raise ValueError(f"sandbox mode 'root' needs root; this process runs as uid "
                             f"{os.geteuid()}")
        if requested == "userns" and not {"mount", "pid"} <= set(namespaces):
            raise ValueError("sandbox mode 'userns' needs the mount and pid namespaces")
        self.workers = workers
        self.limits = limits or Limits()
        self.audit = audit
        self.namespaces = tuple(namespaces)
        self.seccomp = _seccomp_impl(seccomp)
        self._seccomp_path = _seccomp_path() if self.seccomp == "pyseccomp" else None
        self.hide = tuple(hide)
        self.mode = requested or ("root" if os.geteuid() == 0 else "userns")
        self.isolation: dict = {"mode": self.mode}
        if self.mode == "unisolated" and not allow_unisolated:
            raise UnisolatedError(self._refusal("mode 'unisolated' was asked for"))
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="sandbox")
        try:
            probe = self._probe()
        except _UsernsUnavailable as e:
            if requested == "userns":
                self.close()
                raise RuntimeError(f"sandbox mode 'userns': {e}") from None
            if not allow_unisolated:
                self.close()
                raise UnisolatedError(self._refusal(str(e))) from None
            self.mode = "unisolated"
            self.isolation = {"mode": self.mode}
            probe = self._probe()
        if probe.status != "ok":
            self.close()
            raise RuntimeError(f"the sandbox does not work here: {probe.status}: {probe.detail}")

    def _probe(self) -> SandboxResult:
        return self.run(["x = 1"], ["assert x == 1"])[0]

    @staticmethod
    def _refusal(why: str) -> str:
        return (f"the sandbox cannot isolate programs here ({why}; not root, and no user "
                f"namespace): pass allow_unisolated=True to run model-written code as this "
                f"user, with its files, environment and processes in reach")

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
            return self._launch(program, exprs, checks, limits,
                                _slot_uid(slot) if os.geteuid() == 0 else None)
        finally:
            _release_slot(slot)

    def _launch(self, program, exprs, checks, limits: Limits, unused_uid: int | None
                ) -> SandboxResult:
        """`unused_uid`: as root, the program's uid in "root" mode, and in the other modes the
        uid that stands for the user."""
        workdir = tempfile.mkdtemp(prefix="jaxrl-sandbox-")
        os.chmod(workdir, 0o755)
        pipes = [os.pipe() for _ in range(3)]  # output, results, launcher status
        (out_r, out_w), (res_r, res_w), (st_r, st_w) = pipes
        python = _python()
        outer = (unused_uid, unused_uid) if unused_uid is not None else (os.getuid(), os.getgid())
        inner = (_INNER_ID, _INNER_ID) if self.mode == "userns" else outer
        cfg = {
            "mode": self.mode, "uid": inner[0], "gid": inner[1],
            "outer_uid": outer[0], "outer_gid": outer[1],
            "workdir": workdir, "workdir_bytes": limits.file_mb << 20,
            "max_files": limits.max_files,
            "output_fd": out_w, "result_fd": res_w, "status_fd": st_w,
            "namespaces": list(self.namespaces), "host_mnt_ns": os.readlink("/proc/self/ns/mnt"),
            "expose": _expose_paths(python), "hide": _hidden_paths(workdir, self.hide),
            "python": python, "harness": _HARNESS, "seccomp": self.seccomp,
            "seccomp_path": self._seccomp_path,
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
            _remove_tree(workdir)
        status = {}
        said = []
        for line in got[st_r].decode("utf-8", "replace").splitlines():
            try:
                status.update(json.loads(line))
            except ValueError:
                said.append(line)
        if "userns_unavailable" in status:
            raise _UsernsUnavailable(f"no user namespace: {status['userns_unavailable']}")
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
        if child.get("file_limit"):
            return result("file_limit", f"more than {limits.max_files} files in the working "
                          "directory")
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


_default: dict[tuple, SandboxPool | UnisolatedError] = {}
_default_lock = threading.Lock()


def default_pool(*, mode: str | None = None, allow_unisolated: bool = False) -> SandboxPool:
    """The process's shared pool (workers = min(4, cpu count)) of this mode (default: chosen, see
    SandboxPool), made on first use. Raises UnisolatedError (each call) where the sandbox cannot
    isolate programs, unless allow_unisolated=True."""
    key = (mode or os.environ.get(MODE_ENV) or None, allow_unisolated)
    with _default_lock:
        if key not in _default:
            try:
                _default[key] = SandboxPool(workers=min(4, os.cpu_count() or 1), mode=key[0],
                                            allow_unisolated=allow_unisolated)
            except UnisolatedError as e:
                _default[key] = e
        pool = _default[key]
    if isinstance(pool, UnisolatedError):
        raise UnisolatedError(str(pool))
    return pool


def run_tests(program: str, tests: str, *, timeout_s: float = 2.0, memory_mb: int = 256,
              mode: str | None = None, allow_unisolated: bool = False) -> SandboxResult:
    """Runs `program` against the assert lines of `tests` in the sandbox (`default_pool`).

    Where the sandbox cannot isolate the program (not root and no user namespaces), raises
    UnisolatedError in one line, unless allow_unisolated=True: then the program runs as this
    user, with only rlimits, no_new_privs and the seccomp filter between it and the user's files,
    environment and processes. `mode` forces one of MODES (tests)."""
    pool = default_pool(mode=mode, allow_unisolated=allow_unisolated)
    return pool.run([program], [tests], timeout_s=timeout_s, memory_mb=memory_mb)[0]


__all__ = [
    "MODES",
    "MODE_ENV",
    "NAMESPACES",
    "STATUSES",
    "Check",
    "Limits",
    "SandboxPool",
    "SandboxResult",
    "UnisolatedError",
    "default_pool",
    "parse_tests",
    "run_tests",
]

"""rewards.sandbox isolation (issue 43, "the sandbox without root"), in each mode this machine
has: "root" and "userns" as root (CI), where "userns" is entered by an unused uid standing in
for the user, "userns" otherwise; and, as root, for real as an unprivileged user (uid 65534,
through setpriv), with user namespaces and without them ("unisolated", refused unless allowed).

What a hostile program must not do: read the user's files ($HOME and the temporary directories
are covered with empty tmpfs), read the trainer's environment (/proc/<ppid>/environ,
/proc/1/environ), write anywhere but its tmpfs working directory, reach the network (AF_INET,
AF_INET6 and AF_UNIX listeners outside), undo the mounts (it has no capability, even in a user
namespace of its own), make more than Limits.max_files files, or switch the audit hook off.
Most checks run with the audit hook and the seccomp filter off (`bare_pool`), so that the
namespaces, mounts, uid and rlimits are what is tested; the seccomp filter and the hook are
tested on their own.
"""

import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from jaxrl_suite.rewards import sandbox
from jaxrl_suite.rewards.sandbox import (
    MODE_ENV,
    Limits,
    SandboxPool,
    UnisolatedError,
    run_tests,
)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/ns/mnt"),
                                reason="the sandbox needs Linux namespaces and /proc")

BPF = os.uname().machine in ("x86_64", "aarch64")
GOOD = "def f(x):\n    return x * 3 + 1\n"
TESTS = "assert f(2) == 7\nassert f(5) == 16\n"
ANY = "assert f(0) == 0\n"  # the tests of a program that reports through its output



@pytest.fixture(scope="module")
def pool(make_pool, mode):
    with make_pool(mode) as p:
        yield p


@pytest.fixture(scope="module")
def kernel_pool(make_pool, mode):
    """No audit hook: the namespaces, mounts, uid, rlimits and the seccomp filter."""
    with make_pool(mode, audit=False) as p:
        yield p


@pytest.fixture(scope="module")
def bare_pool(make_pool, mode):
    """No audit hook and no seccomp filter: the namespaces, mounts, uid and rlimits."""
    with make_pool(mode, audit=False, seccomp=False) as p:
        yield p


def report(pool, program):
    """Runs `program`, which prints one Python literal last; returns (result, that value)."""
    r = pool.run([program], ANY)[0]
    lines = r.output.strip().splitlines()
    assert lines, r
    return r, ast.literal_eval(lines[-1])


# -- capabilities and identity ---------------------------------------------------------------

STATUS = ("import os\nst = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
          "print({k: st[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb', "
          "'NoNewPrivs', 'Seccomp')} | {'uid': os.getuid(), 'gid': os.getgid(), "
          "'groups': os.getgroups()})\n")


def test_no_capabilities_and_an_unused_id(mode, pool, bare_pool):
    for p, seccomp in ((pool, "2"), (bare_pool, "0")):
        r, st = report(p, STATUS)
        assert r.status == "failed", r
        assert {st[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == {"0" * 16}, st
        assert (st["NoNewPrivs"], st["Seccomp"]) == ("1", seccomp if BPF else st["Seccomp"])
        assert st["uid"] != 0 and st["gid"] != 0
        if mode == "userns":
            assert (st["uid"], st["gid"]) == (1000, 1000), st  # one inside id, not 0
        else:
            first = 1_000_000 + 64 * os.getpid()
            assert first <= st["uid"] < first + 64 or st["uid"] >= 1 << 28, st
            assert st["groups"] == [] and st["gid"] == st["uid"]
    assert pool.isolation["mode"] == mode
    assert {"mount", "pid", "network", "ipc", "uts"} <= {k for k, v in pool.isolation.items()
                                                          if v is True}
    # a proc of its own, or (userns mode, where the kernel refuses one) an empty /proc
    assert pool.isolation["proc"] == "private" or pool.isolation["proc"].startswith("hidden")


# -- the user's files ------------------------------------------------------------------------

@pytest.fixture
def world_readable_home(monkeypatch):
    """$HOME: a directory anyone may read, holding a readable secret: only the tmpfs over it
    keeps a program out (not the uid)."""
    home = tempfile.mkdtemp(prefix="jaxrl-home-")
    os.chmod(home, 0o755)
    secret = Path(home, ".netrc")
    secret.write_text("machine huggingface.co password hf_s3cret\n")
    secret.chmod(0o644)
    monkeypatch.setenv("HOME", home)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_user_files_are_hidden(bare_pool, world_readable_home):
    home = world_readable_home
    program = textwrap.dedent(f"""\
        import os
        out = {{}}
        try:
            out['secret'] = open({home + '/.netrc'!r}).read()
        except OSError as e:
            out['secret'] = type(e).__name__
        for d in ('/tmp', '/var/tmp', '/root', '/home', '/run', '/dev/shm', {home!r}):
            try:
                out[d] = sorted(os.listdir(d))
            except OSError as e:
                out[d] = type(e).__name__
        out['cwd'] = os.getcwd()
        print(out)
        """)
    r, out = report(bare_pool, program)
    assert out["secret"] == "FileNotFoundError", out
    assert out[home] == "FileNotFoundError"  # under /tmp, covered
    assert out["/tmp"] == [os.path.basename(out["cwd"])]  # the working directory only
    for d in ("/var/tmp", "/run", "/dev/shm", "/home"):
        assert out[d] in ([], "FileNotFoundError"), (d, out[d])
    python_tree = {p.split("/")[2] for p in sandbox._expose_paths(sandbox._python())
                   if p.startswith("/root/")}
    assert set(out["/root"]) <= python_tree, out["/root"]  # the interpreter's tree only
    assert os.path.dirname(out["cwd"]) in bare_pool.isolation["hidden"]
    assert any(home == h or home.startswith(h + "/") for h in bare_pool.isolation["hidden"])


def test_trainer_environment_is_out_of_reach(pool, bare_pool, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_s3cret_token")
    program = textwrap.dedent("""\
        import os
        def environ(pid):
            try:
                return open('/proc/%s/environ' % pid, 'rb').read().decode()
            except OSError as e:
                return type(e).__name__
        seen = [environ(os.getppid()), environ(1), environ('self'), str(dict(os.environ))]
        for p in os.listdir('/proc'):
            if p.isdigit():
                seen.append(environ(p))
        print([s for s in seen if 'hf_s3cret' in s] + [sorted(p for p in os.listdir('/proc')
                                                             if p.isdigit())])
        """)
    for p in (pool, bare_pool):
        r, out = report(p, program)
        *leaks, pids = out
        assert leaks == [], leaks
        assert len(pids) <= 4, pids  # only the sandbox's own processes: a private /proc


WRITE_EVERYWHERE = textwrap.dedent("""\
    import os
    targets = {targets!r} + [os.path.dirname(os.getcwd()), '/', '/etc', '/usr', '/proc/1',
                             '/sys/fs/cgroup', '/dev']
    wrote = []
    for d in targets:
        for attempt in ('file', 'dir'):
            path = os.path.join(d, 'pwned-%s-{tag}' % attempt)
            try:
                if attempt == 'file':
                    open(path, 'w').write('x')
                else:
                    os.mkdir(path)
                wrote.append(path)
            except OSError:
                pass
    open('inside.txt', 'w').write('x')
    os.mkdir('inside')
    print([wrote, sorted(os.listdir('.'))])
    """)


def test_no_writes_outside_the_workdir(bare_pool, world_readable_home):
    tag = uuid.uuid4().hex
    targets = ["/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home", world_readable_home,
               os.getcwd(), os.path.dirname(sandbox._python())]
    r, (wrote, inside) = report(bare_pool, WRITE_EVERYWHERE.format(targets=targets, tag=tag))
    assert wrote == [], wrote
    assert inside == ["inside", "inside.txt"]
    for d in targets:  # and nothing reached the real directories
        assert not any(tag in n for n in os.listdir(d)), d


def test_mounts_cannot_be_undone(bare_pool):
    """No capability: umount and remount fail, also from a user namespace of its own (the
    mounts come locked into it)."""
    program = textwrap.dedent("""\
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        def tries():
            out = []
            for target in (b'/tmp', b'/root', b'/proc', b'/run', b'/'):
                out.append(libc.umount2(target, 2) == 0)
                out.append(libc.mount(None, target, None, 32 | 4096, None) == 0)  # rw remount
            return out
        done = tries() + [libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0]
        # in a user + mount namespace of its own it has every capability, but the mounts it
        # inherits are locked together: none can be taken off or made writable
        nested = libc.unshare(0x10000000 | 0x00020000) == 0
        if nested:
            done += tries()
        print([any(done), nested, sorted(os.listdir('/tmp')) == [os.path.basename(os.getcwd())]])
        """)
    r, (undone, nested, still_hidden) = report(bare_pool, program)
    assert not undone and still_hidden, r


# -- the network -----------------------------------------------------------------------------

@pytest.fixture
def listeners():
    """Listening sockets outside the sandbox: AF_INET, AF_INET6 (where ::1 exists), AF_UNIX at
    a path anyone may connect to, and an abstract AF_UNIX name."""
    socks, addrs = [], {}
    inet = socket.socket(socket.AF_INET)
    inet.bind(("127.0.0.1", 0))
    socks.append(inet)
    addrs["inet"] = ("127.0.0.1", inet.getsockname()[1])
    try:
        inet6 = socket.socket(socket.AF_INET6)
        inet6.bind(("::1", 0))
        socks.append(inet6)
        addrs["inet6"] = ("::1", inet6.getsockname()[1])
    except OSError:
        pass
    d = tempfile.mkdtemp(prefix="jaxrl-sock-")
    os.chmod(d, 0o755)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(f"{d}/s")
    os.chmod(f"{d}/s", 0o777)
    socks.append(unix)
    addrs["unix"] = f"{d}/s"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0jaxrl-{uuid.uuid4().hex}")
    socks.append(abstract)
    addrs["abstract"] = abstract.getsockname()
    for s in socks:
        s.listen(8)
        s.setblocking(False)
    yield addrs
    for s in socks:
        try:
            conn, _ = s.accept()
            conn.close()
            accepted = True
        except BlockingIOError:
            accepted = False
        s.close()
        assert not accepted, f"a sandboxed program connected to {s}"
    shutil.rmtree(d, ignore_errors=True)


CONNECT = textwrap.dedent("""\
    import socket
    out = {{}}
    for name, addr in {addrs!r}.items():
        family = {{'inet': socket.AF_INET, 'inet6': socket.AF_INET6}}.get(name, socket.AF_UNIX)
        try:
            s = socket.socket(family)
            s.settimeout(1)
            s.connect(addr)
            out[name] = 'connected'
        except OSError as e:
            out[name] = type(e).__name__
    print(out)
    """)


def test_network_is_out_of_reach(pool, kernel_pool, bare_pool, listeners):
    program = CONNECT.format(addrs=listeners)
    r = pool.run([program], ANY)[0]
    assert r.status == "forbidden", r  # the audit hook: import socket
    if BPF:  # the seccomp filter: no socket at all
        r, out = report(kernel_pool, program)
        assert set(out.values()) == {"PermissionError"}, out
    r, out = report(bare_pool, program)  # the namespaces alone
    assert "connected" not in out.values(), out
    assert out["unix"] == "FileNotFoundError"  # its directory is covered
    assert out["abstract"] == "ConnectionRefusedError"  # another network namespace


# -- seccomp ---------------------------------------------------------------------------------

SYSCALLS = textwrap.dedent("""\
    import ctypes, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def errno_of(call):
        try:
            call()
            return 0
        except OSError as e:
            return e.errno
    def sys_errno(*args):
        ctypes.set_errno(0)
        return ctypes.get_errno() if libc.syscall(*args) == -1 else 0
    params = ctypes.create_string_buffer(120)
    x86 = os.uname().machine == 'x86_64'
    print({
        'af_unix': errno_of(lambda: socket.socket(socket.AF_UNIX)),
        'socketpair': errno_of(lambda: socket.socketpair()),
        'af_inet': errno_of(lambda: socket.socket(socket.AF_INET)),
        'af_inet6': errno_of(lambda: socket.socket(socket.AF_INET6)),
        'af_netlink': errno_of(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
        'af_packet': errno_of(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
        'io_uring_setup': sys_errno(425, 8, params),
        'io_uring_enter': sys_errno(426, 0, 0, 0, 0, None, 0),
        'io_uring_register': sys_errno(427, 0, 0, None, 0),
        'unshare_user': errno_of(lambda: os.unshare(0x10000000)) if hasattr(os, 'unshare')
                        else sys_errno(272 if x86 else 97, 0x10000000),
        'clone3': sys_errno(435, None, 0),
        'kill': errno_of(lambda: os.kill(1, 0)),
        'ptrace': sys_errno(101 if x86 else 117, 16, 1, None, None),
    })
    """)


@pytest.mark.parametrize("impl", ["bpf", "pyseccomp"])
def test_seccomp_filter(make_pool, mode, impl):
    """Sockets of every family (AF_UNIX included), io_uring, namespaces, signals out, ptrace."""
    if impl == "pyseccomp":
        pytest.importorskip("pyseccomp")
    elif not BPF:
        pytest.skip(f"the built-in filter does not know {os.uname().machine}")
    with make_pool(mode, 1, audit=False, seccomp=impl) as p:
        assert p.isolation["seccomp"] == impl
        r, out = report(p, SYSCALLS)
    enosys = out.pop("clone3")
    assert enosys == 38, out  # glibc then falls back to clone, whose flags the filter reads
    assert set(out.values()) == {1}, out  # EPERM


def test_af_unix_socket_is_stopped(kernel_pool):
    r = kernel_pool.run(["import socket\ns = socket.socket(socket.AF_UNIX)\n" + GOOD], TESTS)[0]
    if BPF:
        assert r.status == "error" and "PermissionError" in r.detail, r


# -- the audit hook --------------------------------------------------------------------------

_OFF = textwrap.dedent("""\
    for k, v in list(g.items()):
        if type(v) is list and v:
            v[:] = [True] * len(v)
        if type(v) in (set, frozenset, dict) and k.isupper():
            g[k] = type(v)()
    g.update(_busy=[True], _audit=False, _workdir='/', _hook=lambda *a: None,
             _outside=lambda *a: False)
    """)
ESCAPE = "import os\nos.system('echo escaped')\n"
SWITCH_OFF = {
    "harness globals by frame": "import sys\ng = sys._getframe(1).f_globals\n" + _OFF + ESCAPE,
    "harness globals by module": "import sys\ng = vars(sys.modules['__main__'])\n" + _OFF
                                 + ESCAPE,
    "builtins": "import builtins\nbuiltins.type = lambda *a: str\nbuiltins.any = lambda *a: "
                "False\nbuiltins.len = lambda *a: 0\nbuiltins.isinstance = lambda *a: True\n"
                + ESCAPE,
    "gc.get_objects": "import gc\nfor o in gc.get_objects():\n    if callable(o) and getattr("
                      "o, '__name__', '') in ('hook', '_hook'):\n        o.__code__ = (lambda"
                      " e, a: None).__code__\n" + ESCAPE,
    "gc.get_referents": "import gc, sys\ngc.get_referents(vars(sys.modules['__main__']))\n"
                        + ESCAPE,
    "the path helpers' module": "import os, posixpath\nclass Fake:\n    @staticmethod\n"
                                "    def fspath(p):\n        return os.getcwd()\n"
                                "posixpath.os = Fake\nopen('/etc/pwned', 'w')\n",
    "a str subclass path": "class S(str):\n    def startswith(self, *a):\n        return True\n"
                           "    def split(self, *a):\n        return ['tmp']\n"
                           "open(S('/etc/pwned'), 'a')\n",
    "a subinterpreter": "import _xxsubinterpreters as i\ni.run_string(i.create(), "
                        "\"import os; os.system('echo escaped')\")\n",
}


@pytest.mark.parametrize("name", sorted(SWITCH_OFF))
def test_audit_hook_cannot_be_switched_off(pool, name):
    """The hook's state is a closure no program can reach; the program is stopped at the
    attempt or at what the hook forbids, and never gets to do it."""
    r = pool.run([SWITCH_OFF[name] + GOOD], TESTS)[0]
    assert r.status == "forbidden", r
    assert "escaped" not in r.output


def test_audit_hook_allows_work_in_the_workdir(pool):
    program = ("import pathlib, os\npathlib.Path('a.txt').write_text('x')\nos.mkdir('d')\n"
               "open('d/b', 'w').write('y')\nos.rename('d/b', 'c')\nos.remove('c')\n" + GOOD)
    assert pool.run([program], TESTS)[0].status == "ok"
    r = pool.run(["import pathlib\npathlib.Path('/var/tmp/x').mkdir()\n" + GOOD], TESTS)[0]
    assert r.status == "forbidden" and "os.mkdir outside" in r.detail, r


# -- the file count --------------------------------------------------------------------------

def test_many_files_are_stopped(make_pool, mode):
    with make_pool(mode, limits=Limits(max_files=64)) as p:
        many = "import os\nfor i in range(10_000):\n    open('f%d' % i, 'w').close()\n" + GOOD
        caught = ("import os\nfor i in range(10_000):\n    try:\n        os.mkdir('d%d' % i)\n"
                  "    except OSError:\n        pass\n" + GOOD)
        nested = "import os\nos.makedirs('/'.join(['d'] * 100))\n" + GOOD
        enough = "import os\nfor i in range(64):\n    open('f%d' % i, 'w').close()\n" + GOOD
        results = p.run([many, caught, nested, enough], TESTS)
    assert [r.status for r in results] == ["file_limit"] * 3 + ["ok"], results
    assert "more than 64 files" in results[0].detail


# -- sandbox uids (root mode) ----------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are chosen as root")
def test_sandbox_uid_is_unused(make_pool, monkeypatch):
    def fresh(slot=5):  # the check is kept for a few seconds: forget it
        sandbox._uid_checked.clear()
        return sandbox._slot_uid(slot)

    first = 1_000_000 + 64 * os.getpid() + 5
    assert fresh() == first
    assert os.getuid() in sandbox._uids_of_processes()
    assert sandbox._account_exists(0)
    taken = {first, first + (1 << 28)}
    monkeypatch.setattr(sandbox, "_account_exists", lambda uid: uid == first)
    assert fresh() == first + (1 << 28)
    assert sandbox._slot_uid(5) == first + (1 << 28)  # kept
    monkeypatch.setattr(sandbox, "_uids_of_processes", lambda: taken)
    assert fresh() == first + (2 << 28)
    monkeypatch.setattr(sandbox, "_account_exists", lambda uid: True)
    with pytest.raises(RuntimeError, match="no unused uid"):
        fresh()
    # a live run takes the next free uid: every slot's first candidate "has an account"
    sandbox._uid_checked.clear()
    monkeypatch.setattr(sandbox, "_uids_of_processes", set)
    base = 1_000_000 + 64 * os.getpid()
    monkeypatch.setattr(sandbox, "_account_exists", lambda uid: base <= uid < base + 64)
    with make_pool("root", 1) as p:
        r, st = report(p, STATUS)
    sandbox._uid_checked.clear()
    assert base + (1 << 28) <= st["uid"] < base + (1 << 28) + 64, st


# -- modes -----------------------------------------------------------------------------------

def test_unisolated_is_refused_in_one_line(monkeypatch):
    for make in (lambda: SandboxPool(1, mode="unisolated"),
                 lambda: run_tests(GOOD, TESTS, mode="unisolated")):
        with pytest.raises(UnisolatedError, match="allow_unisolated=True") as e:
            make()
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="sandbox mode must be one of"):
        SandboxPool(1, mode="chroot")
    monkeypatch.setenv(MODE_ENV, "unisolated")
    with pytest.raises(UnisolatedError):
        SandboxPool(1)


def test_auto_mode_falls_back_only_when_allowed(monkeypatch):
    """Not root and the kernel refuses a user namespace: refused, or "unisolated" when
    allowed (simulated here; test_unprivileged_user_without_user_namespaces does it for real)."""
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.delenv(MODE_ENV, raising=False)

    def probe(self):
        if self.mode == "userns":
            raise sandbox._UsernsUnavailable("no user namespace: unshare(CLONE_NEWUSER): "
                                             "No space left on device")
        return sandbox.SandboxResult(1, 1, "ok")

    monkeypatch.setattr(SandboxPool, "_probe", probe)
    with pytest.raises(UnisolatedError, match="No space left on device.*allow_unisolated"):
        SandboxPool(1)
    with SandboxPool(1, allow_unisolated=True) as p:
        assert p.mode == p.isolation["mode"] == "unisolated"
    with pytest.raises(RuntimeError, match="sandbox mode 'userns': no user namespace"):
        SandboxPool(1, mode="userns")
    with pytest.raises(ValueError, match="mode 'root' needs root"):
        SandboxPool(1, mode="root")


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only")
def test_mode_from_the_environment(make_pool, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "userns")
    with make_pool(None, 1) as p:
        assert p.mode == "userns"
    with pytest.raises(ValueError, match="needs the mount and pid namespaces"):
        SandboxPool(1, mode="userns", namespaces=("network",))
    r = run_tests(GOOD, TESTS, mode="userns")
    assert r.status == "ok", r


# -- as an unprivileged user, for real -------------------------------------------------------

UNPRIVILEGED = textwrap.dedent('''\
    """Run as an unprivileged user with the standard library only: loads sandbox.py by path."""
    import importlib.util, json, os, socket, sys, tempfile, uuid
    path, case, home = sys.argv[1], sys.argv[2], os.environ["HOME"]
    spec = importlib.util.spec_from_file_location("jaxrl_sandbox", path)
    sb = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sb
    spec.loader.exec_module(sb)
    out = {"uid": os.getuid(), "stdlib_only": sorted(
        m for m in sys.modules if m.partition(".")[0] in ("jaxrl_suite", "numpy", "jax"))}
    # what this user itself can read: its secret, and the token in its environment
    out["own"] = [open(home + "/secret").read(), open("/proc/self/environ", "rb").read().decode()]
    GOOD, TESTS = "def f(x):\\n    return x + 1\\n", "assert f(1) == 2\\n"

    def run(pool, program, tests="assert f(0) == 0\\n"):
        r = pool.run([program], tests)[0]
        return [r.status, r.detail, r.output]

    inet = socket.socket()
    inet.bind(("127.0.0.1", 0))
    inet.listen(4)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(home + "/sock")
    unix.listen(4)
    connect = ("import socket\\nout = []\\nfor fam, addr in ((socket.AF_INET, %r), "
               "(socket.AF_UNIX, %r)):\\n    try:\\n        s = socket.socket(fam)\\n"
               "        s.settimeout(1)\\n        s.connect(addr)\\n        out.append('connected')"
               "\\n    except OSError as e:\\n        out.append(type(e).__name__)\\nprint(out)\\n"
               % (inet.getsockname(), home + "/sock"))
    many = "import os\\nfor i in range(5000):\\n    open('f%d' % i, 'w').close()\\n" + GOOD
    if case == "userns":
        pool = sb.SandboxPool(1)
        bare = sb.SandboxPool(1, audit=False, seccomp=False)
        out["mode"], out["isolation"] = pool.mode, bare.isolation
        out["good"] = run(pool, GOOD, TESTS)
        out["secret"] = run(bare, "import os\\ntry:\\n    print(open(%r).read())\\n"
                                  "except OSError as e:\\n    print(type(e).__name__)\\n"
                                  % (home + "/secret",))
        out["environ"] = run(bare, "import os\\nfound = []\\nfor p in ['self', '1', str("
                                   "os.getppid())] + os.listdir('/proc'):\\n    try:\\n"
                                   "        found.append(open('/proc/%s/environ' % p, 'rb')"
                                   ".read())\\n    except OSError:\\n        pass\\n"
                                   "print(any(b'hf_s3cret' in e for e in found))\\n")
        out["status"] = run(bare, "print(open('/proc/self/status').read())\\n")
        out["writes"] = run(bare, "import os\\nok = []\\nfor d in (%r, '/tmp', '/var/tmp', "
                                  "'/dev/shm', %r):\\n    try:\\n        open(d + '/pwned', 'w')"
                                  "\\n        ok.append(d)\\n    except OSError:\\n        pass"
                                  "\\nprint(ok)\\n" % (home, os.getcwd()))
        out["umount"] = run(bare, "import ctypes\\nlibc = ctypes.CDLL(None, use_errno=True)\\n"
                                  "print([libc.umount2(p, 2) for p in (b'/tmp', %r)])\\n"
                                  % home.encode())
        out["net_bare"] = run(bare, connect)
        out["net_seccomp"] = run(sb.SandboxPool(1, audit=False), connect)
        out["net_audit"] = run(pool, connect)
        out["files"] = run(sb.SandboxPool(1, limits=sb.Limits(max_files=50)), many)
        out["fork bomb"] = run(bare, "import os\\nwhile True:\\n    os.fork()\\n")
    else:
        for make in (lambda: sb.SandboxPool(1), lambda: sb.run_tests(GOOD, TESTS)):
            try:
                make()
                out.setdefault("refusals", []).append("not refused")
            except sb.UnisolatedError as e:
                out.setdefault("refusals", []).append(str(e))
        pool = sb.SandboxPool(1, allow_unisolated=True, limits=sb.Limits(max_files=50))
        out["mode"], out["isolation"] = pool.mode, pool.isolation
        out["good"] = run(pool, GOOD, TESTS)
        out["files"] = run(pool, many)
        out["net_seccomp"] = run(sb.SandboxPool(1, audit=False, allow_unisolated=True), connect)
    inet.setblocking(False)
    unix.setblocking(False)
    out["accepted"] = []
    for s in (inet, unix):
        try:
            s.accept()
            out["accepted"].append(str(s))
        except BlockingIOError:
            pass
    print(json.dumps(out))
    ''')

# as root: a user namespace mapping ids 0-65535 onto themselves, where user namespaces are
# switched off (max_user_namespaces 0, a per-namespace limit), then uid 65534 execs argv[1:]
NO_USERNS = textwrap.dedent("""\
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(0x10000000) != 0:
            os._exit(90)
        os.write(w1, b"x")
        os.read(r2, 1)
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        os.execve(sys.argv[1], sys.argv[1:], dict(os.environ))
    os.read(r1, 1)
    for name in ("uid_map", "gid_map"):
        with open("/proc/%d/%s" % (pid, name), "w") as f:
            f.write("0 0 65536\\n")
    os.write(w2, b"x")
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SANDBOX_PY = str(Path(sandbox.__file__).resolve())


@pytest.fixture(scope="module")
def nobody_python():
    """An interpreter (3.10+) that uid 65534 can run and with which it can read sandbox.py:
    this test process's when it can (not under a 0700 /root), else the system's."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to become an unprivileged user")
    # setpriv execs while it still holds its capabilities: the interpreter must be reachable by
    # the uid itself (the sandbox's launcher is exec'ed without any), as must its library
    check = ("import os, sys; assert sys.version_info >= (3, 10); "
             "assert os.access(os.path.realpath(sys.executable), os.X_OK); "
             f"os.stat(os.__file__); open({SANDBOX_PY!r}).read()")
    tried = []
    for python in (sys.executable, getattr(sys, "_base_executable", sys.executable),
                   "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(python) or python in tried:
            continue
        tried.append(python)
        proc = subprocess.run([*NOBODY, python, "-I", "-c", check], capture_output=True,
                              env={"PATH": "/usr/bin:/bin"}, timeout=60)
        if proc.returncode == 0:
            return python
    pytest.skip(f"uid 65534 cannot run any of {tried} with {SANDBOX_PY} readable (e.g. a 0700 "
                "/root holds the interpreter): nothing was loosened to make it")


@pytest.fixture
def nobody_home():
    """A home of uid 65534's own (0700) with a secret only it may read, and the script."""
    home = tempfile.mkdtemp(prefix="jaxrl-nobody-")
    Path(home, "secret").write_text("hf_s3cret in the home\n")
    Path(home, "run.py").write_text(UNPRIVILEGED)
    for p in (home, f"{home}/secret", f"{home}/run.py"):
        os.chown(p, 65534, 65534)
    os.chmod(home, 0o700)
    os.chmod(f"{home}/secret", 0o600)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def run_as_nobody(prefix, python, home, case):
    env = {"HOME": home, "PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_s3cret_token"}
    proc = subprocess.run([*prefix, python, "-I", f"{home}/run.py", SANDBOX_PY, case],
                          capture_output=True, text=True, env=env, timeout=300, cwd=home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_unprivileged_user(nobody_python, nobody_home):
    out = run_as_nobody(NOBODY, nobody_python, nobody_home, "userns")
    assert out["uid"] == 65534 and out["stdlib_only"] == []
    assert all("hf_s3cret" in own for own in out["own"])  # readable outside the sandbox
    assert out["mode"] == "userns" and out["isolation"]["uid_dropped"] is False
    assert out["good"][0] == "ok", out["good"]
    assert out["secret"][2].strip() == "FileNotFoundError", out["secret"]
    assert out["environ"][2].strip() == "False", out["environ"]
    status = dict(line.split(":", 1) for line in out["status"][2].splitlines() if ":" in line)
    assert status["CapEff"].strip() == status["CapPrm"].strip() == "0" * 16, status
    assert status["Uid"].split()[0] == "1000"
    assert out["writes"][2].strip() == "[]", out["writes"]
    assert out["umount"][2].strip() == "[-1, -1]", out["umount"]
    assert "connected" not in out["net_bare"][2], out["net_bare"]
    if BPF:
        assert out["net_seccomp"][2].strip() == "['PermissionError', 'PermissionError']"
    assert out["net_audit"][0] == "forbidden"
    assert out["files"][0] == "file_limit", out["files"]
    assert out["fork bomb"][0] == "error", out["fork bomb"]
    assert out["accepted"] == []


def test_unprivileged_user_without_user_namespaces(nobody_python, nobody_home):
    prefix = [sys.executable, "-I", "-c", NO_USERNS]
    out = run_as_nobody(prefix, nobody_python, nobody_home, "unisolated")
    assert out["uid"] == 65534
    assert len(out["refusals"]) == 2
    for refusal in out["refusals"]:
        assert "allow_unisolated=True" in refusal and "\n" not in refusal, refusal
    assert out["mode"] == "unisolated" and not out["isolation"].get("mount")
    assert out["good"][0] == "ok", out["good"]
    assert out["files"][0] == "file_limit", out["files"]  # counted, without a tmpfs
    if BPF:  # the seccomp filter is the only network barrier here
        assert out["net_seccomp"][2].strip() == "['PermissionError', 'PermissionError']"
    assert out["accepted"] == []

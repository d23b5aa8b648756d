"""The sandbox's test harness: runs inside the sandbox as the unprivileged uid, never imported.

Run as `python -I -S -B -c <this source>` with an empty environment. It reads
`marshal((program, expressions, workdir, audit))` from stdin, executes the program, evaluates
each test expression in the program's namespace and writes one line per expression to fd 3:

    R <i> <repr of the value>     the value, if it is built only of exact builtin types
    E <i> <exception type>        the expression raised (or its value is not plain data)
    S / D                         started the program / done with every expression
    X <exception>                 the program itself raised (SystemExit included)
    M                             MemoryError
    F <what>                      the audit hook stopped a forbidden operation

None of this is trusted. The expected values never enter this process: `rewards.sandbox`
compares the reported values with them outside, keeps the first line per expression, and
ignores the exit status. The audit hook is not the security boundary (the kernel's limits are);
it names what the program tried, and stops it early.
"""

import builtins
import marshal
import os
import sys

_write, _exit, _type, _repr, _getcwd = os.write, os._exit, type, repr, os.getcwd
_normpath, _join, _fspath = os.path.normpath, os.path.join, os.fspath


def _emit(line):
    try:
        _write(3, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


_chunks = []
while True:
    _chunk = os.read(0, 1 << 16)
    if not _chunk:
        break
    _chunks.append(_chunk)
_program, _exprs, _workdir, _audit = marshal.loads(b"".join(_chunks))
del _chunks, _chunk
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)

_FORBIDDEN_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "socket.__new__", "socket.connect",
    "socket.bind", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
    "ctypes.addressof", "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at",
    "os.setuid", "os.setgid", "os.chroot", "sys.remote_exec",
})
_FORBIDDEN_MODULES = frozenset({
    "ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess", "multiprocessing",
    "_multiprocessing", "pty", "ssl", "_ssl", "asyncio",
})
_PATH_EVENTS = frozenset({  # file-system changes: every path argument must be in the workdir
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
    "os.chown", "os.truncate", "os.utime", "os.chflags", "shutil.rmtree", "shutil.move",
    "shutil.copyfile", "shutil.copytree",
})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_busy = [False]


def _outside(path):
    if _type(path) is int:
        return False  # a descriptor the program already holds
    try:
        path = _fspath(path)
        if _type(path) is bytes:
            path = path.decode("utf-8", "replace")
        full = _normpath(_join(_getcwd(), path))
    except Exception:  # noqa: BLE001
        return True
    return not (full == _workdir or full.startswith(_workdir + "/"))


def _hook(event, args):
    if _busy[0]:
        return
    _busy[0] = True
    try:
        reason = None
        if event in _FORBIDDEN_EVENTS:
            reason = event
        elif event == "import" and args[0].partition(".")[0] in _FORBIDDEN_MODULES:
            reason = "import " + args[0]
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (_type(mode) is str and any(c in mode for c in "wax+")) or (
                _type(flags) is int and flags & _WRITE_FLAGS)
            if writes and _outside(path):
                reason = "write outside the working directory"
        elif event in _PATH_EVENTS:
            if any(_outside(a) for a in args if _type(a) in (str, bytes)):
                reason = event + " outside the working directory"
        if reason is not None:
            _emit("F " + reason)
            _exit(86)
    finally:
        _busy[0] = False


_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set,
                    frozenset})
_MAX_REPR = 100_000


def _plain(value, depth=0):
    """Whether `value` is built only of exact builtin types (no subclass with its own __eq__)."""
    t = _type(value)
    if t not in _PLAIN or depth > 32:
        return False
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if t in (list, tuple, set, frozenset):
        return all(_plain(v, depth + 1) for v in value)
    return True


if _audit:
    sys.addaudithook(_hook)

_namespace = {"__name__": "__solution__", "__builtins__": builtins}
_emit("S")
try:
    exec(compile(_program, "<solution>", "exec"), _namespace)
except MemoryError:
    _emit("M")
    _exit(1)
except BaseException as _e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
    _emit(f"X {_type(_e).__name__}: {str(_e)[:200]}")
    _exit(1)

for _i, _expr in enumerate(_exprs):
    try:
        _value = eval(compile(_expr, "<test>", "eval"), _namespace)
        _text = _repr(_value) if _plain(_value) else None
        if _text is None or len(_text) > _MAX_REPR:
            _emit(f"E {_i} value is not plain data (or too large)")
        else:
            _emit(f"R {_i} {_text}")
    except MemoryError:
        _emit("M")
        _exit(1)
    except BaseException as _e:  # noqa: BLE001
        _emit(f"E {_i} {_type(_e).__name__}")
_emit("D")
try:
    sys.stdout.flush()
    sys.stderr.flush()
finally:
    _exit(0)

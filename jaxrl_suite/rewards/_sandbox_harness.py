"""The sandbox's test harness: runs inside the sandbox (as the unused uid in "root" mode, as
inside uid 1000 of the user namespace in "userns" mode, with no capability), never imported.

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

The program can reach this module's globals (`sys._getframe(1).f_globals`,
`sys.modules["__main__"]`) and change anything in them, and in builtins and other modules. So
the hook keeps no state there: `_make_hook` builds it as a closure over immutable values (the
working directory, frozensets of event and module names, the C functions it calls), it keeps no
"busy" flag, reads no global name when called and runs no code of the program (paths are read
as exact str/bytes copies, without calling their methods). Audit hooks cannot be removed, and
the function is referenced by the interpreter's hook list only; the gc functions that could
find it (get_objects, get_referrers, get_referents) and subinterpreters (which have no hook of
ours) are forbidden.
"""

import builtins
import marshal
import os
import sys

_write, _exit, _type, _repr = os.write, os._exit, type, repr


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


def _make_hook(workdir):
    """The audit hook: a closure over immutable state, so nothing the program can reach (this
    module's globals, builtins, other modules) changes what it checks. It keeps no flag, calls no
    code of the program (a path must be a str or bytes, or a subclass, copied without calling
    its methods; any other path object is refused for a write), and reads no global name at
    call time. The hook function itself is referenced only by the interpreter's hook list, which
    Python cannot read; the gc functions that could find it are forbidden."""
    forbidden_events = frozenset({
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
        "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof",
        "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "os.setuid",
        "os.setgid", "os.chroot", "sys.remote_exec",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",  # the way to this hook
    })
    forbidden_modules = frozenset({
        "ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess",
        "multiprocessing", "_multiprocessing", "pty", "ssl", "_ssl", "asyncio",
        # subinterpreters have no audit hook of ours; the test modules poke at internals
        "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels",
        "_interpqueues", "concurrent.interpreters", "_testcapi", "_testinternalcapi",
        "_testmultiphase", "_testsinglephase", "_testbuffer", "_testclinic",
        "_testimportmultiple", "_ctypes_test",
    })
    one_path = frozenset({  # file-system changes: every path argument must be in the workdir
        "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
        "os.chflags", "shutil.rmtree"})
    two_paths = frozenset({"os.rename", "os.symlink", "os.link", "shutil.move",
                           "shutil.copyfile", "shutil.copytree"})
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    type_, str_, bytes_, int_, len_ = type, str, bytes, int, len
    join, decode, mro = str.join, bytes.decode, type.__dict__["__mro__"].__get__
    write, exit_, getcwd = os.write, os._exit, os.getcwd
    prefix = workdir + "/"

    def text(x):
        """An exact str of a str or bytes, or of a subclass (copied by str and bytes code:
        none of its methods run), else None."""
        t = type_(x)
        if t is str_:
            return x
        if t is bytes_:
            return decode(x, "utf-8", "replace")
        for base in mro(t):  # the type's own tuple, compared by identity
            if base is str_:
                return join("", (x,))
            if base is bytes_:
                return decode(x, "utf-8", "replace")
        return None

    def outside(path):
        if type_(path) is int_:
            return False  # a descriptor the program already holds
        name = text(path)
        if name is None:
            return True  # a path object: not looked into, refused
        if not name.startswith("/"):
            name = getcwd() + "/" + name
        parts = []
        for part in name.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part != "" and part != ".":
                parts.append(part)
        full = "/" + "/".join(parts)
        return not (full == workdir or full.startswith(prefix))

    def hook(event, args):
        reason = None
        if event in forbidden_events:
            reason = event
        elif event == "import":
            name = text(args[0]) if len_(args) else None
            if name is None or name.partition(".")[0] in forbidden_modules \
                    or name in forbidden_modules:
                reason = "import " + (name or "?")
        elif event == "open":
            path = args[0] if len_(args) > 0 else None
            mode = text(args[1]) if len_(args) > 1 and args[1] is not None else None
            flags = args[2] if len_(args) > 2 else None
            writes = False
            if mode is not None:
                for c in "wax+":
                    if c in mode:
                        writes = True
            if type_(flags) is int_ and flags & write_flags:
                writes = True
            if writes and outside(path):
                reason = "write outside the working directory"
        elif event in one_path or event in two_paths:
            n = 2 if event in two_paths else 1
            if len_(args) < n or outside(args[0]) or n == 2 and outside(args[1]):
                reason = event + " outside the working directory"
        if reason is not None:
            write(3, ("F " + reason.replace("\n", " ") + "\n").encode("utf-8", "replace"))
            exit_(86)

    return hook


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
    sys.addaudithook(_make_hook(_workdir))  # kept by the interpreter only
del _make_hook, _audit

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

"""The sandbox's launcher: run by `rewards.sandbox` as root or as the calling user, never imported.

It runs as `python -I -S -B -c <this source> <config json>` with an empty environment, so it
imports only the standard library (ctypes for unshare, mount, prctl and the seccomp filter). The
config's "mode" says how the program is isolated:

* "root" (the launcher runs as root): new mount, PID, network, IPC and UTS namespaces (each tried
  on its own, recording which succeeded); the program runs as an unused uid (see `sandbox.py`).
* "userns" (no root; the kernel allows unprivileged user namespaces): a user namespace first, in
  which ONE inside id, 1000, maps to the launcher's real uid/gid (/proc/self/setgroups "deny"
  first); then the same five namespaces, owned by it. The launcher holds every capability inside
  that namespace only; the program is exec'ed as inside uid 1000, which is not 0, so it loses
  every capability at execve (CapEff 0). Outside, it is the real user: the mounts below hide that
  user's files. The mount and PID namespaces are required in this mode.
* "unisolated" (neither): no namespaces; rlimits, no_new_privs and the seccomp filter only.
Where the launcher runs as root in a mode other than "root" (forced, for tests), it first becomes
the config's unused "outer" uid, which stands for the unprivileged user (in "userns" mode after a
mount namespace of root's own that makes the interpreter's tree reachable by that uid).

Three processes:

* L (this process): enters the namespaces, forks C, enforces the wall-clock timeout by SIGKILLing
  C, and reports how C ended on the status pipe. Without a PID namespace it is a child subreaper:
  once C is gone it kills every descendant left (a daemon that left the process group), and as
  root every process of the sandbox uid too.
* C (PID 1 of the new PID namespace, where there is one): with a mount namespace, makes every
  mount read-only; covers the home and temporary directories, /run and the directory holding the
  working directory with empty read-only tmpfs, re-exposing (read-only bind) only the
  interpreter's install tree where it lies below one of them; mounts a fresh tmpfs (size and
  inode count capped) as the working directory and a private /proc (in "userns" mode an empty
  tmpfs over /proc where the kernel refuses a new proc mount); exposes the interpreter's tree if
  it sits below a directory others cannot enter. Then forks G and reaps until G ends (without a
  mount namespace it also counts the working directory's files meanwhile, killing G over the
  cap). When C exits, the kernel kills every process left in the PID namespace.
* G: sets the resource limits, drops to the sandbox uid/gid with no supplementary groups (root
  mode), sets no_new_privs, loads the seccomp filter, redirects stdout/stderr to the output pipe
  and fd 3 to the result pipe, closes every other descriptor and execs the harness
  (`_sandbox_harness.py`).

The seccomp filter (CFG["seccomp"]: "bpf", a classic BPF program built here for x86_64 and
aarch64 and loaded with prctl; "pyseccomp", the same rules through libseccomp, for other
machines where the `sandbox` extra is installed; None: no filter) fails with EPERM: socket(2)
and socketpair(2) of every family (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET...),
io_uring_setup/enter/register, the kill family and pidfds, ptrace and process_vm_*, bpf,
perf_event_open, userfaultfd, keyctl, memfd_create, unshare, setns, clone with a namespace flag,
the mount syscalls (mount, umount2, pivot_root, chroot, open_tree...), module and kexec loading,
acct, swapon/off and reboot; clone3 fails with ENOSYS (glibc then uses clone, whose flags the
filter can read); a syscall of another ABI (x32, i386) kills the process.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys
import time

CFG = json.loads(sys.argv[1])
MODE = CFG["mode"]
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
LIBC.unshare.argtypes = [ctypes.c_int]
LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]

CLONE = {"mount": 0x00020000, "uts": 0x04000000, "ipc": 0x08000000, "pid": 0x20000000,
         "network": 0x40000000}
CLONE_NEWUSER, CLONE_NEWCGROUP = 0x10000000, 0x02000000
INNER_ID = 1000  # the one id mapped inside the user namespace: not 0, so no capability survives
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 32, 1024, 2048, 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
ST_TO_MS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME,
            4096: MS_RELATIME}  # statvfs f_flag bit -> mount flag kept on the read-only remount
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 4, 22
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
FILE_POLL_S = 0.02  # without a mount namespace: how often C counts the working directory's files


class UsernsUnavailable(Exception):
    """The kernel refuses an unprivileged user namespace here."""


def report(**fields):
    try:
        os.write(CFG["status_fd"], (json.dumps(fields) + "\n").encode())
    except OSError:
        pass


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else s.encode())
    check(LIBC.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def mount_points():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            field = line.split()[4]
            points.append(field.encode().decode("unicode_escape"))  # \040 -> space
    return points


def remount_readonly(point, extra=0):
    """A read-only bind remount that keeps the flags a user namespace may not clear."""
    keep = extra
    flags = os.statvfs(point).f_flag
    for st_bit, ms_bit in ST_TO_MS.items():
        keep |= ms_bit if flags & st_bit else 0
    mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def under(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def expose(path, staging):
    """Makes `path` reachable by an unprivileged uid: every ancestor others cannot enter is
    covered by a 0755 tmpfs holding a read-only bind of just the next component."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1):
        ancestor = "/" + "/".join(parts[: i + 1])
        if os.stat(ancestor).st_mode & stat.S_IXOTH:
            continue
        child = ancestor + "/" + parts[i + 1]
        os.mkdir(staging)
        mount(child, staging, None, MS_BIND | MS_REC)
        mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        os.mkdir(child)
        mount(staging, child, None, MS_MOVE)
        os.rmdir(staging)
        mount(None, child, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
        mount(None, ancestor, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def hide_and_reexpose(work):
    """Covers each directory of CFG["hide"] with an empty tmpfs, and binds back (read-only)
    the interpreter's trees of CFG["expose"] that lie below one of them: bound first onto a
    stage tmpfs at the working directory, reached through the current directory once the stage
    is hidden too, and moved into place. Returns the directories covered."""
    hide = [h for h in CFG["hide"] if os.path.isdir(h) and not os.path.islink(h)]
    for path in CFG["expose"]:
        for h in hide:
            if under(h, path):
                raise OSError(f"the interpreter's tree {path} holds {h}, which must be hidden")
    staged = [p for p in CFG["expose"] if any(under(p, h) for h in hide)]
    if staged:
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0700")
        for i, path in enumerate(staged):
            os.mkdir(f"{work}/{i}")
            mount(path, f"{work}/{i}", None, MS_BIND | MS_REC)
        os.chdir(work)
    for h in hide:
        mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=256k,nr_inodes=1024,mode=0755")
    for i, path in enumerate(staged):
        os.makedirs(path, 0o755, exist_ok=True)
        mount(str(i), path, None, MS_MOVE)  # relative to the current directory: the stage
        remount_readonly(path)
    if staged:
        check(LIBC.umount2(b".", MNT_DETACH), "umount the stage")
        os.chdir("/")
    return hide


def setup_mounts(iso):
    """Read-only everything, the user's directories hidden, a fresh tmpfs working directory, a
    private /proc."""
    if os.readlink("/proc/self/ns/mnt") == CFG["host_mnt_ns"]:
        raise OSError("the mount namespace is the host's")  # never remount the host read-only
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    failed = []
    for point in sorted(set(mount_points()), key=len):
        try:
            remount_readonly(point)
        except OSError:
            failed.append(point)
    work = CFG["workdir"]
    hidden = hide_and_reexpose(work)
    os.makedirs(work, 0o700, exist_ok=True)
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={CFG['workdir_bytes']},nr_inodes={CFG['max_files'] + 2},mode=0700,"
          f"uid={CFG['uid']},gid={CFG['gid']}")
    for path in CFG["expose"]:
        expose(path, work + "/.stage")
    for h in hidden:
        remount_readonly(h)
    iso["hidden"] = hidden
    if iso.get("pid"):
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            iso["proc"] = "private"
        except OSError as e:
            if MODE != "userns":
                raise
            mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
            remount_readonly("/proc")
            iso["proc"] = f"hidden (a new proc mount failed: {e.strerror})"
    return failed


def count_files(root, cap):
    """Entries below `root` (not following links), counting stops past `cap`."""
    n, todo = 0, [root]
    while todo and n <= cap:
        try:
            with os.scandir(todo.pop()) as it:
                for entry in it:
                    n += 1
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        except OSError:
            pass
    return n


# -- seccomp --------------------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED = {  # syscall: (x86_64, aarch64), failed with EPERM
    "socket": (41, 198), "socketpair": (53, 199),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "memfd_create": (319, 279), "unshare": (272, 97), "setns": (308, 268),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
}
CLONE_NR, CLONE3_NR = (56, 220), (435, 435)
NS_FLAGS = sum(CLONE.values()) | CLONE_NEWUSER | CLONE_NEWCGROUP  # clone() cannot make a time ns
EPERM, ENOSYS = 1, 38


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def import_pyseccomp():
    """pyseccomp (the `sandbox` extra), for machines other than x86_64 and aarch64: imported
    first thing, from where the trainer's interpreter found it, before any mount or uid
    change."""
    sys.path.insert(0, CFG["seccomp_path"])
    import pyseccomp

    sys.path.pop(0)
    return pyseccomp


def load_seccomp(pyseccomp=None):
    """The filter of the module docstring, for this process and what it execs: built here
    (CFG["seccomp"] "bpf") or by libseccomp through pyseccomp ("pyseccomp")."""
    if pyseccomp is not None:
        load_libseccomp(pyseccomp)
        return
    machine = os.uname().machine
    col = 0 if machine == "x86_64" else 1
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ/JGE/JSET|K
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_*
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH[machine]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI: syscall numbers with bit 30 set
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno | EPERM)]
    for nrs in DENIED.values():
        prog += [(jeq, 0, 1, nrs[col]), (ret, 0, 0, errno | EPERM)]
    prog += [(jeq, 0, 1, CLONE3_NR[col]), (ret, 0, 0, errno | ENOSYS)]
    prog += [(jeq, 0, 3, CLONE_NR[col]), (ld, 0, 0, 16),  # clone's flags: args[0], low word
             (jset, 0, 1, NS_FLAGS), (ret, 0, 0, errno | EPERM)]
    prog += [(ret, 0, 0, allow)]
    insns = (SockFilter * len(prog))(*[SockFilter(c, t, f, k) for c, t, f, k in prog])
    fprog = SockFprog(len(prog), insns)
    check(LIBC.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fprog), 0, 0), "seccomp filter")


def load_libseccomp(sc):
    """The same filter through libseccomp, which knows every architecture's numbers."""
    filt = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in DENIED:
        try:
            filt.add_rule(sc.ERRNO(EPERM), name)
        except (OSError, ValueError):  # no such syscall on this architecture
            pass
    filt.add_rule(sc.ERRNO(ENOSYS), "clone3")
    flags_arg = 1 if os.uname().machine.startswith("s390") else 0
    for bit in range(32):
        if NS_FLAGS & (1 << bit):
            filt.add_rule(sc.ERRNO(EPERM), "clone", sc.Arg(flags_arg, sc.MASKED_EQ, 1 << bit,
                                                            1 << bit))
    filt.load()


# -- the processes ----------------------------------------------------------------------------

def become(uid, gid):
    """Root -> `uid`/`gid`, no supplementary groups: every capability goes. Dumpable again (the
    uid change cleared it), so that /proc/self belongs to `uid` as it would to a user."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl dumpable")


def prestage():
    """Root standing in for an unprivileged user ("userns" mode as root): a mount namespace of
    root's own where the interpreter's tree is reachable by the outer uid, entered before
    becoming it (the user namespace's mount namespace is then made from this one)."""
    check(LIBC.unshare(CLONE["mount"]), "unshare mount")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    for path in CFG["expose"]:
        expose(path, CFG["workdir"] + "/.prestage")


def enter_userns():
    """A user namespace in which INNER_ID is this process's uid and gid."""
    uid, gid = os.geteuid(), os.getegid()
    if LIBC.unshare(CLONE_NEWUSER) != 0:
        raise UsernsUnavailable(f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{INNER_ID} {uid} 1\n")
    write_file("/proc/self/gid_map", f"{INNER_ID} {gid} 1\n")


def grandchild(iso, pyseccomp):
    """G: limits, uid drop, descriptors, exec the harness. Never returns."""
    try:
        # descriptors first, while RLIMIT_NOFILE still covers every inherited one: the program
        # keeps 0 (its input, read by the harness), 1 and 2 (output) and 3 (results) only
        os.dup2(CFG["output_fd"], 1)
        os.dup2(CFG["output_fd"], 2)
        os.dup2(CFG["result_fd"], 3)
        os.closerange(4, max(os.sysconf("SC_OPEN_MAX"), 1 << 16))
        lim = CFG["limits"]
        for name, value in (("RLIMIT_AS", lim["address_space"]), ("RLIMIT_FSIZE", lim["fsize"]),
                            ("RLIMIT_NOFILE", lim["nofile"]), ("RLIMIT_NPROC", lim["nproc"]),
                            ("RLIMIT_CORE", 0), ("RLIMIT_STACK", lim["stack"])):
            resource.setrlimit(getattr(resource, name), (value, value))
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
        if MODE == "root":
            become(CFG["uid"], CFG["gid"])
        check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
        check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
        if os.geteuid() == 0 or (MODE == "userns" and os.geteuid() != INNER_ID):
            raise OSError("the program would run as root")
        if iso.get("seccomp"):
            load_seccomp(pyseccomp)
        os.chdir(CFG["workdir"])
        exe = CFG["python"]
        os.execve(exe, [exe, "-I", "-S", "-B", "-c", CFG["harness"]], {})
    except BaseException as e:  # noqa: BLE001 - report and die, whatever happened
        report(setup_error=f"sandboxed process: {type(e).__name__}: {e}")
        os.write(3, f"X sandbox setup: {type(e).__name__}: {e}\n".encode())
        os._exit(127)


def init(iso, pyseccomp):
    """C: mounts, fork G, reap until G ends (counting files without a mount namespace), report
    its end. Never returns."""
    try:
        check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
        if iso.get("mount"):
            try:
                iso["readonly_failed"] = setup_mounts(iso)
            except OSError as e:
                if MODE == "userns":  # the program would see the user's files: refuse
                    raise
                iso["mount"] = False
                iso["mount_error"] = str(e)
        work = CFG["workdir"]
        if not iso.get("mount") and MODE == "root":
            os.chown(work, CFG["uid"], CFG["gid"])
            os.chmod(work, 0o700)
        report(isolation=iso)
        g = os.fork()
        if g == 0:
            grandchild(iso, pyseccomp)
        os.close(CFG["output_fd"])
        os.close(CFG["result_fd"])
        os.close(0)
        cap = CFG["max_files"]
        end = {}
        while True:
            if iso.get("mount"):  # the tmpfs caps the file count
                pid, status, usage = os.wait4(-1, 0)
            else:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
                if pid == 0:
                    if count_files(work, cap) > cap:
                        end["file_limit"] = True
                        os.kill(g, signal.SIGKILL)
                        continue
                    time.sleep(FILE_POLL_S)
                    continue
            if pid == g:
                break
        end["cpu_s"] = usage.ru_utime + usage.ru_stime
        if os.WIFSIGNALED(status):
            end["signal"] = os.WTERMSIG(status)
        else:
            end["exit"] = os.WEXITSTATUS(status)
        if iso.get("mount"):
            st = os.statvfs(work)
            end["files"] = st.f_files - st.f_ffree - 1
            if st.f_ffree == 0:
                end["file_limit"] = True
        elif count_files(work, cap) > cap:
            end["file_limit"] = True
        report(child=end)
        os._exit(0)
    except BaseException as e:  # noqa: BLE001
        report(setup_error=f"sandbox init: {type(e).__name__}: {e}")
        os._exit(127)


def kill_uid(uid):
    """Kills every process of `uid` (kill(-1) as that uid reaches exactly its own processes)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(CFG["gid"], CFG["gid"], CFG["gid"])
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def children(parent):
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == parent:
            kids.append(int(name))
    return kids


def kill_descendants():
    """As a child subreaper: kills each child left, whose own children then become ours, until
    none is left."""
    for _ in range(10_000):
        kids = children(os.getpid())
        if not kids:
            return
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for kid in kids:
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass


def enter_namespaces(iso):
    for name, flag in CLONE.items():
        if name in CFG["namespaces"]:
            iso[name] = LIBC.unshare(flag) == 0


def main():
    os.umask(0o022)
    iso = {"mode": MODE, "uid_dropped": os.geteuid() == 0}
    pyseccomp = None
    try:
        if CFG["seccomp"] == "pyseccomp":
            pyseccomp = import_pyseccomp()
        if MODE == "root":
            enter_namespaces(iso)
        else:
            if os.geteuid() == 0:
                if MODE == "userns":
                    prestage()
                else:
                    os.chown(CFG["workdir"], CFG["outer_uid"], CFG["outer_gid"])
                    os.chmod(CFG["workdir"], 0o700)
                become(CFG["outer_uid"], CFG["outer_gid"])
            if MODE == "userns":
                enter_userns()
                iso["userns"] = True
                enter_namespaces(iso)
                if not (iso.get("mount") and iso.get("pid")):
                    raise OSError("a user namespace without its mount and PID namespaces")
    except UsernsUnavailable as e:
        report(userns_unavailable=str(e))
        return
    except (OSError, ImportError) as e:
        report(setup_error=f"launcher: {type(e).__name__}: {e}")
        return
    iso["seccomp"] = CFG["seccomp"] or False
    if not iso.get("pid"):
        check(LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl subreaper")
    c = os.fork()
    if c == 0:
        init(iso, pyseccomp)
    ended = {}

    def on_alarm(*_):
        ended["timeout"] = True
        os.kill(c, signal.SIGKILL)

    def on_term(*_):
        ended["terminated"] = True
        os.kill(c, signal.SIGKILL)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.setitimer(signal.ITIMER_REAL, CFG["wall_s"])
    os.waitpid(c, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    if not iso.get("pid"):
        if MODE == "root":
            kill_uid(CFG["uid"])
        kill_descendants()
    report(launcher=ended)


main()

"""The sandbox's launcher: run as root (or the calling user) by `rewards.sandbox`, never imported.

It runs as `python -I -S -B -c <this source> <config json>` with an empty environment, so it
imports only the standard library. Three processes:

* L (this process): unshares the mount, PID, network, IPC and UTS namespaces (each on its own,
  recording which succeeded), forks C, enforces the wall-clock timeout by SIGKILLing C, and
  reports how C ended on the status pipe. Without a PID namespace it also kills every process
  of the sandbox uid (a daemon that left the process group) once C is gone.
* C (PID 1 of the new PID namespace): makes every mount read-only, mounts a fresh tmpfs as the
  working directory and a private /proc, exposes the interpreter's install tree if it sits
  below a directory others cannot enter (e.g. /root/.pyenv), forks G and reaps until G ends.
  When C exits, the kernel kills every process left in the namespace.
* G: sets the resource limits, drops to the sandbox uid/gid with no supplementary groups and no
  new privileges, redirects stdout/stderr to the output pipe and fd 3 to the result pipe,
  closes every other descriptor and execs the harness (`_sandbox_harness.py`).
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys

CFG = json.loads(sys.argv[1])
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
LIBC.unshare.argtypes = [ctypes.c_int]
LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]

CLONE = {"mount": 0x00020000, "uts": 0x04000000, "ipc": 0x08000000, "pid": 0x20000000,
         "network": 0x40000000}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 32, 1024, 2048, 4096, 8192, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
ST_TO_MS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME,
            4096: MS_RELATIME}  # statvfs f_flag bit -> mount flag kept on the read-only remount
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


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


def mount_points():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            field = line.split()[4]
            points.append(field.encode().decode("unicode_escape"))  # \040 -> space
    return points


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


def setup_mounts(iso):
    """Read-only everything, a fresh tmpfs working directory, a private /proc."""
    if os.readlink("/proc/self/ns/mnt") == CFG["host_mnt_ns"]:
        raise OSError("the mount namespace is the host's")  # never remount the host read-only
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    failed = []
    for point in sorted(set(mount_points()), key=len):
        try:
            keep = 0
            flags = os.statvfs(point).f_flag
            for st_bit, ms_bit in ST_TO_MS.items():
                keep |= ms_bit if flags & st_bit else 0
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            failed.append(point)
    work = CFG["workdir"]
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={CFG['workdir_bytes']},mode=0700,uid={CFG['uid']},gid={CFG['gid']}")
    for path in CFG["expose"]:
        expose(path, work + "/.stage")
    if iso.get("pid"):
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return failed


def import_seccomp():
    """pyseccomp, imported while still root (its site-packages may lie where the sandbox uid
    cannot read, e.g. a venv in a 0700 directory)."""
    sys.path.insert(0, CFG["seccomp_path"])
    import pyseccomp

    sys.path.pop(0)
    return pyseccomp


def seccomp_no_network(seccomp):
    """Without a network namespace: a seccomp filter that fails socket(2) for every family but
    AF_UNIX (pyseccomp over libseccomp, where installed)."""
    filt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for family in (2, 10, 16, 17):  # AF_INET, AF_INET6, AF_NETLINK, AF_PACKET
        filt.add_rule(seccomp.ERRNO(1), "socket", seccomp.Arg(0, seccomp.EQ, family))
    filt.load()


def grandchild(iso):
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
        seccomp = import_seccomp() if iso.get("seccomp") else None
        if os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(CFG["gid"], CFG["gid"], CFG["gid"])
            os.setresuid(CFG["uid"], CFG["uid"], CFG["uid"])
        check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
        check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
        if seccomp is not None:
            seccomp_no_network(seccomp)
        os.chdir(CFG["workdir"])
        exe = CFG["python"]
        os.execve(exe, [exe, "-I", "-S", "-B", "-c", CFG["harness"]], {})
    except BaseException as e:  # noqa: BLE001 - report and die, whatever happened
        report(setup_error=f"sandboxed process: {type(e).__name__}: {e}")
        os.write(3, f"X sandbox setup: {type(e).__name__}: {e}\n".encode())
        os._exit(127)


def init(iso):
    """C: mounts, fork G, reap until G ends, report its end. Never returns."""
    try:
        check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
        if iso.get("mount"):
            try:
                iso["readonly_failed"] = setup_mounts(iso)
            except OSError as e:
                iso["mount"] = False
                iso["mount_error"] = str(e)
        if not iso.get("mount"):
            os.chown(CFG["workdir"], CFG["uid"], CFG["gid"])
            os.chmod(CFG["workdir"], 0o700)
        report(isolation=iso)
        g = os.fork()
        if g == 0:
            grandchild(iso)
        os.close(CFG["output_fd"])
        os.close(CFG["result_fd"])
        os.close(0)
        while True:
            pid, status, usage = os.wait4(-1, 0)
            if pid == g:
                break
        end = {"cpu_s": usage.ru_utime + usage.ru_stime}
        if os.WIFSIGNALED(status):
            end["signal"] = os.WTERMSIG(status)
        else:
            end["exit"] = os.WEXITSTATUS(status)
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


def main():
    iso = {"uid_dropped": os.geteuid() == 0}
    for name, flag in CLONE.items():
        if name in CFG["namespaces"]:
            iso[name] = LIBC.unshare(flag) == 0
    if not iso.get("network") and CFG.get("seccomp_path"):
        iso["seccomp"] = True
    c = os.fork()
    if c == 0:
        init(iso)
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
    if iso["uid_dropped"] and not iso.get("pid"):
        kill_uid(CFG["uid"])
    report(launcher=ended)


main()

"""Run untrusted, model-written Python in a limited subprocess, for code-execution rewards.

Why: a code reward executes whatever the policy wrote, and during RL the policy writes infinite
loops, fork bombs, 10 GB allocations and megabytes of prints. None of these may stall or kill the
trainer, so each program runs in its own interpreter with limits, and every way it can end (exit,
timeout, memory, output flood, signal) comes back as an `ExecResult`. Containment does not rest
on the audit hook: a program that reaches raw syscalls (ctypes, sqlite's C code, os.pidfd_open,
os.mknod) meets the kernel's limits below.

What `run_python` does, split by how much it can be trusted:

Hard (enforced by the kernel, user code cannot lift them):
  - a fresh interpreter, `python -I -S` (no site-packages, no PYTHON* variables, no user site), in
    a fresh temporary directory that is its cwd and HOME and is deleted afterwards, with a minimal
    environment (PATH, LC_ALL, HOME);
  - rlimits set by the program's process itself before the program is read: RLIMIT_AS
    (memory_mb), RLIMIT_CPU (cpu_s), RLIMIT_FSIZE (files written are capped at
    `FILE_SIZE_BYTES`; larger writes fail with EFBIG), RLIMIT_CORE = 0, RLIMIT_NOFILE =
    `MAX_OPEN_FILES`, and RLIMIT_NPROC = (processes its uid has now) + 2 + `NPROC_MARGIN`; the
    kernel counts NPROC over all processes of the uid, hence the count, and exempts only root,
    which the program no longer is (below) unless the uid drop had to be skipped;
  - a new session and process group (`start_new_session=True`); on timeout, output flood, or
    plain exit the whole group gets SIGKILL, and afterwards every process left in the session is
    killed too (found through /proc);
  - its own PID namespace: the prelude unshares CLONE_NEWPID and forks the namespace's init (pid
    1), which forks the program (pid 2), reaps orphans and passes the program's exit status up
    to the first process, which ends the same way (so `returncode` is the program's). The
    program sees and can signal only its own namespace (kill, setpriority, pidfd_open, /proc
    all take pids in it), and when init ends, with the program or killed with the group, the
    kernel kills every process left in the namespace, those that left the session included;
  - its own IPC namespace: System V shared memory, semaphores and message queues and POSIX
    message queues it creates are invisible to others and vanish with it;
  - an unprivileged uid: when the trainer is root the program runs as `SANDBOX_IDS` (nobody,
    nogroup, no supplementary groups), so it cannot signal, renice or read what belongs to root.
    That needs the interpreter's directories to be readable by others as seen inside the
    sandbox (the mount namespace below makes /root traversable when it hides it); the prelude
    checks the mode bits, and when they are not, the program stays root and a warning says so.
    Either way every capability is dropped (those of a user namespace included) and
    PR_SET_NO_NEW_PRIVS is set, so exec cannot regain any;
  - a seccomp filter (EPERM, never a kill, so programs get an OSError): pidfd_open,
    pidfd_send_signal, pidfd_getfd, rt_(tg)sigqueueinfo, ptrace, process_vm_readv/writev, kcmp,
    ioprio_set, mount, umount2, pivot_root, chroot, unshare, setns and the new mount API, clone
    with a CLONE_NEW* flag (clone3 answers ENOSYS so the C library falls back to clone), mknod
    and mknodat (hence mkfifo), keyctl, bpf, perf_event_open, userfaultfd, io_uring, reboot,
    kexec, module loading, swapon/off, clock and host name setting; setpriority other than
    (PRIO_PROCESS, self), sched_setaffinity/setscheduler/setparam/setattr and prlimit64 on
    another pid, fcntl F_SETOWN(_EX) (SIGIO to a chosen pid), AF_UNIX sockets (a daemon's
    socket file is reachable from any network namespace); without a PID namespace also kill
    outside its own process group, tkill and tgkill. The filter is compiled once in the
    trainer by the system's libseccomp (libseccomp.so.2, through ctypes: the library systemd,
    runc (Docker) and Flatpak use; it resolves syscall numbers per architecture and
    guards the x32 and 32-bit ABIs, which a hand-written BPF filter would have to get right by
    hand) and handed to the child as BPF bytes, which it loads with prctl(PR_SET_SECCOMP): the
    `python -I -S` child imports nothing outside the standard library. Without libseccomp the
    run goes on unfiltered, with a warning;
  - no network, when the kernel allows it: the child first calls unshare(CLONE_NEWNET) (as
    root) or unshare(CLONE_NEWUSER | CLONE_NEWNET) with the trainer's uid/gid mapped to
    themselves (unprivileged user namespaces), so it sees only a loopback interface that is
    down; `network_namespace_available()` says whether that works;
  - the trainer's files unreadable and the file system read-only, when the kernel allows it: the
    child enters a private mount namespace (unshare(CLONE_NEWNS), inside the user namespace when
    not root), makes the mount tree private, and covers with an empty read-only tmpfs each
    directory to hide: the trainer's cwd at call time (repository or run directory), its HOME,
    /root, /home and the caller's `hidden_paths`. The directories the interpreter reads
    (sys.prefix and friends, the sys.path entries with the stdlib and lib-dynload, the
    executable's directory) and the sandbox directory are never hidden: a hidden directory that
    contains one gets it bound back (a venv under the repository, a pyenv under /root); a path
    to hide inside one is left visible. Then every mount is made read-only in one
    mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY) call (Linux 5.12), and one tmpfs of
    `TMPFS_BYTES` is mounted with three directories bound as the sandbox directory, /tmp and
    /dev/shm: the only writable places, their total capped, gone when the run ends. Finally
    /proc is covered too (the program then has no /proc of its own either), because
    /proc/<pid>/cwd, /root and /environ of the trainer's processes reach their files and API
    keys past any mount. `mount_namespace_available()` and `private_tmp_available()` say
    whether these work here.
  Where the kernel refuses a step (no user namespaces, no seccomp, no mount_setattr or tmpfs),
  the run goes on without it and a warning naming what is missing is logged once per process;
  `pid_namespace_available()`, `seccomp_available()`, `unprivileged_uid_available()` and
  `private_tmp_available()` report what a run with the defaults gets here.

Best-effort (in-process, Python level; code that reaches raw syscalls, e.g. through a C
extension, gets past them, and meets the hard limits above instead):
  - a `sys.addaudithook` guard installed before the user code runs. It raises PermissionError on:
    creating, connecting or binding sockets; os.system / exec* / spawn* / fork / forkpty /
    posix_spawn / subprocess.Popen / os.kill; resource.setrlimit / prlimit; ctypes (import of
    ctypes/_ctypes, dlopen, dlsym, raw memory) and import of _posixsubprocess (the unaudited
    fork-exec); opening a file for writing, and removing, renaming, creating or chmod-ing
    paths, outside the temporary directory (paths resolved with realpath, so ../ and symlinks
    do not escape it); opening for reading, listing (os.listdir, os.scandir, hence pathlib, glob
    and os.walk) of paths under the hidden directories, except under the kept interpreter
    directories, and of /proc/<pid> of any process but its own. Metadata calls that have no
    audit event (os.stat, os.readlink) are not refused.

Not done: no cgroups (memory is bounded by RLIMIT_AS and the tmpfs, CPU by RLIMIT_CPU, but
nothing bounds kernel memory or I/O bandwidth); the rest of the file system (/etc, /work, ...)
stays readable wherever its permissions let the program's uid read (everything world-readable,
and everything the trainer's uid can read when the trainer is not root), so put secrets and
data in hidden directories or pass them in `hidden_paths`; exec of the system's binaries is
refused only by the audit hook (no new privileges either way); with `mount_namespace=False`
there is no read-only view and no private /tmp.

Namespaces and limits are applied by the child's prelude, not by a `preexec_fn`: the trainer
is multithreaded (JAX, reward pools), and CPython documents `preexec_fn` as unsafe (it can
deadlock the child) when the parent has threads. The child is a fresh single-threaded
interpreter, where unshare, mount, setuid and forks are safe, and it applies them before it
reads the program. Parent-side, only `start_new_session` and `pass_fds` (a pipe on which the
prelude reports what held) are used, which run in C. The prelude itself is a sequence of
system calls through ctypes, not util-linux's unshare/setpriv or bubblewrap: those would cost a
fork-exec each per sample, and bubblewrap is not installed by pip.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from typing import NamedTuple, Sequence

FILE_SIZE_BYTES = 1 << 20
"""RLIMIT_FSIZE: the largest file the program may write (1 MiB)."""
MAX_OPEN_FILES = 64
"""RLIMIT_NOFILE: the interpreter needs about 10 descriptors."""
MAX_STDIN_BYTES = 32_768
"""Below the 64 KiB pipe buffer, so writing stdin never waits for the program."""
NPROC_MARGIN = 8
"""How many processes (and threads) beyond those the user has at spawn time the program may add."""
TMPFS_BYTES = 64 << 20
"""Size of the private tmpfs that holds the sandbox directory, /tmp and /dev/shm together."""
SANDBOX_IDS = (65534, 65534)
"""The uid and gid (nobody, nogroup) the program runs as when the trainer is root."""

_log = logging.getLogger(__name__)

# Denied outright (EPERM): acting on other processes, the kernel, devices, mounts and
# namespaces. Names libseccomp does not know on this architecture are skipped.
_DENIED_SYSCALLS = (
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "process_mrelease",
    "kcmp", "ioprio_set", "migrate_pages", "move_pages",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mknod", "mknodat", "open_by_handle_at", "name_to_handle_at",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init",
    "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "iopl",
    "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "lookup_dcookie", "uselib", "nfsservctl",
)  # fmt: skip
# Allowed only on the calling process itself (argument 0 is the pid, 0 for "self").
_SELF_ONLY_SYSCALLS = (
    "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "prlimit64",
)  # fmt: skip
_CLONE_NEW_FLAGS = (
    0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
    0x40000000,
)  # fmt: skip
"""CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET."""
_F_SETOWN, _F_SETOWN_EX, _AF_UNIX, _PRIO_PROCESS = 8, 15, 1, 0
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_NE, _SCMP_CMP_EQ, _SCMP_CMP_MASKED_EQ = 1, 4, 7
_SCMP_FLTATR_ACT_BADARCH = 2

_PRELUDE_NAME = "_sandbox_prelude.py"
_SOURCE_NAME = "main.py"
_READ_CHUNK = 1 << 16

# Child-side text: the helpers the prelude runs before the program (also run by the probes).
# As root the child unshares directly; otherwise the first unshare also creates a user namespace
# with an identity uid/gid map, which grants the capabilities the later ones need. Every step
# keeps the old state when the kernel refuses, and says so in its return value.
_CHILD = r"""
import ctypes
_NEWNS, _NEWIPC, _NEWPID = 0x00020000, 0x08000000, 0x20000000
_NEWUSER, _NEWNET = 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_HIDE_FLAGS = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
_NR_MOUNT_SETATTR = 442  # the same number on every architecture but alpha
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 1
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2
_libc = ctypes.CDLL(None, use_errno=True)

def _unshare(flags, state):
    if os.getuid() == 0 or state["userns"]:
        return _libc.unshare(flags) == 0
    uid, gid = os.getuid(), os.getgid()  # before: unmapped ids read as the overflow id 65534
    if _libc.unshare(_NEWUSER | flags) != 0:
        return False
    state["userns"] = True
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        try:
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            os.write(fd, text.encode())
            os.close(fd)
        except OSError:
            pass
    return True

def _under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")

def _kept_dirs(cwd=True):
    # What the interpreter reads after start-up: prefixes, the stdlib and lib-dynload (sys.path;
    # a zip entry counts by its directory), the executable's directory, and the sandbox cwd.
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.__file__), os.path.dirname(sys.executable),
             os.path.dirname(os.path.realpath(sys.executable))] + ([os.getcwd()] if cwd else [])
    paths += [p if os.path.isdir(p) else os.path.dirname(p)
              for p in sys.path if p and os.path.exists(p)]
    real = {os.path.realpath(p) for p in paths}
    return sorted(p for p in real if p != "/" and os.path.isdir(p))

def _bind(fd, target):
    return _libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None,
                       _MS_BIND | _MS_REC, None) == 0

def _hide_one(path, keep):
    # An empty read-only tmpfs over `path`, with the kept directories inside it bound back.
    inner = [k for k in keep if _under(k, path)]
    inner = [k for k in inner if not any(o != k and _under(k, o) for o in inner)]
    fds = []
    target = path.encode()
    try:
        for k in inner:  # opened before the tmpfs covers them; bound back from these handles
            fds.append(os.open(k, os.O_PATH | os.O_DIRECTORY))
        if _libc.mount(b"tmpfs", target, b"tmpfs", _HIDE_FLAGS, b"mode=0755,size=64k") != 0:
            return False
        ok = True
        try:
            for k, fd in zip(inner, fds):
                os.makedirs(k, exist_ok=True)
                ok = ok and _bind(fd, k)
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _HIDE_FLAGS
            ok = ok and _libc.mount(None, target, None, flags, None) == 0
        except OSError:
            ok = False
        if not ok:  # uncover the path rather than run without the interpreter's directories
            _libc.umount2(target, _MNT_DETACH)
        return ok
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)

def _read_only():
    # Every mount of this namespace read-only, in one call (mount_setattr, Linux 5.12).
    class Attr(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns_fd")]
    attr = Attr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    return _libc.syscall(ctypes.c_long(_NR_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD), b"/",
                         ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr),
                         ctypes.c_size_t(ctypes.sizeof(attr))) == 0

def _private_tmp(root, size):
    # One tmpfs of `size` bytes holding the sandbox directory `root`, /tmp and /dev/shm: a
    # tmpfs mounted on root, three directories in it, each bound where it belongs.
    mounted, fds = [], {}
    ok = _libc.mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                     f"size={size},nr_inodes=4096,mode=0755".encode()) == 0
    try:
        if ok:
            mounted.append(root)
            for name, mode in (("tmp", 0o1777), ("shm", 0o1777), ("work", 0o700)):
                path = os.path.join(root, name)
                os.mkdir(path)
                os.chmod(path, mode)
                fds[name] = os.open(path, os.O_PATH | os.O_DIRECTORY)
            for name, target in (("tmp", "/tmp"), ("shm", "/dev/shm"), ("work", root)):
                if target == root:  # root may lie under /tmp, which now is the new one
                    os.makedirs(root, exist_ok=True)
                elif not os.path.isdir(target):
                    continue
                ok = _bind(fds[name], target)
                if not ok:
                    break
                mounted.append(target)
    except OSError:
        ok = False
    for fd in fds.values():
        os.close(fd)
    if not ok:
        for target in reversed(mounted):
            _libc.umount2(target.encode(), _MNT_DETACH)
    return ok

def _mount_setup(state, hide, root, size):
    # A private mount namespace in which each directory of `hide` (except kept ones) is covered
    # by an empty read-only tmpfs, and, when `root` is given, the rest is read-only but for a
    # private tmpfs holding root, /tmp and /dev/shm; then /proc is covered.
    # Returns (all hidden, read-only, private tmp).
    if not _unshare(_NEWNS, state):
        return False, False, False
    if _libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False, False, False
    keep = _kept_dirs()
    ok = True
    for path in hide:
        if os.path.isdir(path) and not any(_under(path, k) for k in keep):
            ok = _hide_one(path, keep) and ok
    read_only = root is not None and _read_only()
    tmp = root is not None and _private_tmp(root, size)  # after: it is to stay writable
    # Last: /proc/<pid>/cwd, root and environ of the trainer's processes pass through any mount.
    proc = _libc.mount(b"tmpfs", b"/proc", b"tmpfs", _HIDE_FLAGS | _MS_RDONLY, b"size=4k")
    return proc == 0 and ok, read_only, tmp

def _enter_namespaces(net, hide, root=None, size=0, pid=False):
    # What held: {"net", "mount", "read_only", "tmp", "pid", "ipc"}. hide=None skips the mount
    # namespace; root (the sandbox directory) asks for the read-only view and private tmpfs;
    # pid asks for new PID and IPC namespaces.
    state = {"userns": False}
    got = {"net": net and _unshare(_NEWNET, state)}
    if hide is None:
        got.update(mount=False, read_only=False, tmp=False)
    else:
        got["mount"], got["read_only"], got["tmp"] = _mount_setup(state, hide, root, size)
    got["pid"] = pid and _unshare(_NEWPID, state)
    got["ipc"] = pid and _unshare(_NEWIPC, state)
    return got

def _readable_by_others(paths):
    # Whether a uid that owns none of `paths` can traverse to and list each of them.
    import stat
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(len(parts) + 1):
            mode = os.stat("/" + "/".join(parts[:i])).st_mode
            if not mode & stat.S_IXOTH or (i == len(parts) and not mode & stat.S_IROTH):
                return False
    return True

def _drop_privileges(ids):
    # To uid/gid `ids` (None: keep the uid), then no capabilities left (those of a user
    # namespace included) and no new ones through exec.
    if ids is not None:
        os.setgroups([])
        os.setresgid(ids[1], ids[1], ids[1])
        os.setresuid(ids[0], ids[0], ids[0])
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    _libc.capset(header, (ctypes.c_uint32 * 6)())
    _libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0),
                ctypes.c_ulong(0), ctypes.c_ulong(0))

def _load_filter(program):
    # Install a seccomp filter given as compiled classic BPF (struct sock_filter[], 8 bytes each).
    if not program:
        return False
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    code = ctypes.create_string_buffer(program, len(program))
    prog = Prog(len(program) // 8, ctypes.addressof(code))
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    _libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), one, zero, zero, zero)
    return _libc.prctl(ctypes.c_int(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER),
                       ctypes.byref(prog), zero, zero) == 0

def _pid_namespace_init():
    # Fork the namespace's init (pid 1), which forks the program's process and reaps every
    # orphan; returns in the program's process only. Here the first process waits and ends as
    # the program did (status passed up a pipe), so the trainer sees the program's status.
    import signal
    read_end, write_end = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(read_end)
        _libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL))
        program = os.fork()
        if program == 0:
            os.close(write_end)
            return
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        status = None
        while status is None:
            pid, code = os.wait()
            status = code if pid == program else None
        os.write(write_end, str(status).encode())
        os._exit(0)  # the kernel then kills whatever is left in the namespace
    os.close(write_end)
    report = b""
    while chunk := os.read(read_end, 64):
        report += chunk
    _, init_status = os.waitpid(init, 0)
    status = int(report) if report else init_status
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))
"""

# Runs in the child before the user's program: reads main.py, enters the namespaces, drops root
# and capabilities, loads the seccomp filter, reports what held (JSON on the report descriptor),
# forks into the PID namespace, sets the rlimits, installs the audit guard and executes main.py
# as __main__. Kept as text because it runs in another interpreter.
_PRELUDE = (
    r"""
import json, os, resource, sys
"""
    + _CHILD
    + r"""
def _setup(spec, root):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    got = _enter_namespaces(spec["netns"], spec["hide"] if spec["mountns"] else None,
                            root, spec["tmpfs_bytes"], spec["pidns"])
    os.chdir(root)  # through the new mount tree: the private tmpfs, hidden directories covered
    # Drop root only where the interpreter's directories stay readable (as seen from here).
    drop = spec["drop"] if spec["drop"] and _readable_by_others(_kept_dirs(cwd=False)) else None
    if drop:
        os.chown(root, *drop)
    _drop_privileges(drop)
    got["uid"] = os.getuid() != 0
    seccomp = spec["seccomp_pidns" if got["pid"] else "seccomp"]
    got["seccomp"] = _load_filter(bytes.fromhex(seccomp) if seccomp else b"")
    os.write(spec["report_fd"], json.dumps(got).encode())
    os.close(spec["report_fd"])
    return got

def _guard(root, hide):
    deny = frozenset((
        "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
        "os.kill", "os.killpg", "pty.spawn", "subprocess.Popen", "socket.__new__",
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "ctypes.dlopen",
        "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "ctypes.string_at",
        "ctypes.wstring_at", "ctypes.call_function", "ctypes.seh_exception",
        "resource.setrlimit", "resource.prlimit",
    ))
    deny_imports = frozenset(("ctypes", "_ctypes", "_posixsubprocess"))
    path_events = {
        "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
        "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1, "os.rename": 2, "os.link": 2,
        "os.symlink": 2,
    }
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    prefix = root.rstrip("/") + "/"
    hidden = tuple(h.rstrip("/") + "/" for h in hide)
    kept = tuple(k.rstrip("/") + "/" for k in _kept_dirs())
    own_proc = f"/proc/{os.getpid()}/"
    realpath, fspath, getcwd, join = os.path.realpath, os.fspath, os.getcwd, os.path.join

    def resolve(path):
        path = fspath(path)
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        return realpath(join(getcwd(), path))

    def inside(path):
        if isinstance(path, int):
            return True
        full = resolve(path)
        return full == root or full.startswith(prefix)

    def secret(path):
        # Under a hidden directory and not a kept one, or another process's /proc entry.
        if isinstance(path, int):
            return False
        full = resolve("." if path is None else path) + "/"
        if full.startswith(kept):
            return False
        if full.startswith(hidden):
            return True
        parts = full.split("/")
        return parts[1] == "proc" and parts[2].isdigit() and not full.startswith(own_proc)

    def hook(event, args):
        if event in deny or event.startswith("os.exec") or event.startswith("os.spawn"):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import":
            if args[0] in deny_imports:
                raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
        elif event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & write_flags)
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the sandbox directory")
            if not writing and secret(path):
                raise PermissionError(f"sandbox: reading {path!r} is not allowed")
        elif event in ("os.listdir", "os.scandir"):
            if secret(args[0]):
                raise PermissionError(f"sandbox: listing {args[0]!r} is not allowed")
        elif event in path_events:
            for path in args[: path_events[event]]:
                if path is not None and not inside(path):
                    raise PermissionError(f"sandbox: {event} on {path!r} outside the sandbox")

    sys.addaudithook(hook)

def _main():
    spec = json.loads(sys.argv[1])
    root = os.path.realpath(os.getcwd())
    with open("""
    + repr(_SOURCE_NAME)
    + r""", encoding="utf-8") as f:
        source = f.read()
    got = _setup(spec, root)
    if got["tmp"]:  # the program's own copy, in the private tmpfs now mounted on root
        with open("""
    + repr(_SOURCE_NAME)
    + r""", "w", encoding="utf-8") as f:
            f.write(source)
    if got["pid"]:
        _pid_namespace_init()
    # Forget ctypes, so that the guard's import block applies to the program.
    for name in ("ctypes", "_ctypes"):
        sys.modules.pop(name, None)
        globals().pop(name, None)
    globals().pop("_libc", None)
    for name, soft, hard in spec["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    code = compile(source, """
    + repr(_SOURCE_NAME)
    + r""", "exec")
    if "--no-guard" not in sys.argv:
        _guard(root, spec["hide"])
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})

_main()
"""
)


class ExecResult(NamedTuple):
    """How one sandboxed run ended.

    returncode: the interpreter's exit status; negative -N when killed by signal N.
    stdout, stderr: decoded (UTF-8, invalid bytes replaced), together at most max_output_bytes.
    timed_out: True when the wall-clock or CPU limit ended the run.
    killed_reason: None for a normal exit (whatever its status), else "timeout", "memory",
      "output" (too much printed), or "signal:<NAME>" for another fatal signal.
    duration_s: wall-clock seconds from spawn to the end of cleanup.
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    duration_s: float


def _scmp_errno(code: int) -> int:
    """libseccomp's SCMP_ACT_ERRNO(code)."""
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    """libseccomp's struct scmp_arg_cmp."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _compile_filter(denied: Sequence[str], pid_namespace: bool) -> bytes:
    """The seccomp filter for the program as classic BPF, compiled by the system's libseccomp.

    Everything is allowed but: the `denied` syscalls; clone3 (ENOSYS, so that the C library falls
    back to clone, whose flags a filter can read) and clone with a CLONE_NEW* flag; setpriority
    on anything but the calling process; the `_SELF_ONLY_SYSCALLS` on another pid; fcntl
    F_SETOWN(_EX) (SIGIO to a chosen pid); AF_UNIX sockets (a daemon's socket file is reachable
    from any network namespace); and, without a PID namespace (pid_namespace=False), kill on
    anything but the own process group, tkill and tgkill. Denials answer EPERM, never kill.
    Raises OSError when libseccomp is missing or refuses.
    """
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    eperm = _scmp_errno(errno.EPERM)
    rules: list[tuple[int, str, list[tuple[int, int, int, int]]]] = [
        (eperm, name, []) for name in denied
    ]
    rules.append((_scmp_errno(errno.ENOSYS), "clone3", []))
    rules += [(eperm, "clone", [(0, _SCMP_CMP_MASKED_EQ, f, f)]) for f in _CLONE_NEW_FLAGS]
    rules += [
        (eperm, "setpriority", [(i, _SCMP_CMP_NE, v, 0)]) for i, v in ((0, _PRIO_PROCESS), (1, 0))
    ]
    rules += [(eperm, name, [(0, _SCMP_CMP_NE, 0, 0)]) for name in _SELF_ONLY_SYSCALLS]
    rules += [(eperm, "fcntl", [(1, _SCMP_CMP_EQ, cmd, 0)]) for cmd in (_F_SETOWN, _F_SETOWN_EX)]
    rules.append((eperm, "socket", [(0, _SCMP_CMP_EQ, _AF_UNIX, 0)]))
    if not pid_namespace:
        rules += [
            (eperm, "kill", [(0, _SCMP_CMP_NE, 0, 0)]),
            (eperm, "tkill", []),
            (eperm, "tgkill", []),
        ]
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        if lib.seccomp_attr_set(ctx, _SCMP_FLTATR_ACT_BADARCH, eperm) != 0:
            raise OSError("seccomp_attr_set failed")
        for action, name, conditions in rules:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a syscall on this architecture
                continue
            args = (_ArgCmp * max(1, len(conditions)))(*[_ArgCmp(*c) for c in conditions])
            if lib.seccomp_rule_add_array(ctx, action, number, len(conditions), args) != 0:
                raise OSError(f"seccomp_rule_add_array refused {name}")
        with tempfile.TemporaryFile() as out:
            if lib.seccomp_export_bpf(ctx, out.fileno()) != 0:
                raise OSError("seccomp_export_bpf failed")
            out.seek(0)
            return out.read()
    finally:
        lib.seccomp_release(ctx)


@lru_cache(maxsize=None)
def _seccomp_program(pid_namespace: bool) -> bytes | None:
    """The program's seccomp filter (see `_compile_filter`), or None where libseccomp is
    missing or fails (compiled once per process)."""
    try:
        return _compile_filter(_DENIED_SYSCALLS, pid_namespace)
    except (OSError, AttributeError) as err:
        _log.debug("no seccomp filter: %s", err)
        return None


def _user_process_count(uid: int) -> int:
    """Processes (threads excluded) whose real uid is `uid`, from /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        count += int(line.split()[1]) == uid
                        break
        except OSError:  # the process ended while we looked
            continue
    return count


def _session_members(sid: int) -> list[int]:
    """Pids whose session id is `sid` (field 6 of /proc/<pid>/stat)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # the command name may contain spaces
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def _kill_session(pid: int) -> None:
    """SIGKILL the process group `pid` and any process left in session `pid`."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for member in _session_members(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _rlimits(memory_mb: int, cpu_s: int, nproc: int | None) -> list[tuple[str, int, int]]:
    """(resource name, soft, hard) for the child's prelude to set."""
    memory = memory_mb << 20
    limits = [
        ("RLIMIT_AS", memory, memory),
        ("RLIMIT_CPU", cpu_s, cpu_s + 1),
        ("RLIMIT_FSIZE", FILE_SIZE_BYTES, FILE_SIZE_BYTES),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES, MAX_OPEN_FILES),
    ]
    if nproc is not None:
        limits.append(("RLIMIT_NPROC", nproc, nproc))
    return limits


def _probe(code: str) -> bool:
    """Whether `code`, run after the namespace helpers in a fresh `python -I -S` child, exits 0."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", "import os, sys\n" + _CHILD + code],
            cwd="/",
            env={"PATH": os.defpath},
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@lru_cache(maxsize=None)
def network_namespace_available() -> bool:
    """Whether a child of this process can enter a new network namespace (checked once)."""
    try:
        here = os.readlink("/proc/self/ns/net")
    except OSError:
        return False
    return _probe(
        "_enter_namespaces(True, None)\n"
        f"os._exit(0 if os.readlink('/proc/self/ns/net') != {here!r} else 1)\n"
    )


@lru_cache(maxsize=None)
def mount_namespace_available() -> bool:
    """Whether a child of this process can hide directories and /proc behind a private mount
    namespace, as `run_python` does (checked once, on a temporary directory holding a file)."""
    with tempfile.TemporaryDirectory(prefix="rljax-sandbox-probe-") as hidden:
        open(os.path.join(hidden, "probe"), "w").close()
        return _probe(
            f"ok = _enter_namespaces(False, [{hidden!r}])['mount']\n"
            f"os._exit(0 if ok and os.listdir({hidden!r}) == [] "
            "and not os.path.exists('/proc/self') else 1)\n"
        )


@lru_cache(maxsize=None)
def _protections() -> dict[str, bool]:
    """What held in a run of a trivial program with `run_python`'s defaults (checked once)."""
    spec = _spec(True, True, (), memory_mb=256, cpu_s=11)
    return _run("pass", spec, b"", timeout_s=10.0, max_output_bytes=1000, audit_guard=False)[1]


def pid_namespace_available() -> bool:
    """Whether `run_python` gives the program its own PID namespace here (checked once)."""
    return _protections().get("pid", False)


def seccomp_available() -> bool:
    """Whether `run_python` loads its seccomp filter here: libseccomp is installed and the
    kernel accepts the filter (checked once)."""
    return _protections().get("seccomp", False)


def unprivileged_uid_available() -> bool:
    """Whether the program runs as a non-root uid here: the trainer is not root, or it is and
    the interpreter is readable by `SANDBOX_IDS` inside the sandbox (checked once)."""
    return _protections().get("uid", False)


def private_tmp_available() -> bool:
    """Whether `run_python` gives the program a read-only file system with a private
    size-limited tmpfs for its directory, /tmp and /dev/shm here (checked once)."""
    p = _protections()
    return p.get("read_only", False) and p.get("tmp", False)


_WARNINGS = {
    "net": "the kernel refused a new network namespace: only the audit hook keeps the program "
    "off the network",
    "mount": "the kernel refused a private mount namespace: only the audit hook keeps the "
    "program from reading the trainer's directories and /proc, and the file system stays "
    "writable where permissions allow, without a total size limit",
    "tmp": "the kernel refused a read-only view or the private tmpfs (mount_setattr needs Linux "
    "5.12): the program may write wherever permissions allow, without a total size limit",
    "ipc": "the kernel refused a new IPC namespace: System V IPC objects and POSIX message "
    "queues the program creates are shared with the machine and may outlive it",
    "pid": "the kernel refused a new PID namespace: the program can see other processes "
    "(seccomp still refuses signals outside its process group)",
    "uid": f"the interpreter is not readable by uid {SANDBOX_IDS[0]}, so the sandboxed program "
    "runs as root; install Python where other users can read it or run the trainer as a "
    "non-root user",
    "seccomp": "no seccomp filter (libseccomp.so.2 missing or the kernel refused it): "
    "process-control, mount and device syscalls are not refused",
}
_warned: set[str] = set()


def _warn_missing(report: dict[str, bool], network: bool, mount: bool) -> None:
    """Log once per process each protection the kernel or the system refused."""
    wanted = {"pid", "ipc", "uid", "seccomp"}
    if network:
        wanted.add("net")
    if mount:
        wanted.add("mount" if not report.get("mount") else "tmp")
    for key in sorted(wanted - _warned):
        held = report.get(key) and (key != "tmp" or report.get("read_only"))
        if key in report and not held:
            _warned.add(key)
            _log.warning("sandbox: %s", _WARNINGS[key])


def _paths_to_hide(extra: Sequence[str]) -> list[str]:
    """The directories `run_python` hides by default (the trainer's cwd, its HOME, /root, /home)
    plus `extra`, as real paths, without "/" and without any that lies inside another."""
    for path in extra:
        if not os.path.isdir(path):
            raise ValueError(
                f"hidden_paths entry {path!r} is not an existing directory; only directories "
                "can be hidden (hide the directory that holds the file)"
            )
    defaults = ["/root", "/home"]
    try:
        defaults.append(os.getcwd())
    except OSError:  # the trainer's cwd was deleted: nothing there to protect
        pass
    if os.environ.get("HOME"):
        defaults.append(os.environ["HOME"])
    real = {os.path.realpath(p) for p in [*defaults, *extra] if os.path.isdir(p)}
    real.discard("/")
    return sorted(
        p for p in real if not any(o != p and p.startswith(o.rstrip("/") + "/") for o in real)
    )


def _read_capped(
    proc: subprocess.Popen, deadline: float, cap: int
) -> tuple[bytes, bytes, str | None]:
    """Read both pipes until EOF, the deadline, or `cap` bytes in all; returns the reason the
    group had to be killed ("timeout", "output") or None."""
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    reason = None
    with selectors.DefaultSelector() as selector:
        for fileobj in (proc.stdout, proc.stderr):
            os.set_blocking(fileobj.fileno(), False)
            selector.register(fileobj.fileno(), selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            if proc.poll() is not None:
                # The program exited; children it left holding the pipes must not keep us here.
                _kill_session(proc.pid)
            for key, _ in selector.select(min(left, 0.05)):
                data = os.read(key.fd, _READ_CHUNK)
                if not data:
                    selector.unregister(key.fd)
                    continue
                chunks[key.fd].append(data[: cap - total])
                total += len(data)
                if total > cap:
                    reason = "output"
                    break
            if reason:
                break
    if reason:
        _kill_session(proc.pid)
    return (
        b"".join(chunks[proc.stdout.fileno()]),
        b"".join(chunks[proc.stderr.fileno()]),
        reason,
    )


def _memory_error(stderr: str) -> bool:
    """Whether the traceback's final line is a MemoryError."""
    lines = stderr.strip().splitlines()
    return bool(lines) and lines[-1].startswith("MemoryError")


def run_python(
    source: str,
    *,
    timeout_s: float = 2.0,
    memory_mb: int = 256,
    max_output_bytes: int = 64_000,
    cpu_s: int | None = None,
    stdin: str = "",
    network_namespace: bool = True,
    mount_namespace: bool = True,
    hidden_paths: Sequence[str] = (),
    audit_guard: bool = True,
) -> ExecResult:
    """Run `source` as a Python program in a limited subprocess (see the module docstring).

    Args:
      source: the program; it runs as __main__ from the file main.py in the temporary directory.
      timeout_s: wall-clock limit in seconds; past it the process group is killed.
      memory_mb: address-space limit (RLIMIT_AS) in MiB; the bare interpreter needs about 20.
      max_output_bytes: cap on stdout + stderr; past it the process group is killed.
      cpu_s: CPU-seconds limit (RLIMIT_CPU); None for ceil(timeout_s) + 1.
      stdin: text written to the program's standard input (which is then closed); at most
        `MAX_STDIN_BYTES`, so that writing it cannot block on a program that does not read.
      network_namespace: try to cut the network with a new network namespace. With False (or
        when the kernel refuses) only the audit-hook guard blocks sockets.
      mount_namespace: try to hide the trainer's directories (the cwd at call time, HOME,
        /root, /home, `hidden_paths`) and /proc behind a private mount namespace, in which the
        file system is read-only but for a private tmpfs of `TMPFS_BYTES` holding the sandbox
        directory, /tmp and /dev/shm. With False (or when the kernel refuses) only the
        audit-hook guard refuses reading them, and writes are bounded only per file.
      hidden_paths: further directories the program must not read (e.g. a checkpoint or data
        directory). Directories the interpreter needs and the sandbox directory stay readable.
      audit_guard: install the best-effort audit-hook guard. Turn it off only for trusted code,
        or to test the hard limits alone.

    Returns:
      An `ExecResult`.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0:
        raise ValueError(
            f"timeout_s={timeout_s}, memory_mb={memory_mb} and "
            f"max_output_bytes={max_output_bytes} must all be positive"
        )
    data = stdin.encode("utf-8")
    if len(data) > MAX_STDIN_BYTES:
        raise ValueError(f"stdin has {len(data)} bytes > MAX_STDIN_BYTES={MAX_STDIN_BYTES}")
    cpu = math.ceil(timeout_s) + 1 if cpu_s is None else int(cpu_s)
    spec = _spec(network_namespace, mount_namespace, hidden_paths, memory_mb=memory_mb, cpu_s=cpu)
    result, report = _run(
        source,
        spec,
        data,
        timeout_s=timeout_s,
        max_output_bytes=max_output_bytes,
        audit_guard=audit_guard,
    )
    _warn_missing(report, network_namespace, mount_namespace)
    return result


def _spec(
    network: bool, mount: bool, hidden_paths: Sequence[str], *, memory_mb: int, cpu_s: int
) -> dict:
    """What the child's prelude is to set up (see `_setup` in `_PRELUDE`)."""
    root = os.getuid() == 0
    # The kernel counts RLIMIT_NPROC over all processes of the uid: those it has now, the
    # prelude's two (the first process and the PID namespace's init), and the margin.
    nproc = _user_process_count(SANDBOX_IDS[0] if root else os.getuid()) + 2 + NPROC_MARGIN
    seccomp = {pidns: _seccomp_program(pidns) for pidns in (False, True)}
    return {
        "netns": network,
        "mountns": mount,
        "pidns": True,
        "hide": _paths_to_hide(hidden_paths),
        "rlimits": _rlimits(memory_mb, cpu_s, nproc),
        "drop": list(SANDBOX_IDS) if root else None,
        "tmpfs_bytes": TMPFS_BYTES,
        "seccomp": seccomp[False] and seccomp[False].hex(),
        "seccomp_pidns": seccomp[True] and seccomp[True].hex(),
    }


def _run(
    source: str,
    spec: dict,
    data: bytes,
    *,
    timeout_s: float,
    max_output_bytes: int,
    audit_guard: bool,
) -> tuple[ExecResult, dict[str, bool]]:
    """Spawn the prelude with `spec` on `source`; the result and the prelude's report of what
    held ({} when it ended before reporting)."""
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="rljax-sandbox-")
    try:
        with open(os.path.join(workdir, _PRELUDE_NAME), "w", encoding="utf-8") as f:
            f.write(_PRELUDE)
        with open(os.path.join(workdir, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(source)
        report_read, report_write = os.pipe()
        spec = dict(spec, report_fd=report_write)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _PRELUDE_NAME, json.dumps(spec)]
                + ([] if audit_guard else ["--no-guard"]),
                cwd=workdir,
                env={"PATH": os.defpath, "LC_ALL": "C.UTF-8", "HOME": workdir},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=(report_write,),
            )
        finally:
            os.close(report_write)
        try:
            try:
                proc.stdin.write(data)
            except BrokenPipeError:  # the program ended (or closed stdin) before reading it
                pass
            proc.stdin.close()
            out, err, reason = _read_capped(proc, start + timeout_s, max_output_bytes)
            if reason is None:  # the pipes closed; the program may still be running
                try:
                    proc.wait(timeout=max(0.0, start + timeout_s - time.monotonic()))
                except subprocess.TimeoutExpired:
                    reason = "timeout"
            _kill_session(proc.pid)
            returncode = proc.wait()
        finally:
            _kill_session(proc.pid)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            report = _read_report(report_read)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    if reason is None and returncode == -signal.SIGXCPU:
        reason = "timeout"
    elif reason is None and returncode < 0:
        try:
            reason = f"signal:{signal.Signals(-returncode).name}"
        except ValueError:
            reason = f"signal:{-returncode}"
    elif reason is None and returncode != 0 and _memory_error(stderr):
        reason = "memory"
    result = ExecResult(
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=reason == "timeout",
        killed_reason=reason,
        duration_s=time.monotonic() - start,
    )
    return result, report


def _read_report(fd: int) -> dict[str, bool]:
    """The prelude's JSON report from the pipe `fd` (closed here); {} if it wrote none."""
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, _READ_CHUNK)
        return json.loads(data) if data else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)

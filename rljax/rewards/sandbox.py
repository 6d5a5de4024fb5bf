"""Run untrusted, model-written Python in a limited subprocess, for code-execution rewards.

Why: a code reward executes whatever the policy wrote, and during RL the policy writes infinite
loops, fork bombs, 10 GB allocations and megabytes of prints. None of these may stall or kill the
trainer, so each program runs in its own interpreter with limits, and every way it can end (exit,
timeout, memory, output flood, signal) comes back as an `ExecResult`.

What `run_python` does, split by how much it can be trusted:

Hard (enforced by the kernel, user code cannot lift them):
  - a fresh interpreter, `python -I -S` (no site-packages, no PYTHON* variables, no user site), in
    a fresh temporary directory that is its cwd and HOME and is deleted afterwards, with a minimal
    environment (PATH, LC_ALL, HOME);
  - rlimits set by the child itself before the program is read: RLIMIT_AS (memory_mb),
    RLIMIT_CPU (cpu_s), RLIMIT_FSIZE (files written are capped at `FILE_SIZE_BYTES`; larger
    writes fail with EFBIG), RLIMIT_CORE = 0,
    RLIMIT_NOFILE = `MAX_OPEN_FILES`, and RLIMIT_NPROC = (processes this user has now) +
    `NPROC_MARGIN` — the kernel counts NPROC over all processes of the user, hence the count.
    The kernel exempts root from RLIMIT_NPROC, so when the trainer runs as root fork bombs are
    stopped only by the audit hook below and cleaned up by the group kill;
  - a new session and process group (`start_new_session=True`); on timeout, output flood, or
    plain exit the whole group gets SIGKILL, and afterwards every process left in the session is
    killed too (found through /proc), so nothing the program forked outlives the call;
  - output read incrementally from the pipes with a cap: past `max_output_bytes` (stdout and
    stderr together) the group is killed, so a huge print costs at most the cap in memory;
  - no network, when the kernel allows it: the child first calls unshare(CLONE_NEWNET) (as
    root) or unshare(CLONE_NEWUSER | CLONE_NEWNET) with an identity uid/gid map (unprivileged
    user namespaces), so it sees only a loopback interface that is down. If unshare fails,
    the run goes on without it; `network_namespace_available()` says which case holds;
  - the trainer's files unreadable, when the kernel allows it: the child then enters a private
    mount namespace (unshare(CLONE_NEWNS), inside the user namespace when not root), makes the
    mount tree private, and covers with an empty read-only tmpfs each directory to hide: the
    trainer's cwd at call time (repository or run directory), its HOME, /root, /home and the
    caller's `hidden_paths`. The directories the interpreter reads (sys.prefix and friends, the
    sys.path entries with the stdlib and lib-dynload, the executable's directory) and the
    sandbox directory are never hidden: a hidden directory that contains one gets it bound
    back (a venv under the repository, a pyenv under /root); a path to hide inside one is left
    visible. Finally /proc is covered too (the program then has no /proc of its own either),
    because /proc/<pid>/cwd, /root and /environ of the trainer's processes reach their files
    and API keys past any mount. If a step fails, the run goes on without it (a hidden
    directory whose kept ones cannot be bound back is left visible);
    `mount_namespace_available()` says whether it all works here.

Best-effort (in-process, Python level; code that reaches raw syscalls, e.g. through a C
extension, gets past them):
  - a `sys.addaudithook` guard installed before the user code runs. It raises PermissionError on:
    creating, connecting or binding sockets; os.system / exec* / spawn* / fork / forkpty /
    posix_spawn / subprocess.Popen / os.kill; resource.setrlimit / prlimit (as root the program
    could otherwise raise its own limits again); ctypes (import of ctypes/_ctypes, dlopen, dlsym,
    raw memory) and import of _posixsubprocess (the unaudited fork-exec); opening a file for
    writing, and removing, renaming, creating or chmod-ing paths, outside the temporary
    directory (paths resolved with realpath, so ../ and symlinks do not escape it); opening for
    reading, listing (os.listdir, os.scandir, hence pathlib, glob and os.walk) of paths under
    the hidden directories, except under the kept interpreter directories, and of /proc/<pid>
    of any process but its own (realpath turns /proc/<pid>/cwd/x into the trainer's path). So
    without the mount namespace, plain Python reads of the trainer's files are still refused.
    Metadata calls that have no audit event (os.stat, os.readlink) are not refused.

Not done: no PID namespace, no seccomp, no cgroups, no dropping root (the interpreter may live
where an unprivileged uid cannot read it). Only the listed directories are hidden: the rest of
the file system (/etc, /tmp, /work, ...) stays readable, so put secrets and data in hidden
directories or pass them in `hidden_paths`. Run the trainer as a non-root user, or in a
container, for the NPROC limit and file permissions to be hard as well.

Namespaces and limits are applied by the child's prelude, not by a `preexec_fn`: the trainer
is multithreaded (JAX, reward pools), and CPython documents `preexec_fn` as unsafe (it can
deadlock the child) when the parent has threads. The child is a fresh single-threaded
interpreter, where unshare and setrlimit are safe, and it applies them before it reads the
program. Parent-side, only `start_new_session` is used, which runs in C.
"""

from __future__ import annotations

import json
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

_PRELUDE_NAME = "_sandbox_prelude.py"
_SOURCE_NAME = "main.py"
_READ_CHUNK = 1 << 16

# Namespaces, entered by the child before anything else (child-side text, also run by the
# probes). As root the child unshares directly; otherwise the first unshare also creates a user
# namespace with an identity uid/gid map, which grants the capabilities the later ones need.
# Every step keeps the old state silently when the kernel refuses.
_NAMESPACES = r"""
_NEWNS, _NEWUSER, _NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_HIDE_FLAGS = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC

def _unshare(libc, flags, state):
    if os.getuid() == 0 or state["userns"]:
        return libc.unshare(flags) == 0
    if libc.unshare(_NEWUSER | flags) != 0:
        return False
    state["userns"] = True
    uid, gid = os.getuid(), os.getgid()
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

def _kept_dirs():
    # What the interpreter reads after start-up: prefixes, the stdlib and lib-dynload (sys.path;
    # a zip entry counts by its directory), the executable's directory, and the sandbox cwd.
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.getcwd(),
             os.path.dirname(os.__file__), os.path.dirname(sys.executable),
             os.path.dirname(os.path.realpath(sys.executable))]
    paths += [p if os.path.isdir(p) else os.path.dirname(p)
              for p in sys.path if p and os.path.exists(p)]
    real = {os.path.realpath(p) for p in paths}
    return sorted(p for p in real if p != "/" and os.path.isdir(p))

def _hide_one(libc, path, keep):
    # An empty read-only tmpfs over `path`, with the kept directories inside it bound back.
    inner = [k for k in keep if _under(k, path)]
    inner = [k for k in inner if not any(o != k and _under(k, o) for o in inner)]
    fds = []
    target = path.encode()
    try:
        for k in inner:  # opened before the tmpfs covers them; bound back from these handles
            fds.append(os.open(k, os.O_PATH | os.O_DIRECTORY))
        if libc.mount(b"tmpfs", target, b"tmpfs", _HIDE_FLAGS, b"mode=0755,size=64k") != 0:
            return False
        ok = True
        try:
            for k, fd in zip(inner, fds):
                os.makedirs(k, exist_ok=True)
                source = f"/proc/self/fd/{fd}".encode()
                ok = ok and libc.mount(source, k.encode(), None, _MS_BIND | _MS_REC, None) == 0
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _HIDE_FLAGS
            ok = ok and libc.mount(None, target, None, flags, None) == 0
        except OSError:
            ok = False
        if not ok:  # uncover the path rather than run without the interpreter's directories
            libc.umount2(target, _MNT_DETACH)
        return ok
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)

def _hide(libc, state, hide):
    # A private mount namespace in which each directory of `hide` (except kept ones), then
    # /proc, is covered by an empty read-only tmpfs. True when all of it was done.
    if not _unshare(libc, _NEWNS, state):
        return False
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    keep = _kept_dirs()
    ok = True
    for path in hide:
        if os.path.isdir(path) and not any(_under(path, k) for k in keep):
            ok = _hide_one(libc, path, keep) and ok
    # Last: /proc/<pid>/cwd, root and environ of the trainer's processes pass through any mount.
    proc = libc.mount(b"tmpfs", b"/proc", b"tmpfs", _HIDE_FLAGS | _MS_RDONLY, b"size=4k")
    return proc == 0 and ok

def _enter_namespaces(net, hide):
    # Returns (network namespace entered, all paths hidden); hide=None skips the mount namespace.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    state = {"userns": False}
    net_ok = net and _unshare(libc, _NEWNET, state)
    mount_ok = hide is not None and _hide(libc, state, hide)
    # Forget ctypes, so that the guard's import block applies to the program.
    sys.modules.pop("ctypes", None)
    sys.modules.pop("_ctypes", None)
    return net_ok, mount_ok
"""

# Runs in the child before the user's program: enters the namespaces, sets the rlimits (argv[1],
# JSON), reads main.py, installs the audit guard, and executes main.py as __main__.
# Kept as text because it runs in another interpreter.
_PRELUDE = (
    r"""
import json, os, resource, sys
"""
    + _NAMESPACES
    + r"""
def _limits(spec):
    _enter_namespaces(spec["netns"], spec["hide"] if spec["mountns"] else None)
    for name, soft, hard in spec["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))

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
    _limits(spec)
    os.chdir(root)  # through the new mount tree, where the hidden directories are covered
    with open("""
    + repr(_SOURCE_NAME)
    + r""", encoding="utf-8") as f:
        code = compile(f.read(), """
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
            [sys.executable, "-I", "-S", "-c", "import os, sys\n" + _NAMESPACES + code],
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
            f"ok = _enter_namespaces(False, [{hidden!r}])[1]\n"
            f"os._exit(0 if ok and os.listdir({hidden!r}) == [] "
            "and not os.path.exists('/proc/self') else 1)\n"
        )


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
        /root, /home, `hidden_paths`) and /proc behind a private mount namespace. With False
        (or when the kernel refuses) only the audit-hook guard refuses reading them.
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
    uid = os.getuid()
    nproc = None if uid == 0 else _user_process_count(uid) + NPROC_MARGIN
    spec = json.dumps(
        {
            "netns": network_namespace,
            "mountns": mount_namespace,
            "hide": _paths_to_hide(hidden_paths),
            "rlimits": _rlimits(memory_mb, cpu, nproc),
        }
    )
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="rljax-sandbox-")
    try:
        with open(os.path.join(workdir, _PRELUDE_NAME), "w", encoding="utf-8") as f:
            f.write(_PRELUDE)
        with open(os.path.join(workdir, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(source)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _PRELUDE_NAME, spec]
            + ([] if audit_guard else ["--no-guard"]),
            cwd=workdir,
            env={"PATH": os.defpath, "LC_ALL": "C.UTF-8", "HOME": workdir},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
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
    return ExecResult(
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=reason == "timeout",
        killed_reason=reason,
        duration_s=time.monotonic() - start,
    )

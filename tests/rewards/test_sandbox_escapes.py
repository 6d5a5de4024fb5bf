"""run_python: escapes a hostile program tried past the audit hook (issue 22), each observed from
outside the sandbox: the trainer and a bystander process survive and keep their priority and
affinity, no file appears in the real /tmp, /dev/shm or /var/tmp, and what the program can
write in all is capped."""

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from rljax.rewards import sandbox
from rljax.rewards.sandbox import (
    TMPFS_BYTES,
    mount_namespace_available,
    pid_namespace_available,
    private_tmp_available,
    run_python,
    seccomp_available,
    unprivileged_uid_available,
)

needs_pidns = pytest.mark.skipif(
    not pid_namespace_available(), reason="this kernel refuses new PID namespaces"
)
needs_seccomp = pytest.mark.skipif(
    not seccomp_available(), reason="no libseccomp or no seccomp filters on this kernel"
)
needs_tmp = pytest.mark.skipif(
    not private_tmp_available(), reason="this kernel refuses a private read-only mount tree"
)

# A stand-in trainer: a separate process that calls run_python (loaded from the module's file,
# not through the package, so it starts in a few ms) and then reports whether it is alive, its
# own nice value and CPU affinity. TRAINER_PID in the source becomes its pid.
_TRAINER = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("sandbox_under_test", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
source = sys.argv[2].replace("TRAINER_PID", str(os.getpid()))
res = sandbox.run_python(source, timeout_s=10.0, audit_guard=sys.argv[3] == "guard")
print(json.dumps({"stdout": res.stdout, "stderr": res.stderr,
                  "nice": os.getpriority(os.PRIO_PROCESS, 0),
                  "affinity": sorted(os.sched_getaffinity(0))}))
"""


def _run_in_trainer(source: str, guard: bool) -> tuple[int, dict | None]:
    """Run `source` through run_python in a stand-in trainer process: (its exit status, report)."""
    done = subprocess.run(
        [sys.executable, "-c", _TRAINER, sandbox.__file__, source, "guard" if guard else "none"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, report


@pytest.fixture
def bystander():
    """A process unrelated to the trainer (as the machine's other processes are)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


# Tries every route to signal a process by pid; prints {target: {route: outcome}}.
_SIGNALS = """
import json, os, signal
def attempt(call):
    try:
        call()
        return "done"
    except Exception as err:
        return "ERR " + type(err).__name__
def pidfd_kill(pid):
    fd = os.pidfd_open(pid)
    signal.pidfd_send_signal(fd, signal.SIGKILL)
got = {}
for name, pid in (("bystander", BYSTANDER), ("trainer", TRAINER_PID)):
    got[name] = {"pidfd": attempt(lambda: pidfd_kill(pid)),
                 "kill": attempt(lambda: os.kill(pid, signal.SIGKILL))}
print(json.dumps(got))
"""


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_program_cannot_kill_the_trainer_or_another_process(bystander, guard):
    status, report = _run_in_trainer(_SIGNALS.replace("BYSTANDER", str(bystander.pid)), guard)
    assert status == 0, f"the trainer died with status {status}"
    assert bystander.poll() is None, "the bystander process was killed"
    assert report["stdout"], report["stderr"]
    for routes in json.loads(report["stdout"]).values():
        assert all(outcome.startswith("ERR") for outcome in routes.values()), routes


_PRIORITY = """
import json, os
def attempt(call):
    try:
        call()
        return "done"
    except Exception as err:
        return "ERR " + type(err).__name__
got = {}
for name, pid in (("bystander", BYSTANDER), ("trainer", TRAINER_PID)):
    got[name] = [attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
                 attempt(lambda: os.sched_setaffinity(pid, {0}))]
got["user"] = attempt(lambda: os.setpriority(os.PRIO_USER, NOBODY_UID, 19))
print(json.dumps(got))
"""


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_program_cannot_renice_or_pin_the_trainer_or_another_process(bystander, guard):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: pinning to CPU 0 would change nothing observable")
    # A process of the uid the sandbox runs as (when the trainer is root): PRIO_USER reaches it.
    same_user = subprocess.Popen(["sleep", "120"], user=65534) if os.getuid() == 0 else None
    try:
        source = _PRIORITY.replace("BYSTANDER", str(bystander.pid))
        status, report = _run_in_trainer(source.replace("NOBODY_UID", "65534"), guard)
        assert status == 0 and report["stdout"], report
        assert (report["nice"], report["affinity"]) == (0, cpus), "the trainer was changed"
        assert os.getpriority(os.PRIO_PROCESS, bystander.pid) == 0
        assert sorted(os.sched_getaffinity(bystander.pid)) == cpus
        if same_user is not None:
            assert os.getpriority(os.PRIO_PROCESS, same_user.pid) == 0
    finally:
        if same_user is not None:
            same_user.kill()
            same_user.wait()


# Creates files outside its directory by routes open() does not see (sqlite's C code, mkfifo,
# mknod), and checks that the same routes work in its own directory.
_FILES = """
import json, os, sqlite3, stat
def attempt(call):
    try:
        call()
        return "done"
    except Exception as err:
        return "ERR " + type(err).__name__
def sqlite_routes(prefix):
    db = sqlite3.connect(prefix + "-connect.db")
    db.execute("create table t (x)")
    db.execute("insert into t values (1)")
    db.commit()
    db.execute(f"vacuum into '{prefix}-vacuum.db'")
    db.execute(f"attach '{prefix}-attach.db' as other")
    db.execute("create table other.t (x)")
    db.close()
got = {"local": attempt(lambda: sqlite_routes("local"))}
for d in ("/tmp", "/dev/shm", "/var/tmp"):
    prefix = os.path.join(d, "TOKEN")
    got[d] = [attempt(lambda: sqlite_routes(prefix)),
              attempt(lambda: os.mkfifo(prefix + "-fifo")),
              attempt(lambda: os.mknod(prefix + "-node", stat.S_IFREG | 0o600))]
print(json.dumps(got))
"""


def _leftovers(token: str) -> list[str]:
    found = []
    for d in ("/tmp", "/dev/shm", "/var/tmp"):
        found += [os.path.join(d, n) for n in os.listdir(d) if n.startswith(token)]
    return found


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_no_file_appears_outside_the_sandbox(guard):
    token = "rljax-escape-" + secrets.token_hex(8)
    try:
        res = run_python(_FILES.replace("TOKEN", token), timeout_s=10.0, audit_guard=guard)
        assert _leftovers(token) == []
        got = json.loads(res.stdout)
        assert got["local"] == "done", "sqlite in the program's own directory must work"
    finally:
        for path in _leftovers(token):
            os.remove(path)


def test_total_bytes_written_are_capped():
    # 1 MiB files (the per-file limit) round-robin to cwd, /tmp and /dev/shm, up to 160 MiB.
    token = "rljax-fill-" + secrets.token_hex(8)
    src = (
        "import os\nn = 0\nerr = None\n"
        "try:\n"
        "    for i in range(160):\n"
        "        d = ('.', '/tmp', '/dev/shm')[i % 3]\n"
        f"        with open(os.path.join(d, '{token}-%d' % i), 'wb') as f:\n"
        "            f.write(b'x' * (1 << 20))\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    err = e.errno\n"
        "print(n, err)\n"
    )
    try:
        start = time.monotonic()
        res = run_python(src, timeout_s=20.0, audit_guard=False)
        written, err = res.stdout.split()
        assert int(written) << 20 <= TMPFS_BYTES and err == "28", res  # ENOSPC
        assert _leftovers(token) == []
        assert time.monotonic() - start < 20
    finally:
        for path in _leftovers(token):
            os.remove(path)


@needs_pidns
def test_program_sees_no_other_process(bystander):
    src = (
        "import json, os\nvisible = []\n"
        f"for pid in [{bystander.pid}, {os.getpid()}, *range(1, 300)]:\n"
        "    try:\n        os.kill(pid, 0)\n        visible.append(pid)\n"
        "    except ProcessLookupError:\n        pass\n"
        "    except PermissionError:\n        visible.append(pid)\n"
        "print(json.dumps([os.getpid(), os.getppid(), sorted(set(visible))]))\n"
    )
    res = run_python(src, timeout_s=10.0, audit_guard=False)
    own, parent, visible = json.loads(res.stdout)
    # Its own pid and the sandbox's init process (pid 1, its parent) and nothing else.
    assert parent == 1 and set(visible) == {1, own}, (own, parent, visible)
    listing = run_python(
        "import os\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()))",
        audit_guard=False,
    )
    assert listing.stdout.strip() == "[]"


@needs_seccomp
def test_seccomp_refuses_process_control_inside_the_sandbox():
    # Calls the kernel would allow between processes of one uid; the filter answers EPERM.
    src = (
        "import ctypes, errno, json, os, stat\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def attempt(call):\n"
        "    try:\n        call()\n        return 'done'\n"
        "    except OSError as err:\n        return errno.errorcode[err.errno]\n"
        "def c(ret):\n"
        "    if ret != 0:\n        raise OSError(ctypes.get_errno(), 'failed')\n"
        "print(json.dumps({\n"
        "    'pidfd_open': attempt(lambda: os.pidfd_open(os.getppid())),\n"
        "    'setpriority': attempt(lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)),\n"
        "    'affinity': attempt(lambda: os.sched_setaffinity(os.getppid(), {0})),\n"
        "    'mkfifo': attempt(lambda: os.mkfifo('fifo')),\n"
        "    'mknod': attempt(lambda: os.mknod('node', stat.S_IFREG | 0o600)),\n"
        "    'unshare': attempt(lambda: c(libc.unshare(0x10000000))),\n"
        "    'umount': attempt(lambda: c(libc.umount2(b'/proc', 2))),\n"
        "    'ptrace': attempt(lambda: c(libc.ptrace(16, os.getppid(), 0, 0))),\n"
        "    'own_nice': attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, 5)),\n"
        "}))\n"
    )
    res = run_python(src, timeout_s=10.0, audit_guard=False)
    got = json.loads(res.stdout)
    assert got.pop("own_nice") == "done", "a program may still lower its own priority"
    assert got == {k: "EPERM" for k in got}, got


@pytest.mark.skipif(os.getuid() != 0, reason="the uid is dropped only when the trainer is root")
def test_root_trainer_runs_the_program_as_nobody(tmp_path):
    if not unprivileged_uid_available():
        pytest.skip("the interpreter is not readable by an unprivileged uid here")
    secret = f"/var/tmp/rljax-root-only-{secrets.token_hex(8)}"
    with open(secret, "w") as f:
        f.write("root only")
    os.chmod(secret, 0o600)
    try:
        src = (
            "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
            f"try:\n    print(open({secret!r}).read())\n"
            "except PermissionError:\n    print('refused')\n"
        )
        res = run_python(src, timeout_s=10.0, audit_guard=False)
        assert res.stdout == "65534 65534 []\nrefused\n", res
    finally:
        os.remove(secret)


@needs_tmp
def test_the_rest_of_the_file_system_is_read_only():
    # /var/tmp is writable by every uid on the host (mode 1777) and not replaced inside: only a
    # read-only mount refuses the write there.
    probe = f"/var/tmp/rljax-ro-{secrets.token_hex(8)}"
    src = (
        "import errno\n"
        f"try:\n    open({probe!r}, 'w')\n    print('written')\n"
        "except OSError as err:\n    print(errno.errorcode[err.errno])\n"
    )
    try:
        res = run_python(src, timeout_s=10.0, audit_guard=False)
        assert not os.path.exists(probe)
        assert res.stdout == "EROFS\n", res
    finally:
        if os.path.exists(probe):
            os.remove(probe)


# A stand-in trainer in which the kernel refuses a feature: it first loads a seccomp filter
# (made and loaded with the module's own helpers) that answers EPERM to the syscalls named in
# argv[2]. It then runs two programs and reports their output and the warnings logged.
_REFUSED = """
import importlib.util, json, logging, os, sys
spec = importlib.util.spec_from_file_location("sandbox_under_test", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("sandbox_under_test").addHandler(handler)
child = {}
exec("import os, sys\\n" + sandbox._CHILD, child)
child["_load_filter"](sandbox._compile_filter(sys.argv[2].split(","), pid_namespace=True))
runs = [sandbox.run_python("print(6 * 7)", timeout_s=10.0).stdout for _ in range(2)]
print(json.dumps({"runs": runs, "warnings": [r.getMessage() for r in records
                                              if r.levelno == logging.WARNING]}))
"""


@needs_seccomp
@pytest.mark.parametrize(
    "refused, missing",
    [
        ("unshare", ["network namespace", "mount namespace", "PID namespace"]),
        ("mount_setattr", ["read-only view"]),
    ],
    ids=["namespaces", "read-only"],
)
def test_where_the_kernel_refuses_the_sandbox_runs_and_warns_once(refused, missing):
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED, sandbox.__file__, refused],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["runs"] == ["42\n", "42\n"]
    warnings = got["warnings"]
    for feature in missing:
        assert sum(feature in w for w in warnings) == 1, warnings


def test_missing_seccomp_warns_once_and_runs(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_seccomp_program", lambda pid_namespace: None)
    monkeypatch.setattr(sandbox, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
        runs = [run_python("print(6 * 7)", timeout_s=10.0).stdout for _ in range(2)]
    assert runs == ["42\n", "42\n"]
    assert sum("seccomp" in r.getMessage() for r in caplog.records) == 1, caplog.records


def test_probes_agree_on_this_machine():
    # Where the mount namespace works (CI's and the developers' machines), so do the others.
    if not mount_namespace_available():
        pytest.skip("this kernel refuses private mount namespaces")
    assert pid_namespace_available() and private_tmp_available()


def _python_runnable_by(uid: int) -> str | None:
    """An interpreter that `uid` can run (this one, or the system's), or None."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue
        try:
            done = subprocess.run(
                [candidate, "-I", "-S", "-c", "import ctypes, json"],
                user=uid,
                group=uid,
                extra_groups=[],
                capture_output=True,
                timeout=30,
                check=False,
            )
        except OSError:  # not executable by uid
            continue
        if done.returncode == 0:
            return candidate
    return None


_NON_ROOT = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("sandbox_under_test", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
src = (
    "import json, os\\n"
    "def attempt(call):\\n"
    "    try:\\n        call()\\n        return 'done'\\n"
    "    except OSError as err:\\n        return type(err).__name__\\n"
    f"print(json.dumps([os.getuid(), os.getpid(), attempt(lambda: os.kill({os.getpid()}, 9)),"
    " os.listdir('/tmp'), attempt(lambda: open('/var/tmp/x', 'w'))]))\\n"
)
print(sandbox.run_python(src, timeout_s=10.0, audit_guard=False).stdout)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a trainer as another user")
def test_non_root_trainer_keeps_its_uid_and_every_protection():
    # A trainer running as an ordinary user (uid 4242): the sandbox enters a user namespace
    # with the trainer's uid mapped (it was the overflow uid 65534 before, which broke tmpfs).
    uid = 4242
    python = _python_runnable_by(uid)
    if python is None:
        pytest.skip(f"no Python interpreter here that uid {uid} can run")
    shared = tempfile.mkdtemp(prefix="rljax-sandbox-test-")
    try:
        os.chmod(shared, 0o755)
        module = os.path.join(shared, "sandbox.py")
        with open(sandbox.__file__) as src, open(module, "w") as dst:
            dst.write(src.read())
        done = subprocess.run(
            [python, "-c", _NON_ROOT, module],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd=shared,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(shared)
    assert done.returncode == 0, done.stderr
    own_uid, pid, kill, tmp, write = json.loads(done.stdout)
    assert (own_uid, pid, kill, write) == (uid, 2, "ProcessLookupError", "OSError"), done.stdout
    assert len(tmp) == 1 and tmp[0].startswith("rljax-sandbox-"), tmp  # only its own directory


def _shm_ids() -> set[int]:
    """System V shared memory segments of the machine's IPC namespace, as the kernel lists them."""
    with open("/proc/sysvipc/shm") as f:
        return {int(line.split()[1]) for line in f.readlines()[1:]}


@needs_pidns
def test_shared_memory_segments_do_not_outlive_the_program():
    # System V segments persist until removed; the program's must die with its IPC namespace.
    src = (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "print(libc.shmget(0, 1 << 20, 0o1000 | 0o600))\n"  # IPC_PRIVATE, IPC_CREAT
    )
    before = _shm_ids()
    res = run_python(src, timeout_s=10.0, audit_guard=False)
    leaked = _shm_ids() - before
    try:
        assert int(res.stdout) >= 0, res  # the segment was created inside
        assert leaked == set()
    finally:
        for shmid in leaked:
            subprocess.run(["ipcrm", "-m", str(shmid)], check=False)

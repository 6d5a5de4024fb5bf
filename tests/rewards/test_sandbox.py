"""run_python: results and limits of sandboxed runs, checked from inside and outside the child."""

import json
import math
import os
import resource
import secrets
import socket
import statistics
import tempfile
import time

import pytest

from rljax.rewards.sandbox import (
    FILE_SIZE_BYTES,
    MAX_OPEN_FILES,
    mount_namespace_available,
    network_namespace_available,
    private_tmp_available,
    run_python,
)


def _sandbox_processes(marker: str) -> list[int]:
    """Pids of live processes started by run_python (their command line names the prelude) with
    `marker` among its hidden paths (so that runs of other tests in parallel do not count)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"_sandbox_prelude.py" in cmdline and marker.encode() in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def test_normal_run_captures_output_and_stdin():
    res = run_python(
        "import sys\nprint('out', sys.stdin.read())\nprint('err', file=sys.stderr)\nsys.exit(3)",
        timeout_s=5.0,
        stdin="hello",
    )
    assert (res.returncode, res.stdout, res.stderr) == (3, "out hello\n", "err\n")
    assert res.killed_reason is None and not res.timed_out


def test_child_sees_limits_fresh_cwd_and_minimal_env():
    probe = (
        "import json, os, resource as r\n"
        "lim = {n: r.getrlimit(getattr(r, n)) for n in "
        "('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_CORE', 'RLIMIT_NOFILE')}\n"
        "print(json.dumps({'lim': lim, 'cwd': os.getcwd(), 'env': sorted(os.environ),"
        " 'files': sorted(os.listdir('.'))}))"
    )
    res = run_python(probe, timeout_s=5.0, memory_mb=300, cpu_s=3)
    got = json.loads(res.stdout)
    assert got["lim"] == {
        "RLIMIT_AS": [300 << 20, 300 << 20],
        "RLIMIT_CPU": [3, 4],
        "RLIMIT_FSIZE": [FILE_SIZE_BYTES, FILE_SIZE_BYTES],
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_NOFILE": [MAX_OPEN_FILES, MAX_OPEN_FILES],
    }
    assert set(got["env"]) <= {"PATH", "LC_ALL", "HOME"}
    # In the private tmpfs the program gets its own copy of main.py, and nothing else.
    files = ["main.py"] if private_tmp_available() else ["_sandbox_prelude.py", "main.py"]
    assert got["files"] == files
    assert os.path.basename(got["cwd"]).startswith("rljax-sandbox-")
    assert not os.path.exists(got["cwd"]), "the temporary directory must be deleted afterwards"


def test_nproc_limit_set_for_non_root():
    if os.getuid() == 0:
        pytest.skip("running as root, which the kernel exempts from RLIMIT_NPROC (not set then)")
    res = run_python(
        "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])", timeout_s=5.0
    )
    assert 0 < int(res.stdout) < resource.getrlimit(resource.RLIMIT_NPROC)[0]


def test_infinite_loop_times_out_quickly():
    res = run_python("while True:\n    pass", timeout_s=0.5)
    assert res.killed_reason == "timeout" and res.timed_out
    assert res.duration_s < 10  # loose bounds throughout: CI machines are shared and slow


def test_closing_the_pipes_does_not_escape_the_timeout():
    res = run_python("import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass", timeout_s=0.5)
    assert res.killed_reason == "timeout" and res.duration_s < 10


def test_fork_bomb_is_stopped_and_leaves_no_process(tmp_path):
    src = "import os\nwhile True:\n    os.fork()"
    res = run_python(src, timeout_s=5.0, hidden_paths=[str(tmp_path)])
    assert res.returncode != 0
    assert "os.fork is not allowed" in res.stderr
    assert _sandbox_processes(str(tmp_path)) == []


def test_hard_cleanup_kills_forked_children_without_the_guard(tmp_path):
    # Bounded forks (not a bomb): children sleep, one leaves the process group, the parent exits.
    src = (
        "import os, time\n"
        "for i in range(3):\n"
        "    if os.fork() == 0:\n"
        "        if i == 0:\n"
        "            os.setpgid(0, 0)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "print('parent done')\n"
    )
    res = run_python(src, timeout_s=2.0, audit_guard=False, hidden_paths=[str(tmp_path)])
    assert res.stdout == "parent done\n"
    assert res.duration_s < 20, "children (sleeping 60 s) holding the pipes held up the call"
    assert _sandbox_processes(str(tmp_path)) == []


def test_timeout_kills_everything_in_the_pid_namespace(tmp_path):
    # A child that leaves the session and ignores SIGTERM: the timeout still ends it (the PID
    # namespace dies with its init; before, such a child outlived the call).
    src = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    while True: time.sleep(0.05)\n"
        "while True: time.sleep(0.05)\n"
    )
    res = run_python(src, timeout_s=1.0, audit_guard=False, hidden_paths=[str(tmp_path)])
    assert res.killed_reason == "timeout"
    time.sleep(0.2)
    assert _sandbox_processes(str(tmp_path)) == []


def test_memory_limit():
    res = run_python("x = bytearray(2 * 1024**3)", timeout_s=5.0, memory_mb=256)
    assert res.killed_reason == "memory"
    assert res.returncode != 0


def test_output_flood_is_truncated_and_killed_fast():
    src = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)"
    res = run_python(src, timeout_s=5.0, max_output_bytes=10_000)
    assert res.killed_reason == "output"
    assert len(res.stdout) + len(res.stderr) <= 10_000
    assert res.stdout == "x" * len(res.stdout) and len(res.stdout) > 0
    assert res.duration_s < 10


def test_write_outside_sandbox_blocked(tmp_path):
    target = tmp_path / "escaped.txt"
    res = run_python(f"open({str(target)!r}, 'w').write('x')", timeout_s=5.0)
    assert "PermissionError" in res.stderr
    assert not target.exists()
    climb = run_python("import os\nos.chdir('..')\nopen('x_rljax_escape', 'w')", timeout_s=5.0)
    assert "PermissionError" in climb.stderr


def test_file_size_limit_inside_sandbox():
    ok = run_python("open('small', 'w').write('x' * 1000)", timeout_s=5.0)
    assert ok.returncode == 0
    big = run_python(f"open('big', 'w').write('x' * {2 * FILE_SIZE_BYTES})", timeout_s=5.0)
    assert "File too large" in big.stderr


def test_ctypes_and_subprocess_blocked():
    for src in (
        "import ctypes",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
    ):
        res = run_python(src, timeout_s=5.0)
        assert res.returncode != 0 and "not allowed" in res.stderr, src


@pytest.mark.parametrize(
    "netns, guard", [(True, True), (False, True), (True, False)], ids=["both", "guard", "netns"]
)
def test_no_network_connection(netns, guard):
    if netns and not guard and not network_namespace_available():
        pytest.skip("this kernel refuses new network namespaces; only the audit guard applies")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        res = run_python(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "print('connected')",
            timeout_s=5.0,
            network_namespace=netns,
            audit_guard=guard,
        )
        assert "connected" not in res.stdout and res.returncode != 0
        with pytest.raises(socket.timeout):
            server.accept()


def test_network_namespace_is_separate():
    if not network_namespace_available():
        pytest.skip("this kernel refuses new network namespaces")
    here = os.readlink("/proc/self/ns/net")
    probe = "import os\nprint(os.readlink('/proc/self/ns/net'))"
    # The mount namespace would hide /proc, which the probe reads, so it stays off here.
    res = run_python(probe, timeout_s=5.0, mount_namespace=False)
    assert res.stdout.strip() not in ("", here)
    off = run_python(probe, timeout_s=5.0, network_namespace=False, mount_namespace=False)
    assert off.stdout.strip() == here


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="MAX_STDIN_BYTES"):
        run_python("pass", stdin="x" * 100_000)


def test_the_program_cannot_raise_its_own_limits():
    src = "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))"
    res = run_python(src, timeout_s=5.0)
    assert res.returncode != 0 and "resource.setrlimit is not allowed" in res.stderr


# Tries to read the trainer's files through each route; prints one JSON object {route: what it
# got}, or {route: "ERR <exception>"} where the route was refused (and its uid).
_HOSTILE = """
import json, os, pathlib

def attempt(read):
    try:
        return read()
    except Exception as err:
        return "ERR " + type(err).__name__

got = {
    "uid": os.getuid(),
    "open": attempt(lambda: open(SECRET).read()),
    "listdir": attempt(lambda: os.listdir(TRAINER)),
    "pathlib": attempt(lambda: [p.read_text() for p in pathlib.Path(TRAINER).iterdir()]),
    "hidden_paths": attempt(lambda: open(KEY).read()),
    "proc_cwd": attempt(lambda: open(f"/proc/{TRAINER_PID}/cwd/secret.txt").read()),
    "proc_environ": attempt(lambda: open(f"/proc/{TRAINER_PID}/environ", "rb").read().decode()),
}
print(json.dumps(got))
"""


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    """A trainer cwd holding secret.txt, a data dir holding key.txt, and an entry of this
    process's own environment (what /proc/<pid>/environ shows) that the child would lack."""
    cwd, data = tmp_path / "trainer", tmp_path / "data"
    cwd.mkdir()
    data.mkdir()
    token, key = secrets.token_hex(16), secrets.token_hex(16)
    (cwd / "secret.txt").write_text(token)
    (data / "key.txt").write_text(key)
    monkeypatch.chdir(cwd)
    with open("/proc/self/environ", "rb") as f:
        entries = [e.decode() for e in f.read().split(b"\0") if b"=" in e]
    env = next(e for e in entries if e.split("=")[0] not in ("PATH", "LC_ALL", "HOME"))
    source = (
        f"SECRET, KEY = {str(cwd / 'secret.txt')!r}, {str(data / 'key.txt')!r}\n"
        f"TRAINER, TRAINER_PID = {str(cwd)!r}, {os.getpid()}\n" + _HOSTILE
    )
    return {"source": source, "data": str(data), "token": token, "key": key, "env": env}


def test_hostile_reads_succeed_without_protection(trainer):
    # The control: with both layers off, every route of the hostile program reaches a secret,
    # but for the trainer's /proc entries: the kernel refuses those to a process that holds
    # fewer capabilities than the trainer (the program has none) or another user namespace.
    res = run_python(
        trainer["source"],
        timeout_s=5.0,
        mount_namespace=False,
        audit_guard=False,
        hidden_paths=[trainer["data"]],
    )
    got = json.loads(res.stdout)
    if got["uid"] != 0:
        pytest.skip("the program runs as an unprivileged uid, which cannot read them either")
    assert got["open"] == trainer["token"]
    assert got["listdir"] == ["secret.txt"] and got["pathlib"] == [trainer["token"]]
    assert got["hidden_paths"] == trainer["key"]
    assert got["proc_cwd"] == got["proc_environ"] == "ERR PermissionError"


@pytest.mark.parametrize(
    "mountns, guard", [(True, True), (True, False), (False, True)], ids=["both", "mount", "guard"]
)
def test_hostile_program_cannot_read_the_trainers_files(trainer, mountns, guard):
    if mountns and not guard and not mount_namespace_available():
        pytest.skip("this kernel refuses private mount namespaces; only the audit guard applies")
    res = run_python(
        trainer["source"],
        timeout_s=5.0,
        mount_namespace=mountns,
        audit_guard=guard,
        hidden_paths=[trainer["data"]],
    )
    got = json.loads(res.stdout)
    del got["uid"]
    for secret in (trainer["token"], trainer["key"], trainer["env"]):
        assert secret not in res.stdout and secret not in res.stderr
    if guard:  # the guard refuses every route first
        assert all(v == "ERR PermissionError" for v in got.values()), got
    else:  # the hidden directories are empty tmpfs mounts and /proc is covered
        # (or, when they lie in /tmp as pytest's tmp_path does, absent from the private /tmp)
        gone = "ERR FileNotFoundError"
        assert got["listdir"] in ([], gone) and got["pathlib"] in ([], gone), got
        for route in ("open", "hidden_paths", "proc_cwd", "proc_environ"):
            assert got[route] == "ERR FileNotFoundError", (route, got)


def test_mount_namespace_probe_matches_a_run():
    res = run_python("import os\nprint(os.path.exists('/proc/self'))", audit_guard=False)
    assert res.stdout.strip() == str(not mount_namespace_available())


def test_normal_program_runs_with_the_trainers_directories_hidden():
    # Run from the repository (a hidden cwd holding the venv) as root (/root holding pyenv): the
    # interpreter's directories must be bound back for these imports to work.
    src = (
        "import collections, decimal, fractions, json, math, re, statistics\n"
        "words = re.findall(r'[a-z]+', 'b a b c b a')\n"
        "print(json.dumps([collections.Counter(words).most_common(1)[0], math.comb(10, 3),\n"
        "    str(decimal.Decimal(1) / 8), str(fractions.Fraction(6, 4)),\n"
        "    statistics.median([3, 1, 2])]))\n"
    )
    res = run_python(src, timeout_s=5.0)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [
        ["b", 3],
        math.comb(10, 3),
        "0.125",
        "3/2",
        statistics.median([3, 1, 2]),
    ]


@pytest.mark.parametrize("mountns", [True, False], ids=["mount", "guard"])
def test_sandbox_directory_inside_a_hidden_directory_stays_usable(trainer, monkeypatch, mountns):
    # The temporary directory lies under the trainer's cwd, which is hidden: it is bound back,
    # and the rest of the cwd stays hidden (empty but for the path to it, or refused).
    if mountns and not mount_namespace_available():
        pytest.skip("this kernel refuses private mount namespaces")
    sandboxes = os.path.join(os.getcwd(), "tmp")
    os.mkdir(sandboxes)
    monkeypatch.setattr(tempfile, "tempdir", sandboxes)
    src = (
        "import os\nopen('note', 'w').write('kept')\n"
        "try:\n    trainer = os.listdir('../..')\n"
        "except PermissionError:\n    trainer = 'refused'\n"
        "print(open('note').read(), sorted(os.listdir('.')), trainer)"
    )
    res = run_python(src, timeout_s=5.0, mount_namespace=mountns, audit_guard=not mountns)
    assert res.returncode == 0, res.stderr
    trainer_view = ["tmp"] if mountns else "refused"
    files = (
        ["main.py", "note"]
        if mountns and private_tmp_available()
        else ["_sandbox_prelude.py", "main.py", "note"]
    )
    assert res.stdout == f"kept {files} {trainer_view}\n"


def test_hidden_paths_must_be_directories(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match="not an existing directory"):
        run_python("pass", hidden_paths=[str(path)])

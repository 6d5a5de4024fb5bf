"""RunDir: one writer per run directory, and a resumed config checked against the stored one."""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
from launching import ROOT, TINY_MODEL, launcher_env
from ml_collections import ConfigDict

from configs.grpo_addition import get_config
from rljax.config import validate_config
from rljax.train.run_dir import CONFIG, HISTORY, LOCK, RunDir

# A process that holds the lock until its stdin closes (or it is killed).
HOLD = (
    "import sys\n"
    "from ml_collections import ConfigDict\n"
    "from rljax.train.run_dir import RunDir\n"
    "with RunDir(sys.argv[1], ConfigDict()):\n"
    "    print('locked', flush=True)\n"
    "    sys.stdin.read()\n"
)


def holder(run_dir):
    """A second process holding `run_dir`'s lock (once this returns)."""
    env = launcher_env()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "locked\n"
    return proc


def refusal(run_dir):
    """The message a writer gets while another holds `run_dir`."""
    with pytest.raises(ValueError) as info:
        with RunDir(str(run_dir), ConfigDict()):
            pass
    return str(info.value)


def test_a_second_writer_in_the_same_process_is_refused_naming_pid_and_host(tmp_path):
    with RunDir(str(tmp_path), ConfigDict()):
        message = refusal(tmp_path)
    assert f"is in use by pid {os.getpid()} on host {socket.gethostname()}" in message
    assert "wait for that run to finish, or set run_dir to another directory" in message
    assert "\n" not in message
    with RunDir(str(tmp_path), ConfigDict()):  # released on exit
        pass


def test_the_lock_is_held_by_another_process_and_released_when_it_exits(tmp_path):
    proc = holder(tmp_path)
    assert f"pid {proc.pid} on host {socket.gethostname()}" in refusal(tmp_path)
    proc.communicate("", timeout=60)  # it leaves the with block and exits
    with RunDir(str(tmp_path), ConfigDict()):
        pass


def test_a_lock_file_left_by_a_killed_holder_does_not_block_the_next_run(tmp_path):
    proc = holder(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    lock = tmp_path / LOCK
    assert json.loads(lock.read_text())["pid"] == proc.pid  # stale: the file stays
    with RunDir(str(tmp_path), ConfigDict()):
        assert json.loads(lock.read_text())["pid"] == os.getpid()


@pytest.mark.filterwarnings("ignore:os.fork")  # the child only waits, then exits
def test_child_processes_do_not_keep_the_lock(tmp_path):
    """A forked child (a reward worker) and an exec'd one that inherits descriptors (a
    sandbox) outlive the run; the next run must still get the lock (the forked one holds it
    without the at-fork hook; the exec'd one would if the descriptor were inheritable)."""
    read, write = os.pipe()
    started, ready = os.pipe()
    with RunDir(str(tmp_path), ConfigDict()):
        forked = os.fork()
        if forked == 0:  # the child waits until the test closes the pipe
            os.write(ready, b"!")  # the at-fork hooks have run: os.fork() has returned here
            os.close(write)
            os.read(read, 1)
            os._exit(0)
        os.read(started, 1)  # else the parent may re-lock before the child ran its hooks
        os.close(started)
        os.close(ready)
        execd = subprocess.Popen(["sleep", "60"], close_fds=False)
    try:
        with RunDir(str(tmp_path), ConfigDict()):
            pass
    finally:
        os.close(write)
        os.close(read)
        os.waitpid(forked, 0)
        execd.kill()
        execd.wait()


def validated(algorithm=None, **changes):
    """The grpo_addition recipe, validated, with dotted keys changed (and another algorithm
    section)."""
    config = get_config()
    if algorithm is not None:
        config.algorithm = ConfigDict(algorithm)
    for key, value in changes.items():
        section, name = key.split(".")
        config[section][name] = value
    return validate_config(config)


def history(run_dir):
    return [json.loads(line) for line in open(run_dir / HISTORY)]


def start(run_dir, config, step):
    with RunDir(str(run_dir), config) as run:
        run.begin(step)


def test_a_resume_that_changes_the_algorithm_or_lr_is_refused_naming_keys_and_flag(tmp_path):
    start(tmp_path, validated(), None)
    stored = (tmp_path / CONFIG).read_text()
    rloo = {"name": "rloo", "kl_coef": 0.0}
    with pytest.raises(ValueError) as info:
        start(tmp_path, validated(rloo), 50)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"run_dir {tmp_path} was trained with another config")
    assert ": algorithm.name: 'grpo' -> 'rloo'; algorithm.aggregation: 'token-mean' -> unset;" in (
        message
    )
    assert "and 3 more; " in message  # clip_eps, clip_eps_high, entropy_coef, ...
    assert "set train.allow_config_change=True" in message
    lr = r"config \(.*config.json\): train.learning_rate: 0.0001 -> 0.0003;"
    with pytest.raises(ValueError, match=lr):
        start(tmp_path, validated(**{"train.learning_rate": 3e-4}), 50)
    assert (tmp_path / CONFIG).read_text() == stored  # nothing recorded
    assert [r["step"] for r in history(tmp_path)] == [0]

    start(tmp_path, validated(rloo, **{"train.allow_config_change": True}), 50)
    assert json.loads((tmp_path / CONFIG).read_text())["algorithm"]["name"] == "rloo"
    records = history(tmp_path)
    assert [(r["step"], r["config"]["algorithm"]["name"]) for r in records] == [
        (0, "grpo"),
        (50, "rloo"),
    ]


def test_execution_only_keys_change_freely_and_the_history_keeps_each_start(tmp_path):
    start(tmp_path, validated(), None)
    free = {
        "train.steps": 600,
        "train.eval_every": 10,
        "train.checkpoint_every": 25,
        "train.microbatches": 2,
        "mesh.data": 8,
        "reward.workers": 2,
        "model.remat": "block",
    }
    start(tmp_path, validated(**free), 50)
    start(tmp_path, validated(**free), 100)
    start(tmp_path, validated(**free), 75)  # a resume redoes the steps after 75
    assert [r["step"] for r in history(tmp_path)] == [0, 50, 75]
    assert history(tmp_path)[-1]["config"]["train"]["steps"] == 600
    start(tmp_path, validated(**{"train.learning_rate": 1.0}), None)  # a new run: no check
    assert [r["step"] for r in history(tmp_path)] == [0]


def test_train_steps_is_locked_where_it_sets_a_schedule(tmp_path):
    aqn = {"rollout.weight_format": "mxfp4", "rollout.aqn_sigma_start": 1e-2}
    start(tmp_path, validated(**aqn), None)
    with pytest.raises(ValueError, match="train.steps: 300 -> 600"):
        start(tmp_path, validated(**aqn, **{"train.steps": 600}), 50)


def test_a_key_added_since_the_stored_config_counts_as_its_default(tmp_path):
    start(tmp_path, validated(), None)
    stored = json.loads((tmp_path / CONFIG).read_text())
    del stored["critic"]["separate"]  # written before the key existed
    (tmp_path / CONFIG).write_text(json.dumps(stored))
    start(tmp_path, validated(), 50)
    with pytest.raises(ValueError, match=r"critic.separate: False -> True"):
        start(tmp_path, validated(**{"critic.separate": True}), 50)


def test_the_launcher_refuses_a_locked_run_dir_in_one_line(tmp_path):
    proc = holder(tmp_path)
    try:
        env = launcher_env()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "launchers.train",
                "--config=configs/grpo_addition.py",
                f"--config.run_dir={tmp_path}",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        proc.communicate("", timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: run_dir {tmp_path} is in use by pid {proc.pid} on host")
    assert not (tmp_path / "metrics.jsonl").exists()


TINY = [
    *TINY_MODEL,
    "--config.sft.steps=30",
    "--config.sft.batch_size=16",
    "--config.train.prompts_per_step=4",
    "--config.rollout.n_samples=4",
    "--config.task.eval_size=16",
    "--config.train.checkpoint_every=2",
    "--config.train.eval_every=2",
]


def launch(run_dir, *flags, config="configs/grpo_addition.py"):
    env = launcher_env()  # one CPU device
    command = [sys.executable, "-m", "launchers.train", f"--config={config}"]
    command += [f"--config.run_dir={run_dir}", *TINY, *flags]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def one_line_error(result):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def add_checkpoint_with_nan(checkpoints, step):
    """Checkpoint `step + 1`: checkpoint `step` with a NaN in Adam's second moment, written by
    orbax alone (so without a manifest), as a damaged array file that restores wrong numbers
    would be (a flipped byte may or may not make a NaN; this does, deterministically)."""
    state = ocp.StandardCheckpointer().restore(checkpoints / str(step) / "state")
    nu = state["opt_state"][1][0]["nu"]["embed"]
    nu["value"] = np.array(nu["value"])
    nu["value"][3, 5] = np.nan
    manager = ocp.CheckpointManager(checkpoints)
    data = manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
    items = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data))
    manager.save(step + 1, args=items)
    manager.wait_until_finished()
    manager.close()


@pytest.mark.slow  # one training launch and three resumes: ~60 s on 2 cores
def test_resuming_with_another_algorithm_or_a_damaged_checkpoint_stops_in_one_line(tmp_path):
    """The issue's cases: a GRPO run directory resumed with the RLOO recipe; a checkpoint
    without a manifest whose optimizer state restores a NaN, refused with and without
    train.allow_unverified_checkpoint."""
    done = launch(tmp_path, "--config.train.steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    kept = {name: (tmp_path / name).read_text() for name in (CONFIG, HISTORY, "metrics.jsonl")}

    rloo = one_line_error(
        launch(tmp_path, "--config.train.steps=4", config="configs/rloo_addition.py")
    )
    assert "trained with another config" in rloo and "algorithm.name: 'grpo' -> 'rloo'" in rloo
    assert "train.allow_config_change=True" in rloo
    assert {name: (tmp_path / name).read_text() for name in kept} == kept  # nothing written

    add_checkpoint_with_nan(tmp_path / "checkpoints", 2)
    step_dir = tmp_path / "checkpoints" / "3"
    unverified = one_line_error(launch(tmp_path, "--config.train.steps=4"))
    assert unverified == (
        f"error: checkpoint {step_dir} has no rljax_manifest.json, so its files cannot be "
        "verified; delete it to resume from an earlier checkpoint, or set "
        "train.allow_unverified_checkpoint=True to restore it anyway"
    )
    allowed = launch(
        tmp_path, "--config.train.steps=4", "--config.train.allow_unverified_checkpoint=True"
    )
    assert allowed.returncode != 0
    nan = allowed.stderr.strip().splitlines()[-1]  # after the warning that it is unverified
    assert nan.startswith(
        f"error: checkpoint {step_dir}: .opt_state[1][0].nu['embed'].value holds NaN or inf"
    )
    assert (tmp_path / "metrics.jsonl").read_text() == kept["metrics.jsonl"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "3"]  # no step 4 written

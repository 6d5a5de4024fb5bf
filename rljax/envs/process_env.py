"""An environment in a child process of its own, killed at its time limit (`env.isolation=
"process"`).

`Episode` enforces `env.time_limit_s` by abandoning a late call, but the call's thread cannot be
stopped: an environment caught in a loop keeps a core busy for the rest of the run, and one that
calls `os._exit` ends the trainer. `ProcessEnvironment` builds the environment in a child
process (started by the reward pool's forkserver, `rljax.rewards.pool.process_context`: it
ignores SIGINT, dies with the trainer and runs JAX on the CPU only) and forwards `reset` and
`step` to it over a pipe. A call still running at the limit is answered by killing the process
(SIGKILL: the work stops, not just the wait); a process that dies mid-call (`os._exit`, a crash,
the kernel's OOM killer) ends its episode as "raised" with the exit code or signal; `close`
stops it at the end of the episode. One process per episode, so an episode's state is its
process's memory, as with threads. The factory (a task's `make_env`) and the `Step`s must
pickle; a step whose `info` does not ends its episode as "raised", naming it.
"""

from __future__ import annotations

import functools
import multiprocessing.connection
import pickle
import signal
from collections.abc import Callable, Mapping
from typing import Any

from rljax.envs.base import Environment, Step
from rljax.rewards.pool import become_worker, process_context

ISOLATIONS = ("thread", "process")
"""Values of `env.isolation`: environments in the trainer's threads, or a process each."""

_START_TIMEOUT_S = 120.0  # unpickling the factory in a fresh process (its imports)


def _serve(conn: multiprocessing.connection.Connection, factory: bytes) -> None:
    """The child's loop: build the environment, then (method, argument) in, outcome out."""
    become_worker()
    try:
        try:
            env = pickle.loads(factory)()
        except BaseException as err:  # pylint: disable=broad-except  # reported
            conn.send(("error", f"making the environment raised {err!r}"))
            return
        conn.send(("ok", None))
        while (message := conn.recv()) is not None:
            method, argument = message
            try:
                conn.send(("ok", getattr(env, method)(argument)))
            except BaseException as err:  # pylint: disable=broad-except  # reported, incl. exit
                conn.send(("error", f"{method} raised {err!r}"))
        close = getattr(env, "close", None)
        if callable(close):  # asked to stop: the episode is over
            close()
    except (EOFError, OSError):  # the trainer closed the pipe or is gone
        pass


def _pickled(make_env: Callable[[], Environment]) -> bytes:
    try:
        return pickle.dumps(make_env)
    except Exception as err:  # pylint: disable=broad-except  # one clear line
        raise ValueError(
            f"{make_env!r} cannot be sent to an env.isolation='process' environment "
            f"({type(err).__name__}: {err}); define it at module level"
        ) from None


class ProcessEnvironment:
    """`make_env()` built and played in a child process, hard-killed past `time_limit_s`.

    Args:
      make_env: builds the environment in the child (must pickle: a task's `make_env`).
      time_limit_s: limit on each `reset` and `step`; the process is killed when one runs past.
    """

    def __init__(self, make_env: Callable[[], Environment], time_limit_s: float):
        factory = _pickled(make_env)
        self.time_limit_s = time_limit_s
        context = process_context()
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=_serve, args=(child, factory), daemon=True)
        self._proc.start()
        child.close()
        self._answer("starting the environment", _START_TIMEOUT_S)

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._proc.pid

    def reset(self, task: Mapping[str, Any]) -> str:
        """`reset(task)` in the child."""
        return self._call("reset", dict(task))

    def step(self, action: str) -> Step:
        """`step(action)` in the child."""
        return self._call("step", action)

    def _call(self, method: str, argument: Any) -> Any:
        try:
            self._conn.send((method, argument))
        except OSError:
            self._kill()
            raise RuntimeError(f"the environment process {self._ended()}") from None
        return self._answer(method, self.time_limit_s)

    def _answer(self, what: str, limit: float) -> Any:
        """The child's reply; kills it and raises past `limit` or when it died."""
        if not self._conn.poll(limit):
            self._kill()
            raise TimeoutError(f"{what} ran past {limit} s; its process was killed")
        try:
            tag, value = self._conn.recv()
        except (EOFError, OSError):
            self._kill()
            raise RuntimeError(f"the environment process {self._ended()} during {what}") from None
        if tag == "error":
            raise RuntimeError(value)
        return value

    def _ended(self) -> str:
        self._proc.join(timeout=5.0)
        code = self._proc.exitcode
        if code is not None and code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def close(self) -> None:
        """Stops the child: asked (it calls the environment's `close()`, if any), killed if it
        has not stopped within `time_limit_s`; idempotent."""
        if self._proc.exitcode is None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(timeout=self.time_limit_s)
        self._kill()

    def _kill(self) -> None:
        if self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join()
        self._conn.close()


def _started() -> None:
    """A process that only starts."""


@functools.cache
def _warm_forkserver() -> None:
    """Starts the forkserver and waits for its imports, once per trainer process."""
    process = process_context().Process(target=_started, daemon=True)
    process.start()
    process.join()


def process_factory(
    make_env: Callable[[], Environment], time_limit_s: float
) -> Callable[[], ProcessEnvironment]:
    """A factory of `ProcessEnvironment(make_env, time_limit_s)`, with the forkserver started
    and its imports done here, so that no episode's time limit pays for them.

    Raises:
      ValueError: if `make_env` does not pickle (before any episode starts).
    """
    _pickled(make_env)
    _warm_forkserver()
    return functools.partial(ProcessEnvironment, make_env, time_limit_s)

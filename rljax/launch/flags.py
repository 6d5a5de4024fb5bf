"""absl flag parsing for the launchers: one-line errors for bad config files, keys and values."""

from __future__ import annotations

import inspect
import os
import re
import sys
import types
from typing import Any

from absl import app, flags, logging
from ml_collections import ConfigDict
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from rljax.data.tasks import TASKS


class ConfigFileError(Exception):
    """A config file that cannot be loaded; its message is the one line the launcher prints.

    Not a ValueError: absl would wrap that in a multi-line "Illegal flag value" message.
    """


def _line_in(err: BaseException, file: str) -> str:
    """ " line N" of the deepest frame of `err`'s traceback inside `file`, else ""."""
    line, tb = "", err.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == file:
            line = f" line {tb.tb_lineno}"
        tb = tb.tb_next
    return line


def _explain(err: BaseException, file: str) -> str:
    """One line saying what is wrong with config file `file`, from the error loading it raised."""
    where = os.path.abspath(file)
    if isinstance(err, SyntaxError):  # IndentationError and TabError included
        if err.filename and os.path.abspath(err.filename) != where:
            file = f"{err.filename} (imported by {file})"
        return f"{file} line {err.lineno}: {err.msg}; fix the Python syntax of the config file"
    if isinstance(err, AttributeError) and err.name == "get_config":
        if isinstance(err.obj, types.ModuleType):
            return (
                f"{file} defines no get_config(); a config file must define get_config() "
                "returning an ml_collections.ConfigDict"
            )
    detail = " ".join(f"{type(err).__name__}: {err}".split())
    return f"{file}{_line_in(err, where)}: loading the config raised {detail}; fix the config file"


def _importable_package(file: str) -> None:
    """Put the folder above a config file's package on sys.path (the repository for
    configs/*.py), so a config that imports its siblings (`from configs.grpo_addition import
    ...`) loads from the `rljax` console script, which, unlike `python -m`, does not put the
    working directory there, and from any working directory."""
    folder = package = os.path.dirname(os.path.abspath(file))
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder = os.path.dirname(folder)
    if folder != package and folder not in sys.path:
        sys.path.insert(0, folder)


class _ReportingParser(flags.ArgumentParser):
    """ml_collections' config-file parser, with every failure turned into a ConfigFileError."""

    def __init__(self, inner: ConfigFileFlagParser):
        self._inner = inner
        self.loaded: tuple[str, ConfigDict] | None = None  # (file, config) once parsed

    def flag_type(self) -> str:
        return self._inner.flag_type()

    def parse(self, argument: str) -> Any:
        file = argument.split(":", 1)[0]
        if not os.path.isfile(file):
            raise ConfigFileError(
                f"config file {file} does not exist; pass the path of a .py config file"
            )
        _importable_package(file)
        try:
            config = self._inner.parse(argument)
        except Exception as err:
            if str(err).startswith("Error whilst parsing config file"):  # ml_collections re-raise
                err = err.__context__ or err
            raise ConfigFileError(_explain(err, file)) from None
        if isinstance(config, ConfigDict):
            self.loaded = (file, config)
            return config
        try:  # ml_collections defers an OSError of get_config() to the first use of the result
            getattr(config, "lock", None)
        except OSError as err:
            raise ConfigFileError(_explain(err.__cause__ or err, file)) from None
        raise ConfigFileError(
            f"{file}: get_config() returned {type(config).__name__}, not an "
            "ml_collections.ConfigDict; return the ConfigDict"
        )


def _task_setting_hint(argv: list[str], flag_values: flags.FlagValues) -> str | None:
    """For `--config.task.KEY=...` where the config file's task section lacks KEY but another
    task takes it (e.g. train_path of task 'local'): one line saying it needs a config file."""
    for name in flag_values:
        parser = flag_values[name].parser
        if not isinstance(parser, _ReportingParser) or parser.loaded is None:
            continue
        file, config = parser.loaded
        task = config.get("task")
        for arg in argv:
            match = re.match(rf"--?{re.escape(name)}\.task\.(\w+)=", arg)
            if task is None or match is None or match[1] in task:
                continue
            key = match[1]
            takers = [n for n, cls in TASKS.items() if key in inspect.signature(cls).parameters]
            if takers:
                return (
                    f"task.{key} is a setting of task {' or '.join(map(repr, takers))}, but the "
                    f"task section of {file} (task {task.get('name')!r}) does not set it; "
                    "command-line overrides only change keys the config file sets, so set "
                    f"task.name and task.{key} together in a config file (e.g. a copy of {file})"
                )
    return None


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
    """absl flag parsing with one-line errors for config files, unknown keys and bad values."""
    for name in list(flag_values):
        flag = flag_values[name]
        if isinstance(flag.parser, ConfigFileFlagParser):
            flag.parser = _ReportingParser(flag.parser)
    try:
        return flag_values(argv)
    except ConfigFileError as err:
        sys.exit(f"error: {err}")
    except flags.Error as err:  # a value of the wrong type, a missing required flag
        sys.exit(f"error: {err}")
    except (AttributeError, KeyError) as err:  # ml_collections: a config key that is not there
        hint = _task_setting_hint(argv, flag_values)
        if hint is not None:
            sys.exit(f"error: {hint}")
        detail = str(err).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        sys.exit(f"error: unknown config key {detail}")
    except OSError as err:  # overrides of a config file that failed to load
        sys.exit("error: " + " ".join(str(err).split()))


def begin(argv: list[str]) -> None:
    """What both launchers do first in `main`: refuse positional arguments (config values are
    flags) and keep absl logging at WARNING unless -v/--verbosity was given (orbax and grain
    are chatty at INFO)."""
    if len(argv) > 1:
        raise app.UsageError(
            f"unexpected arguments {argv[1:]}; config values are set with --config.KEY=VALUE"
        )
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)

"""A config file that cannot be loaded stops the launchers with one line naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from rljax.launch.flags import parse_flags

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_GOOD = "import ml_collections\n\ndef get_config():\n    return ml_collections.ConfigDict({'a': 1})"


def _parse(path: str, *overrides: str):
    """The launchers' parsing of `--config=path overrides` on fresh flags -> config or exit."""
    sys.modules.pop("config_config", None)  # ml_collections' loader would reuse the module
    argv = ["launcher", f"--config={path}", *overrides]
    values = flags.FlagValues()
    config = config_flags.DEFINE_config_file(
        "config", None, "config", flag_values=values, lock_config=True, sys_argv=argv
    )
    parse_flags(argv, values)
    return config.value


@pytest.mark.parametrize(
    "source, message",
    [
        ("def get_config(:\n    pass\n", r"{file} line 1: invalid syntax; fix the Python syntax"),
        ("def get_config():\n    x = 1\n     y = 2\n", r"{file} line 3: unexpected indent"),
        (
            "def get_config():\n    raise RuntimeError('boom')\n",
            r"{file} line 2: loading the config raised RuntimeError: boom; fix the config file",
        ),
        (  # ml_collections re-raises a ValueError with the whole traceback in its message
            "def get_config():\n    raise ValueError('bad\\nvalue')\n",
            r"{file} line 2: loading the config raised ValueError: bad value; fix",
        ),
        (  # ml_collections defers an OSError to the first use of the config
            "def get_config():\n    return open('/nonexistent/x')\n",
            r"{file} line 2: loading the config raised FileNotFoundError: .*/nonexistent/x",
        ),
        ("X = 1\n", r"{file} defines no get_config\(\); a config file must define get_config"),
        ("def get_config():\n    return None\n", r"{file}: get_config\(\) returned NoneType"),
        ("import os\nBAD = os.no_such_name\n", r"{file} line 2: .*AttributeError: .*no_such_name"),
    ],
    ids=["syntax", "indent", "raises", "value_error", "os_error", "no_get_config", "none", "attr"],
)
def test_broken_config_file_is_one_line_naming_it(source, message, tmp_path):
    file = tmp_path / "broken.py"
    file.write_text(source)
    for overrides in ((), ("--config.a=2",)):
        with pytest.raises(SystemExit) as stop:
            _parse(str(file), *overrides)
        line = str(stop.value.code)
        assert "\n" not in line, line
        assert line.startswith("error: "), line
        assert re.search(message.format(file=re.escape(str(file))), line), line


def test_missing_config_file_says_so(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: config file \S+nope.py does not exist"):
        _parse(str(tmp_path / "nope.py"))


def test_good_config_file_and_override_still_parse(tmp_path):
    file = tmp_path / "good.py"
    file.write_text(_GOOD)
    assert _parse(str(file), "--config.a=2").a == 2


def test_train_launcher_prints_the_one_line(tmp_path):
    """The launcher's own wiring (absl's app.run with parse_flags): exit 1, one stderr line."""
    file = tmp_path / "broken.py"
    file.write_text("def get_config(:\n")
    run = subprocess.run(
        [sys.executable, "-m", "launchers.train", f"--config={file}"],
        cwd=_REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    expected = rf"error: {re.escape(str(file))} line 1: .*; fix the Python syntax.*"
    assert re.fullmatch(expected, lines[0]), lines[0]


def test_a_task_setting_the_config_file_does_not_set_says_it_needs_a_config_file():
    recipe = os.path.join(_REPO, "configs", "grpo_addition.py")
    with pytest.raises(SystemExit) as stop:
        _parse(recipe, "--config.task.name=local", "--config.task.train_path=rows.jsonl")
    assert stop.value.code == (
        "error: task.train_path is a setting of task 'local' or 'skyrl_gym', but the task "
        f"section of {recipe} (task 'addition') does not set it; command-line overrides only "
        "change keys the config file sets, so set task.name and task.train_path together in a "
        f"config file (e.g. a copy of {recipe})"
    )
    # A typo of the file's own task setting keeps ml_collections' suggestion.
    with pytest.raises(SystemExit, match='unknown config key .*Did you mean "max_digits"'):
        _parse(recipe, "--config.task.max_digit=3")

"""The command's conventions: ``--version``, where the config is looked for (``$XDG_CONFIG_HOME``
honoured), one line naming the extra to install when a command needs one that is missing, and
shell completion."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from tests import builders

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"ffswarm {metadata.version('ffswarm')}\n"


def test_version_from_a_checkout_that_is_not_installed_is_pyprojects(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)  # the module main.py reads
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"ffswarm {PYPROJECT_VERSION}\n"


# --- where the config is found -------------------------------------------------------------------


def _config(path: Path, data_root: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data_root.mkdir(parents=True, exist_ok=True)
    path.write_text(f"data_root: {data_root}\n")
    return path


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder, a home and an XDG config folder, all empty, and no $FFSWARM_CONFIG."""
    for d in ("work", "home", "xdg"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FFSWARM_CONFIG", raising=False)
    return tmp_path


def _used_data_root(tmp_path: Path) -> str:
    """Which config the command read, told by the data root its answer names."""
    result = CliRunner().invoke(cli, ["status", "nosuch"])
    assert result.exception is not None
    message = str(result.exception)
    assert message.startswith("no job 'nosuch' under "), message
    return Path(message.removeprefix("no job 'nosuch' under ")).parent.name


def test_the_config_in_xdg_config_home_is_found(places: Path) -> None:
    _config(places / "home" / ".config" / "ffswarm" / "config.yaml", places / "root-home")
    _config(places / "xdg" / "ffswarm" / "config.yaml", places / "root-xdg")
    assert _used_data_root(places) == "root-xdg"


def test_without_xdg_config_home_the_config_is_in_dot_config(places: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(places / "home" / ".config" / "ffswarm" / "config.yaml", places / "root-home")
    _config(places / "xdg" / "ffswarm" / "config.yaml", places / "root-xdg")
    for unset in ("", "relative/dir"):  # the XDG spec: empty or relative means unset
        monkeypatch.setenv("XDG_CONFIG_HOME", unset)
        assert _used_data_root(places) == "root-home"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert _used_data_root(places) == "root-home"


def test_the_search_order_is_flag_env_cwd_then_xdg(places: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(places / "xdg" / "ffswarm" / "config.yaml", places / "root-xdg")
    _config(places / "work" / "ffswarm.yaml", places / "root-cwd")
    assert _used_data_root(places) == "root-cwd"
    monkeypatch.setenv("FFSWARM_CONFIG", str(_config(places / "env.yaml", places / "root-env")))
    assert _used_data_root(places) == "root-env"
    flag = _config(places / "flag.yaml", places / "root-flag")
    result = CliRunner().invoke(cli, ["--config", str(flag), "status", "nosuch"])
    assert f"under {places / 'root-flag'}" in str(result.exception)


def test_no_config_anywhere_names_every_place_looked(places: Path) -> None:
    result = CliRunner().invoke(cli, ["status"])
    assert result.exception is not None and getattr(result.exception, "exit_code", None) == 78
    assert "$XDG_CONFIG_HOME/ffswarm/config.yaml" in str(result.exception)


# --- a missing extra -------------------------------------------------------------------------------

# What `pip install .` (no extras) leaves out, as the controller imports it.
NOT_INSTALLED = [
    *("starlette", "uvicorn", "python_multipart", "multipart", "jwt", "PIL"),
    *("numpy", "cv2", "boto3", "botocore"),
]


def _ffswarm_without_extras(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real entry point in a fresh interpreter where the extras' modules cannot be imported."""
    code = (
        "import sys\n"
        f"for name in {NOT_INSTALLED!r}:\n"
        "    sys.modules[name] = None  # import of it raises ModuleNotFoundError, as when not installed\n"
        f"sys.argv = ['ffswarm', *{args!r}]\n"
        "from controller.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_api_without_the_api_extra_says_which_extra_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "ffswarm.yaml"
    config.write_text(f"data_root: {tmp_path}\ntenants: {{acme: {{api_keys_sha256: [{'a' * 64}]}}}}\n")
    proc = _ffswarm_without_extras(["--config", str(config), "api"], tmp_path)
    assert proc.returncode == 69, proc.stderr[-2000:]
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()  # one line, no traceback
    assert line.startswith('ffswarm: `ffswarm api` needs the "api" extra (')
    assert line.endswith("is not installed): pip install 'ffswarm[api]'")


def test_a_job_with_s3_paths_without_the_s3_extra_says_which_extra(tmp_path: Path) -> None:
    root = builders.data_root(tmp_path, photos=("faces/star.jpg",))
    (tmp_path / "s3-credentials").write_text("[default]\n")
    config = tmp_path / "ffswarm.yaml"
    config.write_text(
        f"data_root: {root}\nrunner_user: '10001:10001'\nstorage: {{s3: {{endpoint_url: 'http://127.0.0.1:9', "
        f"credentials_secret: ffswarm-s3, credentials_file: {tmp_path / 's3-credentials'}}}}}\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nsource: faces/star.jpg\ntargets: ['s3://media/crowd/*.jpg']\noutput: 'out/{stem}.png'\n")
    proc = _ffswarm_without_extras(["--config", str(config), "submit", "--dry-run", str(job)], tmp_path)
    assert proc.returncode == 69, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith('ffswarm: `ffswarm submit` needs the "s3" extra (')
    assert line.endswith("is not installed): pip install 'ffswarm[s3]'")


def test_commands_that_need_no_extra_work_without_them(tmp_path: Path) -> None:
    config = tmp_path / "ffswarm.yaml"
    config.write_text(f"data_root: {tmp_path}\n")
    proc = _ffswarm_without_extras(["--config", str(config), "status"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


# --- shell completion ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shell", "words"),
    [
        ("bash", "complete -o nosort -F _ffswarm_completion ffswarm"),
        ("zsh", "compdef _ffswarm_completion ffswarm"),
        ("fish", "complete --no-files --command ffswarm"),
    ],
)
def test_completion_script_for_each_shell(shell: str, words: str) -> None:
    result = CliRunner().invoke(cli, [], prog_name="ffswarm", env={"_FFSWARM_COMPLETE": f"{shell}_source"})
    assert result.exit_code == 0
    assert words in result.output


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_command_prints_the_same_script(shell: str) -> None:
    by_env = CliRunner().invoke(cli, [], prog_name="ffswarm", env={"_FFSWARM_COMPLETE": f"{shell}_source"})
    result = CliRunner().invoke(cli, ["completion", shell], prog_name="ffswarm")
    assert result.exit_code == 0
    assert result.output == by_env.output


def test_completion_completes_command_names() -> None:
    env = {"_FFSWARM_COMPLETE": "bash_complete", "COMP_WORDS": "ffswarm st", "COMP_CWORD": "1"}
    result = CliRunner().invoke(cli, [], prog_name="ffswarm", env=env)
    assert result.exit_code == 0
    assert result.output.split() == ["plain,status"]

"""scripts/setup.sh, run whole in a scratch copy of the repo with stand-ins on PATH (no network, no real
venv, no apt): a broken or too-old .venv is made again, an old $PYTHON is refused in one clear line, the
dependencies are reinstalled when pyproject.toml's content changes (not on a touch), a pip failure says that
setup needs PyPI, and a failed Java install is a warning (the demo does not need Java)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("dirname", "cat", "rm", "touch", "mkdir", "chmod")  # what setup.sh runs besides bash builtins

# the .venv's python: `-m pip ...` is logged (exit $FAKE_PIP_STATUS), everything else runs the real Python
VENV_PYTHON = f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "pip ${{*:3}}" >> "$FAKE_LOG"; exit "${{FAKE_PIP_STATUS:-0}}"; fi
exec {sys.executable} "$@"
"""

# $PYTHON: `-m venv DIR` is logged and makes DIR/bin/python (VENV_PYTHON); exits $FAKE_VENV_STATUS
BASE_PYTHON = f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = venv ]; then
  echo "venv $3" >> "$FAKE_LOG"
  /bin/mkdir -p "$3/bin" && /bin/cp "$FAKE_BIN/venv-python" "$3/bin/python"
  exit "${{FAKE_VENV_STATUS:-0}}"
fi
exec {sys.executable} "$@"
"""

# a Python 3.10 stand-in (its sys.version_info says so; its pip only logs, and fails)
PYTHON_310 = f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "old-pip ${{*:3}}" >> "$FAKE_LOG"; exit 1; fi
if [ "$1" = -c ]; then
  exec {sys.executable} -c "import sys; sys.version_info = (3, 10, 14, 'final', 0)
$2" "${{@:3}}"
fi
exec {sys.executable} "$@"
"""

# apt-get: logged; `install PKG` succeeds (and puts a java on PATH) only for the packages in $FAKE_APT_OK
APT_GET = """#!/bin/bash
echo "apt-get $*" >> "$FAKE_LOG"
[ "$1" = update ] && exit "${FAKE_APT_UPDATE_STATUS:-0}"
pkg="${@: -1}"
case " $FAKE_APT_OK " in
  *" $pkg "*) printf '#!/bin/bash\\necho java\\n' > "$FAKE_BIN/java"; /bin/chmod +x "$FAKE_BIN/java"; exit 0;;
esac
echo "E: Unable to locate package $pkg" >&2
exit 100
"""

ID = """#!/bin/bash
[ "$1" = -u ] && echo "${FAKE_UID:-0}"
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@dataclass
class Repo:
    root: Path
    bin: Path
    log: Path
    env: dict[str, str]

    def setup(self, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        return subprocess.run(["/bin/bash", "scripts/setup.sh"], cwd=self.root, env={**self.env, **env},
                              capture_output=True, text=True, timeout=timeout_s)

    def calls(self, prefix: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if line.startswith(prefix)]

    def working_venv(self) -> None:
        (self.root / ".venv" / "bin").mkdir(parents=True)
        shutil.copy(self.bin / "venv-python", self.root / ".venv" / "bin" / "python")


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = tmp_path / "bin"  # the whole PATH: no real java, apt-get, python3 or id
    bin_dir.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    _script(bin_dir / "venv-python", VENV_PYTHON)
    _script(bin_dir / "python3", BASE_PYTHON)
    _script(bin_dir / "python3.10", PYTHON_310)
    _script(bin_dir / "apt-get", APT_GET)
    _script(bin_dir / "id", ID)
    log = tmp_path / "log"
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "FAKE_LOG": str(log), "FAKE_BIN": str(bin_dir),
           "FAKE_UID": "1000", "LANG": "C.UTF-8"}
    return Repo(root, bin_dir, log, env)


# -- the venv ------------------------------------------------------------------------------------------------

def test_a_fresh_setup_makes_the_venv_and_installs_once(repo: Repo) -> None:
    r = repo.setup()
    assert r.returncode == 0, r.stderr
    assert repo.calls("venv") == ["venv .venv"]
    assert len(repo.calls("pip")) == 2 and "-e .[test,audit]" in repo.calls("pip")[1]
    r = repo.setup()
    assert r.returncode == 0, r.stderr
    assert repo.calls("venv") == repo.calls("pip") == [], "a second run only checks"


def test_a_venv_without_pip_is_made_again(repo: Repo) -> None:
    # `python3 -m venv` without python3-venv (or cut short by Ctrl-C): bin/python exists, pip does not
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", ".venv"], cwd=repo.root, check=True, timeout=60)
    r = repo.setup()
    assert r.returncode == 0, r.stderr
    assert repo.calls("venv") == ["venv .venv"]
    assert "making it again" in r.stderr
    assert len(repo.calls("pip")) == 2


def test_a_venv_of_python_3_10_is_made_again(repo: Repo) -> None:
    (repo.root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(repo.bin / "python3.10", repo.root / ".venv" / "bin" / "python")
    (repo.root / ".venv" / ".minibroker-installed").write_text("old\n")
    r = repo.setup()
    assert r.returncode == 0, r.stderr
    assert repo.calls("venv") == ["venv .venv"]
    assert len(repo.calls("pip")) == 2


def test_a_working_venv_is_kept_whatever_python3_is(repo: Repo) -> None:
    repo.working_venv()
    assert repo.setup().returncode == 0
    r = repo.setup(PYTHON="python3.10")  # only needed to make a venv
    assert r.returncode == 0, r.stderr
    assert repo.calls("venv") == repo.calls("pip") == []


def test_an_old_python_is_refused_in_one_clear_line(repo: Repo) -> None:
    r = repo.setup(PYTHON="python3.10")
    assert r.returncode != 0
    assert "python3.10 is Python 3.10; minibroker needs 3.11+" in r.stderr and "PYTHON=" in r.stderr
    assert repo.calls("venv") == [] and not (repo.root / ".venv").exists()


def test_a_missing_python_is_named(repo: Repo) -> None:
    r = repo.setup(PYTHON="python3.99")
    assert r.returncode != 0
    assert "python3.99 not found" in r.stderr and "PYTHON=" in r.stderr


def test_a_venv_module_that_fails_names_python3_venv(repo: Repo) -> None:
    # Debian's python3 without python3-venv: `-m venv` leaves a bin/python without pip and exits 1
    _script(repo.bin / "venv-python", f"#!/bin/bash\nexec {sys.executable} -I -S \"$@\"\n")
    r = repo.setup(FAKE_VENV_STATUS="1")
    assert r.returncode != 0
    assert "python3-venv" in r.stderr and "PYTHON=" in r.stderr
    assert not (repo.root / ".venv").exists(), "a half-made .venv is not left for the next run to trust"


# -- the dependencies ---------------------------------------------------------------------------------------

def test_a_touched_pyproject_does_not_reinstall_but_a_changed_one_does(repo: Repo) -> None:
    repo.working_venv()
    assert repo.setup().returncode == 0
    assert len(repo.calls("pip")) == 2
    pyproject = repo.root / "pyproject.toml"
    future = pyproject.stat().st_mtime + 3600
    os.utime(pyproject, (future, future))  # a checkout or touch: same content
    assert repo.setup().returncode == 0
    assert repo.calls("pip") == []
    pyproject.write_text(pyproject.read_text() + "\n# changed\n")
    assert repo.setup().returncode == 0
    assert len(repo.calls("pip")) == 2


def test_a_pip_failure_says_setup_needs_pypi_and_is_retried(repo: Repo) -> None:
    repo.working_venv()
    r = repo.setup(FAKE_PIP_STATUS="1")
    assert r.returncode != 0
    assert "setup needs network access to PyPI" in r.stderr
    r = repo.setup()
    assert r.returncode == 0, r.stderr
    assert len(repo.calls("pip")) == 2, "the failed install is not stamped as done"


# -- Java ----------------------------------------------------------------------------------------------------

def test_as_root_a_failed_java_install_is_a_warning(repo: Repo) -> None:
    repo.working_venv()
    r = repo.setup(FAKE_UID="0", FAKE_APT_OK="")
    assert r.returncode == 0, r.stderr
    assert "warning: could not install a Java runtime" in r.stderr
    assert [c.split()[-1] for c in repo.calls("apt-get install")] == ["openjdk-17-jre-headless",
                                                                      "default-jre-headless"]


def test_under_ci_a_failed_java_install_fails_the_setup(repo: Repo) -> None:
    # CI runs the Spark tests: they would fail later, each with a JVM gateway error instead of the cause
    repo.working_venv()
    r = repo.setup(FAKE_UID="0", FAKE_APT_OK="", CI="true")
    assert r.returncode != 0
    assert "error: could not install a Java runtime" in r.stderr and "CI is set" in r.stderr


def test_as_root_default_jre_is_the_fallback(repo: Repo) -> None:
    repo.working_venv()
    r = repo.setup(FAKE_UID="0", FAKE_APT_OK="default-jre-headless")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    assert (repo.bin / "java").exists()


def test_as_root_openjdk_17_comes_first_and_is_enough(repo: Repo) -> None:
    repo.working_venv()
    r = repo.setup(FAKE_UID="0", FAKE_APT_OK="openjdk-17-jre-headless default-jre-headless")
    assert r.returncode == 0, r.stderr
    assert repo.calls("apt-get update") and len(repo.calls("apt-get install")) == 1
    assert repo.calls("apt-get install")[0].endswith("openjdk-17-jre-headless")
    assert repo.setup(FAKE_UID="0").returncode == 0
    assert repo.calls("apt-get") == [], "java on PATH: nothing to install"


def test_as_root_a_failed_apt_update_still_tries_the_install(repo: Repo) -> None:
    repo.working_venv()
    r = repo.setup(FAKE_UID="0", FAKE_APT_UPDATE_STATUS="100", FAKE_APT_OK="openjdk-17-jre-headless")
    assert r.returncode == 0, r.stderr
    assert (repo.bin / "java").exists()


def test_not_root_java_is_not_installed(repo: Repo) -> None:
    repo.working_venv()
    r = repo.setup(FAKE_UID="1000", FAKE_APT_OK="openjdk-17-jre-headless")
    assert r.returncode == 0, r.stderr
    assert "no java on PATH" in r.stderr and repo.calls("apt-get") == []

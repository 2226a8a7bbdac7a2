"""The Docker build: a small context (.dockerignore keeps out the venv, git, caches and tool output, but
nothing the Dockerfile copies) and an image whose contents match what the Dockerfile says about them."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def ignored(path: str) -> bool:
    """Whether ``path`` (or a directory it is in) matches a pattern: the subset of Docker's rules used here
    (no ``!`` exceptions; ``**/`` matches any depth)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns():
        assert not pattern.startswith("!"), "exceptions are not modelled here"
        anywhere = pattern.startswith("**/")
        p = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, p) or (anywhere and fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], p)):
                return True
    return False


def test_the_context_leaves_out_the_venv_git_caches_and_tool_output() -> None:
    for path in (".venv/bin/python", ".git/HEAD", ".mypy_cache/x", ".ruff_cache/x", ".pytest_cache/x",
                 ".hypothesis/examples/x", "broker/__pycache__/process.cpython-311.pyc", "minibroker.egg-info/PKG-INFO",
                 "minibroker-data/cluster.json", "minibroker-chaos/broker-1/x", "minibroker-chaos-out/history.jsonl",
                 "spark-warehouse/x", "metastore_db/x", "derby.log"):
        assert ignored(path), path


def test_the_context_keeps_everything_the_dockerfile_copies() -> None:
    text = (ROOT / "Dockerfile").read_text()
    sources = [src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]]
    assert "pyproject.toml" in sources and "broker" in sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not ignored(src), f"{src} is copied by the Dockerfile but left out of the context"
        files = [p for p in (ROOT / src).rglob("*.py")] if (ROOT / src).is_dir() else []
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            assert "__pycache__" in rel or not ignored(rel), rel


def test_the_image_says_the_audit_is_not_in_it() -> None:
    # the image installs no audit extra and no Java; the Dockerfile says so rather than shipping a crash
    text = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install ([^&\n]+)", text)
    assert installs and all("audit" not in i for i in installs)
    assert "not in the image" in " ".join(text.split())

"""pyproject.toml's requirements: every one bounded above, the linters that gate scripts/test.sh (ruff, mypy)
pinned exactly so that a new release cannot fail a clean clone, and the environment the tests run in (made by
scripts/setup.sh from this file) satisfies them all."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("test", "audit")  # what scripts/setup.sh installs


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(pyproject: dict[str, Any]) -> list[Requirement]:
    project = pyproject["project"]
    texts = list(project["dependencies"])
    for extra in EXTRAS:
        texts += project["optional-dependencies"][extra]
    return [Requirement(t) for t in texts]


def by_name(pyproject: dict[str, Any]) -> dict[str, Requirement]:
    return {r.name.lower(): r for r in requirements(pyproject)}


def test_setup_installs_the_extras_that_exist(pyproject: dict[str, Any]) -> None:
    assert set(EXTRAS) <= set(pyproject["project"]["optional-dependencies"])
    assert f"EXTRAS={','.join(EXTRAS)}\n" in (ROOT / "scripts" / "setup.sh").read_text()


def test_every_requirement_has_an_upper_bound(pyproject: dict[str, Any]) -> None:
    unbounded = [str(r) for r in requirements(pyproject)
                 if not any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)]
    assert unbounded == []


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_the_linters_that_gate_the_tests_are_pinned_exactly(pyproject: dict[str, Any], tool: str) -> None:
    (spec,) = by_name(pyproject)[tool].specifier
    assert spec.operator == "==" and "*" not in spec.version, f"{tool}{spec}"


def test_pytest_asyncio_knows_the_fixture_loop_scope_option(pyproject: dict[str, Any]) -> None:
    # asyncio_default_fixture_loop_scope (set in [tool.pytest.ini_options]) came in pytest-asyncio 0.24
    assert "asyncio_default_fixture_loop_scope" in pyproject["tool"]["pytest"]["ini_options"]
    assert not by_name(pyproject)["pytest-asyncio"].specifier.contains(Version("0.23.8"))


def test_pyspark_stays_on_a_major_that_runs_on_java_17(pyproject: dict[str, Any]) -> None:
    spec = by_name(pyproject)["pyspark"].specifier
    assert spec.contains(Version("4.0.0")) and not spec.contains(Version("5.0.0"))


def test_the_installed_environment_satisfies_every_requirement(pyproject: dict[str, Any]) -> None:
    wrong = []
    for r in requirements(pyproject):
        try:
            version = metadata.version(r.name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{r}: not installed")
            continue
        if not r.specifier.contains(version, prereleases=True):
            wrong.append(f"{r}: {version} installed")
    assert wrong == [], "run scripts/setup.sh (pyproject.toml changed?)"


def test_markers_are_strict_and_registered(pyproject: dict[str, Any]) -> None:
    ini = pyproject["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"].split()
    assert any(m.startswith("slow:") for m in ini["markers"])

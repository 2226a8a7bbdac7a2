"""``minibroker ... --help`` explains itself everywhere: every argument has a help text, every subcommand page a
description, and every page prints (in-process, no subprocesses)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from cli.main import build_parser, main


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``(path, parser)`` for the top-level parser and every subcommand parser under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def subcommand_paths() -> list[tuple[str, ...]]:
    return [path for path, _ in parsers(build_parser()) if path]


def test_every_argument_has_help_and_every_subcommand_a_description() -> None:
    offenders: list[str] = []
    for path, parser in parsers(build_parser()):
        name = " ".join(("minibroker", *path))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if not action.help:
                offenders.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
        if path and not parser.description:
            offenders.append(f"{name}: no description")
    assert not offenders, "\n".join(offenders)


def test_subcommand_paths_cover_nested_commands() -> None:
    paths = subcommand_paths()
    for path in (("cluster", "up"), ("topics", "describe"), ("perf", "e2e"), ("chaos", "run"), ("audit",)):
        assert path in paths


@pytest.mark.parametrize("path", [(), *subcommand_paths()], ids=lambda p: " ".join(p) or "minibroker")
def test_help_page_prints(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: minibroker" in out


@pytest.mark.parametrize("path", subcommand_paths(), ids=" ".join)
def test_an_unknown_option_is_refused_with_the_subcommands_own_usage(
        path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    # `minibroker consume events --follow` answered with the top-level usage, which names no option of consume
    with pytest.raises(SystemExit) as info:
        main([*path, "--no-such-option"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: minibroker {' '.join(path)} ")
    last = err.rstrip().splitlines()[-1]  # (a command with required arguments names those first)
    name = " ".join(path)
    assert (last == f"minibroker {name}: error: unrecognized arguments: --no-such-option"
            or last.startswith(f"minibroker {name}: error: the following arguments are required")), err

"""Whole numbers written as decimal digits in names, files and addresses, read with a bound.

Two traps of the built-ins make this worth one function: ``str.isdigit`` (and a
regex ``\\d``) also accepts other scripts' digits, which ``int`` reads ('٣' is
3) or refuses ('²'), and ``int`` refuses more than 4300 digits, leading zeros
included, with a ValueError that no caller expects from a string it already
checked. Here the text must be ASCII digits, and its significant digits are
counted before ``int`` runs.
"""

from __future__ import annotations


def parse_digits(text: str, maximum: int) -> int | None:
    """The value of ``text`` if it is ASCII decimal digits (leading zeros allowed) at most
    ``maximum`` (>= 0), else None."""
    if not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(maximum)):
        return None
    value = int(significant)
    return value if value <= maximum else None

#!/usr/bin/env bash
# Creates .venv and installs minibroker with everything the tests and the audit need.
# Idempotent: a second run only checks. A .venv that does not work (no pip: made without python3-venv, or cut
# short by Ctrl-C) or that runs a Python older than 3.11 is made again. Dependencies are reinstalled when
# pyproject.toml's content changes (a hash is kept in the stamp; a checkout or touch alone does not count).
# Installs Java (for Spark) with apt-get when missing and root; if that fails it is only a warning: the demo
# does not need Java, the Spark audit and its tests do.
# Python: $PYTHON, else python3. Sourcing this file only defines the functions (tests use them).
set -euo pipefail

PY=${PYTHON:-python3}
STAMP=.venv/.minibroker-installed
EXTRAS=test,audit
JAVA_PACKAGES="openjdk-17-jre-headless default-jre-headless"

# .venv runs Python 3.11+ and has pip
venv_ok() {
  [ -x .venv/bin/python ] && .venv/bin/python -c 'import sys, pip; assert sys.version_info >= (3, 11)' >/dev/null 2>&1
}

# $PY exists and is Python 3.11+; else one clear error
check_python() {
  local ver
  if ! command -v "$PY" >/dev/null 2>&1; then
    echo "setup: error: $PY not found; minibroker needs Python 3.11+ (name one with PYTHON=/path/to/python3.11)" >&2
    return 1
  fi
  ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || ver=unknown
  if ! [[ $ver =~ ^([0-9]+)\.([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 3 ] \
      || { [ "${BASH_REMATCH[1]}" -eq 3 ] && [ "${BASH_REMATCH[2]}" -lt 11 ]; }; then
    echo "setup: error: $PY is Python $ver; minibroker needs 3.11+ (name one with PYTHON=/path/to/python3.11)" >&2
    return 1
  fi
}

# a working .venv: kept if venv_ok, else (re)made with $PY
make_venv() {
  venv_ok && return 0
  check_python || return 1
  if [ -e .venv ] || [ -L .venv ]; then
    echo "setup: .venv does not work (no pip, or Python older than 3.11); making it again" >&2
    rm -rf .venv
  fi
  if ! "$PY" -m venv .venv || ! venv_ok; then
    rm -rf .venv
    echo "setup: error: '$PY -m venv' did not make a working .venv with pip; on Debian/Ubuntu install" \
      "python3-venv (apt-get install python3-venv), or name another Python 3.11+ with PYTHON=" >&2
    return 1
  fi
}

# what the stamp holds once the dependencies of this pyproject.toml are installed
stamp_text() {
  .venv/bin/python -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest(), sys.argv[2])' \
    pyproject.toml "$EXTRAS"
}

needs_install() {
  [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$(stamp_text)" ]
}

install_deps() {
  needs_install || return 0
  rm -f "$STAMP"
  if ! .venv/bin/python -m pip install -q --upgrade pip || ! .venv/bin/python -m pip install -q -e ".[$EXTRAS]"; then
    echo "setup: error: pip could not install minibroker's dependencies; setup needs network access to PyPI" \
      "(or an index named by PIP_INDEX_URL)" >&2
    return 1
  fi
  stamp_text >"$STAMP"
}

# Java for Spark: apt-get as root when missing; a failure is a warning, not an error
install_java() {
  command -v java >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: warning: no java on PATH; the Spark audit (and its tests) will not run" >&2
    return 0
  fi
  echo "setup: installing a Java runtime for Spark" >&2
  apt-get update -qq || echo "setup: warning: apt-get update failed; trying the package lists there are" >&2
  local pkg
  for pkg in $JAVA_PACKAGES; do
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null && command -v java >/dev/null 2>&1; then
      return 0
    fi
  done
  if [ -n "${CI:-}" ]; then  # CI runs the Spark tests: stop here, with the cause, not at the first Spark test
    echo "setup: error: could not install a Java runtime (tried: $JAVA_PACKAGES); the Spark audit tests need" \
      "one (CI is set)" >&2
    return 1
  fi
  echo "setup: warning: could not install a Java runtime (tried: $JAVA_PACKAGES); the demo does not need" \
    "it, but the Spark audit and its tests do" >&2
  return 0
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  make_venv
  install_deps
  install_java
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi

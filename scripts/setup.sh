#!/usr/bin/env bash
# Creates .venv and installs minibroker with everything the tests and the audit need.
# Idempotent: a second run only checks. Installs Java (for Spark) with apt-get when missing and root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.minibroker-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test,audit]"
  touch "$stamp"
fi
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing a Java runtime for Spark" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "setup: warning: no java on PATH; the Spark audit will not run" >&2
  fi
fi

#!/usr/bin/env bash
# The whole test suite: lint, types, then pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== ruff check"; ruff check .
echo "== mypy"; mypy
echo "== pytest"; pytest "$@"

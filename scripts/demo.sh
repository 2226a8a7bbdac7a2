#!/usr/bin/env bash
# The main job: sets up .venv, then runs the minibroker demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/minibroker demo "$@"

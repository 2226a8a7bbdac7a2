#!/usr/bin/env bash
# Chaos run, then export and the Spark audit. Thin wrapper: the logic lives in cli/chaos.py and audit/.
# Usage: scripts/chaos.sh [DURATION_S] [SEED] [extra `chaos run` options...]
# Env: CHAOS_DIR (cluster data dir, default ./minibroker-chaos), CHAOS_OUT (default ./minibroker-chaos-out),
#      SPARK_MASTER (default local[*]). Exit status: the audit's (0 clean, 1 violations).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-60}
seed=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
data=${CHAOS_DIR:-./minibroker-chaos}
out=${CHAOS_OUT:-./minibroker-chaos-out}
mb=".venv/bin/minibroker"  # the entry point (under `python -m cli.main` a CliError would print a traceback)
$mb chaos run --duration "$duration" --seed "$seed" --data-dir "$data" --out "$out" "$@"
$mb export --data-dir "$data" --history "$out" --out "$out/export"
exec $mb audit "$out/export" --master "${SPARK_MASTER:-local[*]}" --report "$out/audit.json"

#!/usr/bin/env bash
# The whole GPU suite in one device call (docs/gpu.md):
#   run(command="bash bench/gpu/suite.sh", carry=[".gpu/a"], timeout_s=600)
# NW workers (6 on one GPU, 8 on two), BUDGET the seconds the estimate may reach before the
# suite refuses to start, LIMIT the hard stop (under the call's 600 s).
source bench/gpu/setup.sh
NW=${NW:-6} BUDGET=${BUDGET:-530} LIMIT=${LIMIT:-565}
S=$(date +%s)
timeout "$LIMIT" python3 -m pytest -m gpu tests/gpu -n "$NW" --dist loadgroup \
  --gpu-budget-s "$BUDGET" -p no:cacheprovider -q --durations=0 -rfEs ${ARGS:-} 2>&1 \
  | tee "${OUT:-/tmp}/suite.log" | tail -70
echo "suite rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - S )) s"

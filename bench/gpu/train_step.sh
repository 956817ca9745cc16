#!/usr/bin/env bash
# bench/train_step.py at 1.5B on one GPU, the defaults (issue 43's Done-when), then with TRL:
#   run(command="bash bench/gpu/train_step.sh", carry=[".gpu/a"], timeout_s=600)
# STEPS (default 4), TRL=1 adds --trl, EXTRA are overrides after `--`.
source bench/gpu/setup.sh
python3 bench/train_step.py --shape 1.5b --steps "${STEPS:-4}" ${TRL:+--trl} \
  ${EXTRA:+-- $EXTRA} 2>&1 | tee "${OUT:-/tmp}/train_step.log" | grep -v "^\s*$" | tail -60

#!/usr/bin/env bash
# The rollout bench of issue 43's Done-when: a random Qwen2.5-0.5B, 256 episodes x 512 tokens,
# single turn and 4 x 128, best of 2, RUNS runs on one server started with agentrl's own launch
# command (configs/engine/sglang.yaml through fleet.server_command, the running cap included):
#   run(command="bash bench/gpu/rollout.sh", carry=[".gpu/a"], timeout_s=600)
# ARGS: more bench flags (default: the heavy-tailed tool latency, median 100 ms).
source bench/gpu/setup.sh
python3 -c "from agentrl.assets.build import build_random_qwen25 as b; b('/tmp/m05', '0.5b')"
python3 bench/rollout_throughput.py --engine sglang --model /tmp/m05 --episodes "${EPISODES:-256}" \
  --mode both --rounds 2 --runs "${RUNS:-3}" ${ARGS---tool-latency-ms 100} --log-dir /tmp/rlogs \
  2>&1 | tee "${OUT:-/tmp}/rollout.log" | grep -v "^\s*$" | tail -90

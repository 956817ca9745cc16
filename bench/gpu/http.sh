#!/usr/bin/env bash
# SGLang's HTTP front end, side by side: servers started together with agentrl's launch command
# (bench/gpu/serve.py), measured one at a time by the rollout bench (256 x (128 -> 512), best of 2,
# RUNS runs each, MODE single|multi|both):
#   stock   the GPU host's packages as they are (uvicorn; its HTTP parser is h11 unless httptools)
#   httpt   uvicorn with httptools + uvloop on the path (what `uvicorn[standard]` installs)
#   granian SGLang's `--enable-http2` front end (granian, SGLang's `http2` extra)
#   run(command="KIT=.gpu/h bash bench/gpu/http.sh", carry=[".gpu/h"], timeout_s=600)
# KIT holds http.tar.xz (`HTTP=1 bash bench/gpu/kit.sh`). Everything is written to $OUT as it goes.
source bench/gpu/setup.sh
O=${OUT:-/tmp}
pkill -f sglang.launch_server && sleep 5  # a warm machine's servers of a call that ran out of time
export AGENTRL_ENGINE_API_KEY=bench-$RANDOM$RANDOM
python3 -c 'import importlib.util as u; print("GPU host, without the kit:", {m: bool(u.find_spec(m)) for m in ("uvloop", "httptools", "granian")})' | tee "$O/http.log"
python3 -c "from agentrl.assets.build import build_random_qwen25 as b; b('/tmp/m05', '0.5b')"
VARIANTS=${VARIANTS:-stock httpt granian}
declare -A PORT=([stock]=31001 [httpt]=31002 [granian]=31003) EXTRA=([granian]=--enable-http2) PID STATE
for v in $VARIANTS; do
  path=$PYTHONPATH; [ "$v" != stock ] && path=/tmp/site-http:$PYTHONPATH
  PYTHONPATH=$path python3 bench/gpu/serve.py /tmp/m05 "${PORT[$v]}" --mem-fraction-static 0.3 \
    ${EXTRA[$v]:-} > "$O/server-$v.log" 2>&1 &
  PID[$v]=$!
done
for i in $(seq "${START_S:-300}"); do
  waiting=0
  for v in $VARIANTS; do
    [ -n "${STATE[$v]:-}" ] && continue
    if curl -sf "http://127.0.0.1:${PORT[$v]}/health" >/dev/null; then STATE[$v]=up
    elif ! kill -0 "${PID[$v]}" 2>/dev/null; then STATE[$v]=died
    else waiting=1; continue; fi
    echo "$v ${STATE[$v]} after ${SECONDS}s" | tee -a "$O/http.log"
  done
  [ $waiting = 0 ] && break
  sleep 1
done
for v in $VARIANTS; do
  [ "${STATE[$v]:-}" = up ] || continue
  echo "=== $v ($(grep -ohE 'Uvicorn running|Granian|HTTP/2' "$O/server-$v.log" | sort -u | tr '\n' ' '))" | tee -a "$O/http.log"
  timeout "${BENCH_S:-170}" python3 bench/rollout_throughput.py --url "http://127.0.0.1:${PORT[$v]}" \
    --model /tmp/m05 --mode "${MODE:-multi}" --rounds 2 --runs "${RUNS:-2}" ${ARGS:-} 2>&1 \
    | grep --line-buffered -vE "^\s*$|prefix cache|episodes in flight" | tee -a "$O/http.log"
done
pkill -f sglang.launch_server; sleep 2
for v in $VARIANTS; do tail -c 20000 "$O/server-$v.log" > "$O/server-$v.tail" && rm "$O/server-$v.log"; done

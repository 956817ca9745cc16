# Sourced at the start of every GPU-machine script here: unpack the carried kit ($KIT, default
# .gpu/a, built by bench/gpu/kit.sh) into /tmp/site once per warm machine, then put SGLang's environment and this
# checkout on the path.
KIT=${KIT:-.gpu/a}
if [ ! -e /tmp/site/.kit-ready ]; then
  mkdir -p /tmp/site /tmp/site-http
  for p in part1 ray extras whl; do [ -e "$KIT/$p.tar.xz" ] && tar -xJf "$KIT/$p.tar.xz" -C /tmp/site; done
  # SGLang's faster HTTP front ends (uvloop, httptools, granian): a tree of their own, put on the
  # path only of the servers that are to use them
  [ -e "$KIT/http.tar.xz" ] && tar -xJf "$KIT/http.tar.xz" -C /tmp/site-http
  touch /tmp/site/.kit-ready
fi
source /tmp/site/sgl_env.sh
export PYTHONPATH="$PWD:$PWD/tests:$PYTHONPATH" RAY_ADDRESS= HF_HUB_OFFLINE=1 WANDB_MODE=offline
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

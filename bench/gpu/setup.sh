# Sourced at the start of every GPU-machine script here: unpack the carried kit (.gpu/a, built by
# bench/gpu/kit.sh) into /tmp/site once per warm machine, then put SGLang's environment and this
# checkout on the path.
if [ ! -e /tmp/site/.kit-ready ]; then
  mkdir -p /tmp/site
  for p in part1 ray extras whl; do tar -xJf ".gpu/a/$p.tar.xz" -C /tmp/site; done
  touch /tmp/site/.kit-ready
fi
source /tmp/site/sgl_env.sh
export PYTHONPATH="$PWD:$PWD/tests:$PYTHONPATH" RAY_ADDRESS= HF_HUB_OFFLINE=1 WANDB_MODE=offline
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

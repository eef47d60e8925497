#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# vLLM 0.26.0 startups on a borrowed GPU machine (CUDA PyTorch 2.11, no vLLM, no network) for the KV-cache planner's
# calibration (issue #22): real models' config.json (benchmarks/gpu_compare/model-configs) with --load-format dummy,
# which allocates what real weights do. Each server is stopped as soon as vLLM has logged its KV pool ("Available KV
# cache memory", "GPU KV cache size") and its own memory split ("Actual usage is ... for weight, ... peak activation,
# ... non-torch memory, and ... CUDAGraph memory", logged after graph capture): 55-145 s a startup on the H200
# (2026-12-01: eager ~55 s, compiled ~75 s with a warm torch.compile cache, ~100 s cold, the MoE model 143 s).
# From the repository root, after benchmarks/gpu_compare/pack.sh (one device call each):
#   bash benchmarks/gpu_compare/kv_startups.sh stage1      # carry .device/gpu-compare-1a, then again -1b: vLLM's kernels
#   bash benchmarks/gpu_compare/kv_startups.sh stage3      # carry .device/gpu-compare-3: vLLM's MoE kernels -> $STAGE
#   bash benchmarks/gpu_compare/kv_startups.sh run ID...   # carry .device/gpu-compare-2 (first run call only): unpack
#                                                          # the site, then the listed startups in order (all: every ID)
#   bash benchmarks/gpu_compare/kv_startups.sh list        # the run table
# The compiled family set (gemma 3 sliding window, block-FP8 MoE, Granite 4.0-H Mamba2, Qwen3-Next gated delta net,
# Qwen3-VL MoE, Qwen3 dense; 2 utilizations x 2 lengths each, cut to few layers, two near misses of the fit check and
# a load of a pinned pool), about 30 min of one H100 or H200 in four calls back to back (a machine idle 30 s goes back):
#   stage1 (carry gpu-compare-1a), stage1 (carry gpu-compare-1b); stage3 (carry gpu-compare-3);
#   BUDGET_S=560 ... run g3-27bL12-u090-32k ... q30moeL8-* ghtinyL10-*      (carry gpu-compare-2)
#   BUDGET_S=560 LOAD=g3-27bL12-u090-32k:32 ... run q3nextL8-* qvl30bL8-* q8bL8-*
# then: .venv/bin/python benchmarks/gpu_compare/parse_kv_startups.py DATA_DIR > DATA_DIR/runs.yaml.
# BUDGET_S (default 540): no startup begins unless its estimate fits in what is left of it. Results: $OUT/kv-logs.tar.xz
# (rewritten after every startup, so a call cut short still returns what ran): <id>.log per run, whose first lines are
# the exact command and environment, and runs.tsv (id, how it ended, seconds, exit status).
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${STAGE:-/root/kv-startups}
OUT=${OUT:-$PWD/kv-startups-out}
BUDGET_S=${BUDGET_S:-540}
RUN_LIMIT_S=${RUN_LIMIT_S:-240}   # one startup at most (then it is stopped and its log kept)
CONFIGS=benchmarks/gpu_compare/model-configs
T0=$(date +%s)

# Compiled family startups (2026-12-05): the *-L<N> model-configs are the published configs with fewer layers
# (cut_layers.py), so a compiled startup takes about a minute; a utilization written B<GiB> is the one whose budget
# (utilization x the device total that torch reports) is that many GiB, rounded to 0.001, so a run sits at the same
# distance from vLLM's fit check on any GPU.
# Cold and warm pairs (cw-*): each pair has its own vLLM and Inductor caches, so its first startup compiles from
# nothing and its second loads what the first stored; the difference of their profiles is what a cold torch.compile
# adds to the first start of a new deployment, at two or three max_num_batched_tokens, two max_num_seqs and for three widths of model.
# id | model-configs dir | gpu_memory_utilization | max_model_len | further flags | estimated seconds (as measured,
# rounded up; rows not run yet: a guess)
# [| environment: VAR=value ..., e.g. VLLM_USE_V2_MODEL_RUNNER=0 for the runner that profiles a vision encoder]
RUNS='
q30moe-fp8-u090-32k|Qwen3-30B-A3B-FP8|0.9|32768||150
q8b-u090-32k|Qwen3-8B|0.9|32768||105
q8b-u090-32k-eager|Qwen3-8B|0.9|32768|--enforce-eager|60
q8b-u050-32k|Qwen3-8B|0.5|32768||75
q8b-u050-32k-eager|Qwen3-8B|0.5|32768|--enforce-eager|60
q06b-u030-32k|Qwen3-0.6B|0.3|32768||85
q32b-u090-40k|Qwen3-32B|0.9|40960||95
q8b-u090-32k-fp8kv|Qwen3-8B|0.9|32768|--kv-cache-dtype fp8|100
qwen25-7b-u090-32k|Qwen2.5-7B-Instruct|0.9|32768||95
mistral-7b-u090-32k|Mistral-7B-Instruct-v0.3|0.9|32768||100
qwen25-7b-awq-u090-32k|Qwen2.5-7B-Instruct-AWQ|0.9|32768||90
q30moe-fp8-u090-32k-eager|Qwen3-30B-A3B-FP8|0.9|32768|--enforce-eager|90
q06b-u090-32k-eager|Qwen3-0.6B|0.9|32768|--enforce-eager|55
q8b-u090-32k-mnbt16k|Qwen3-8B|0.9|32768|--max-num-batched-tokens 16384|105
q8b-u090-32k-seqs256|Qwen3-8B|0.9|32768|--max-num-seqs 256|105
q32b-u095-40k-eager|Qwen3-32B|0.95|40960|--enforce-eager|65
q8b-kvb100g-32k-eager|Qwen3-8B|0.9|32768|--enforce-eager --kv-cache-memory-bytes 107374182400|60
q8b-u030-kvb60g-32k-eager|Qwen3-8B|0.3|32768|--enforce-eager --kv-cache-memory-bytes 64424509440|60
q8b-kvb130g-32k-eager|Qwen3-8B|0.9|32768|--enforce-eager --kv-cache-memory-bytes 139586437120|60
q30moe-fp8-kvb80g-32k-eager|Qwen3-30B-A3B-FP8|0.9|32768|--enforce-eager --kv-cache-memory-bytes 85899345920|90
g3-1b-u090-32k-eager|gemma-3-1b-it|0.9|32768|--enforce-eager|95
g3-1b-u050-8k-eager|gemma-3-1b-it|0.5|8192|--enforce-eager|60
g3-27b-u090-32k-eager|gemma-3-27b-it-text|0.9|32768|--enforce-eager|75
g3-27b-u090-128k-eager|gemma-3-27b-it-text|0.9|131072|--enforce-eager|75
g3-1b-u090-32k|gemma-3-1b-it|0.9|32768||100
qvl8b-u090-32k-eager|Qwen3-VL-8B-Instruct|0.9|32768|--enforce-eager|80
qvl8b-u090-32k-novideo-eager|Qwen3-VL-8B-Instruct|0.9|32768|--enforce-eager --limit-mm-per-prompt {"video":0}|90
qvl8b-u090-32k-textonly-eager|Qwen3-VL-8B-Instruct|0.9|32768|--enforce-eager --limit-mm-per-prompt {"image":0,"video":0}|55
qvl8b-u050-16k-eager|Qwen3-VL-8B-Instruct|0.5|16384|--enforce-eager|90
qvl8b-u090-32k|Qwen3-VL-8B-Instruct|0.9|32768||130
qvl8b-u090-32k-v1-eager|Qwen3-VL-8B-Instruct|0.9|32768|--enforce-eager|75|VLLM_USE_V2_MODEL_RUNNER=0
qvl8b-u090-32k-v1-imageonly-eager|Qwen3-VL-8B-Instruct|0.9|32768|--enforce-eager --limit-mm-per-prompt {"video":0}|100|VLLM_USE_V2_MODEL_RUNNER=0
qvl8b-u090-32k-v1-videoonly-eager|Qwen3-VL-8B-Instruct|0.9|32768|--enforce-eager --limit-mm-per-prompt {"image":0}|55|VLLM_USE_V2_MODEL_RUNNER=0
qvl30b-u090-32k-eager|Qwen3-VL-30B-A3B-Instruct|0.9|32768|--enforce-eager|75
qvl30b-u090-32k-textonly-eager|Qwen3-VL-30B-A3B-Instruct|0.9|32768|--enforce-eager --limit-mm-per-prompt {"image":0,"video":0}|45
g3-1b-u090-32k-mnbt2k-eager|gemma-3-1b-it|0.9|32768|--enforce-eager --max-num-batched-tokens 2048|55
gh-tiny-u090-32k-eager|granite-4.0-h-tiny|0.9|32768|--enforce-eager|55
gh-tiny-u050-128k-eager|granite-4.0-h-tiny|0.5|131072|--enforce-eager|50
gh-micro-u090-32k-eager|granite-4.0-h-micro|0.9|32768|--enforce-eager|160
q3next-fp8-u090-32k-eager|Qwen3-Next-80B-A3B-Instruct-FP8|0.9|32768|--enforce-eager|85
nemoh-8b-u090-8k-eager|Nemotron-H-8B-Base-8K|0.9|8192|--enforce-eager|130
gptoss-20b-u090-32k-eager|gpt-oss-20b|0.9|32768|--enforce-eager|80
g3-27bL12-u090-32k|gemma-3-27b-it-text-L12|0.9|32768||110
g3-27bL12-u050-32k|gemma-3-27b-it-text-L12|0.5|32768||60
g3-27bL12-u090-128k|gemma-3-27b-it-text-L12|0.9|131072||90
g3-27bL12-u050-128k|gemma-3-27b-it-text-L12|0.5|131072||60
g3-27bL12-b170-128k|gemma-3-27b-it-text-L12|B17.0|131072||60
g3-27bL12-b173-128k|gemma-3-27b-it-text-L12|B17.3|131072||60
q30moeL8-u090-8k|Qwen3-30B-A3B-FP8-L8|0.9|8192||110
q30moeL8-u050-8k|Qwen3-30B-A3B-FP8-L8|0.5|8192||60
q30moeL8-u090-40k|Qwen3-30B-A3B-FP8-L8|0.9|40960||90
q30moeL8-u050-40k|Qwen3-30B-A3B-FP8-L8|0.5|40960||60
ghtinyL10-u090-32k|granite-4.0-h-tiny-L10|0.9|32768||120
ghtinyL10-u050-32k|granite-4.0-h-tiny-L10|0.5|32768||60
ghtinyL10-u090-128k|granite-4.0-h-tiny-L10|0.9|131072||90
ghtinyL10-u050-128k|granite-4.0-h-tiny-L10|0.5|131072||60
q3nextL8-u090-32k|Qwen3-Next-80B-A3B-Instruct-FP8-L8|0.9|32768||120
q3nextL8-u050-32k|Qwen3-Next-80B-A3B-Instruct-FP8-L8|0.5|32768||60
q3nextL8-u090-256k|Qwen3-Next-80B-A3B-Instruct-FP8-L8|0.9|262144||90
q3nextL8-u050-256k|Qwen3-Next-80B-A3B-Instruct-FP8-L8|0.5|262144||60
q3nextL8-u050-256k-triton|Qwen3-Next-80B-A3B-Instruct-FP8-L8|0.5|262144|--additional-config {"gdn_prefill_backend":"triton"}|110
qvl30bL8-u090-32k|Qwen3-VL-30B-A3B-Instruct-L8|0.9|32768||110
qvl30bL8-u050-32k|Qwen3-VL-30B-A3B-Instruct-L8|0.5|32768||60
qvl30bL8-u090-256k|Qwen3-VL-30B-A3B-Instruct-L8|0.9|262144||90
qvl30bL8-u050-256k|Qwen3-VL-30B-A3B-Instruct-L8|0.5|262144||60
q8bL8-u090-8k|Qwen3-8B-L8|0.9|8192||90
q8bL8-u050-8k|Qwen3-8B-L8|0.5|8192||50
q8bL8-u090-40k|Qwen3-8B-L8|0.9|40960||70
q8bL8-u050-40k|Qwen3-8B-L8|0.5|40960||50
cw-g3-27bL12-cold|gemma-3-27b-it-text-L12|0.9|32768||110|VLLM_CACHE_ROOT=/root/kvc/g27 TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27/inductor
cw-g3-27bL12-warm|gemma-3-27b-it-text-L12|0.9|32768||70|VLLM_CACHE_ROOT=/root/kvc/g27 TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27/inductor
cw-g3-27bL12-mnbt4k-cold|gemma-3-27b-it-text-L12|0.9|32768|--max-num-batched-tokens 4096|110|VLLM_CACHE_ROOT=/root/kvc/g27-4k TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27-4k/inductor
cw-g3-27bL12-mnbt4k-warm|gemma-3-27b-it-text-L12|0.9|32768|--max-num-batched-tokens 4096|70|VLLM_CACHE_ROOT=/root/kvc/g27-4k TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27-4k/inductor
cw-g3-27bL12-mnbt16k-cold|gemma-3-27b-it-text-L12|0.9|32768|--max-num-batched-tokens 16384|110|VLLM_CACHE_ROOT=/root/kvc/g27-16k TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27-16k/inductor
cw-g3-27bL12-mnbt16k-warm|gemma-3-27b-it-text-L12|0.9|32768|--max-num-batched-tokens 16384|70|VLLM_CACHE_ROOT=/root/kvc/g27-16k TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27-16k/inductor
cw-g3-27bL12-seqs256-cold|gemma-3-27b-it-text-L12|0.9|32768|--max-num-seqs 256|110|VLLM_CACHE_ROOT=/root/kvc/g27-s256 TORCHINDUCTOR_CACHE_DIR=/root/kvc/g27-s256/inductor
cw-g3-1b-cold|gemma-3-1b-it|0.9|32768||100|VLLM_CACHE_ROOT=/root/kvc/g1b TORCHINDUCTOR_CACHE_DIR=/root/kvc/g1b/inductor
cw-g3-1b-warm|gemma-3-1b-it|0.9|32768||60|VLLM_CACHE_ROOT=/root/kvc/g1b TORCHINDUCTOR_CACHE_DIR=/root/kvc/g1b/inductor
cw-q8bL8-cold|Qwen3-8B-L8|0.9|8192||90|VLLM_CACHE_ROOT=/root/kvc/q8 TORCHINDUCTOR_CACHE_DIR=/root/kvc/q8/inductor
cw-q8bL8-warm|Qwen3-8B-L8|0.9|8192||60|VLLM_CACHE_ROOT=/root/kvc/q8 TORCHINDUCTOR_CACHE_DIR=/root/kvc/q8/inductor
cw-q8bL8-mnbt16k-cold|Qwen3-8B-L8|0.9|8192|--max-num-batched-tokens 16384|90|VLLM_CACHE_ROOT=/root/kvc/q8-16k TORCHINDUCTOR_CACHE_DIR=/root/kvc/q8-16k/inductor
cw-q8bL8-mnbt16k-warm|Qwen3-8B-L8|0.9|8192|--max-num-batched-tokens 16384|60|VLLM_CACHE_ROOT=/root/kvc/q8-16k TORCHINDUCTOR_CACHE_DIR=/root/kvc/q8-16k/inductor
'

row() { printf '%s\n' "$RUNS" | awk -F'|' -v id="$1" '$1 == id'; }

unxz_to() {  # Python's lzma: the GPU image need not have xz
  python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$1" "$2"
}

case "${1:-}" in
  list) printf '%s\n' "$RUNS" | sed '/^$/d'; exit 0 ;;
  stage1)
    mkdir -p "$STAGE/kernels" "$STAGE/parts"
    # The kernels in one call (.device/gpu-compare-1), or, where the working tree and they pass the device tool's
    # 64 MiB together, in parts over two calls (.device/gpu-compare-1a, -1b: pack.sh's part-K-of-N files).
    xz_file=.device/gpu-compare-1/_C_stable_libtorch.abi3.so.xz
    if [ ! -f "$xz_file" ]; then
      cp .device/gpu-compare-1*/_C_stable_libtorch.abi3.so.xz.part-* "$STAGE/parts/"
      parts=("$STAGE"/parts/_C_stable_libtorch.abi3.so.xz.part-*)
      total=${parts[0]##*-of-}
      if [ "${#parts[@]}" -lt "$total" ]; then echo "stage1: ${#parts[@]} of $total parts here; carry the next"; exit 0; fi
      cat "${parts[@]}" > "$STAGE/parts/_C_stable_libtorch.abi3.so.xz"
      xz_file="$STAGE/parts/_C_stable_libtorch.abi3.so.xz"
    fi
    unxz_to "$xz_file" "$STAGE/kernels/_C_stable_libtorch.abi3.so"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
    ls -la "$STAGE/kernels"; exit 0 ;;
  stage3)
    mkdir -p "$STAGE/kernels"
    unxz_to .device/gpu-compare-3/_moe_C_stable_libtorch.abi3.so.xz "$STAGE/kernels/_moe_C_stable_libtorch.abi3.so"
    ls -la "$STAGE/kernels"; exit 0 ;;
  run) shift ;;
  *) sed -n '2,26p' "$0"; exit 2 ;;
esac
mkdir -p "$STAGE" "$OUT"

SITE="$STAGE/site"
if [ ! -f "$SITE/vllm/_C_stable_libtorch.abi3.so" ]; then
  rm -rf "$SITE" && mkdir -p "$SITE"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
    .device/gpu-compare-2/site.tar.xz "$SITE"
  mkdir -p "$STAGE/tokenizer"
  if [ -f .device/gpu-compare-2/tokenizer/tokenizer.json ]; then
    cp .device/gpu-compare-2/tokenizer/tokenizer.json .device/gpu-compare-2/tokenizer/tokenizer_config.json \
      "$STAGE/tokenizer/"
  else  # a pack built without the lab: the stand-in tokenizer (memory follows config.json's vocabulary)
    python3 benchmarks/gpu_compare/make_tokenizer.py "$STAGE/tokenizer"
  fi
  for so in _C_stable_libtorch.abi3.so _moe_C_stable_libtorch.abi3.so; do
    [ -f "$STAGE/kernels/$so" ] && cp "$STAGE/kernels/$so" "$SITE/vllm/$so"
  done
  echo "site unpacked in $(( $(date +%s) - T0 )) s"
fi
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
# Set on every lent GPU machine; keep them set for any program started here (the device tool's KINDS.md says why).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# FlashInfer is not in the pack: vLLM then samples top-k/top-p with PyTorch. No network: never ask the hub.
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# DEBUG adds vLLM's own profile lines before the KV line (free memory at start, torch peak, non-torch increase).
export VLLM_LOGGING_LEVEL=DEBUG
LOGS="$STAGE/logs"
mkdir -p "$LOGS"
[ -f "$LOGS/runs.tsv" ] || printf 'id\tended\tseconds\texit\n' > "$LOGS/runs.tsv"

pack_logs() {
  python3 -c 'import os, sys, tarfile
with tarfile.open(sys.argv[2], "w:xz") as tar:
    for name in sorted(os.listdir(sys.argv[1])):
        tar.add(os.path.join(sys.argv[1], name), arcname=name)' "$LOGS" "$OUT/kv-logs.tar.xz"
}

gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -dc '0-9'; }

wait_gpu_free() {
  for _ in $(seq 1 60); do
    [ "$(gpu_used_mib)" -lt 1024 ] && return 0
    sleep 0.5
  done
  echo "GPU memory still in use: $(gpu_used_mib) MiB"
}

stop_server() {  # the server and its engine process share one process group (set -m)
  kill -TERM -- "-$1" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 -- "-$1" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL -- "-$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

python3 -c 'import vllm, vllm._C_stable_libtorch; print("vllm", vllm.__version__)'
[ "${1:-}" = all ] && set -- $(printf '%s\n' "$RUNS" | awk -F'|' 'NF > 1 {print $1}')
set -m
for id in "$@"; do
  spec=$(row "$id")
  [ -n "$spec" ] || { echo "unknown run $id"; continue; }
  IFS='|' read -r _ model util max_len flags estimate run_env <<< "$spec"
  left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ "$left" -lt "$estimate" ]; then
    echo "skip $id: ${left}s left of BUDGET_S, estimate ${estimate}s"
    printf '%s\tskipped\t0\t-\n' "$id" >> "$LOGS/runs.tsv"
    continue
  fi
  if [ "${util#B}" != "$util" ]; then
    util=$(python3 -c 'import sys, torch; print(round(float(sys.argv[1]) * 2**30 / torch.cuda.mem_get_info()[1], 3))' "${util#B}")
  fi
  dir="$STAGE/models/$model"
  mkdir -p "$dir"
  # config.json and any processor files (a vision model's preprocessor_config.json ...)
  cp "$CONFIGS/$model"/*.json "$dir/"
  if [ -f "$CONFIGS/$model/QWEN_TOKEN_LAYOUT" ]; then
    # a vision model's profiling needs its placeholder tokens at the config's ids: a constructed stand-in
    [ -f "$dir/tokenizer.json" ] || python3 benchmarks/gpu_compare/make_tokenizer.py "$dir"
  else
    cp "$STAGE/tokenizer/tokenizer.json" "$STAGE/tokenizer/tokenizer_config.json" "$dir/"
  fi
  # shellcheck disable=SC2206
  cmd=(python3 -m vllm.entrypoints.openai.api_server --model "$dir" --served-model-name "$model" --port 8000
       --load-format dummy --gpu-memory-utilization "$util" --max-model-len "$max_len" $flags)
  log="$LOGS/$id.log"
  {
    echo "# run: $id (model config: $CONFIGS/$model/config.json, dummy weights)"
    echo "# command: ${run_env:+$run_env }${cmd[*]}"
    echo "# env: PYTHONPATH=$PYTHONPATH VLLM_LOGGING_LEVEL=$VLLM_LOGGING_LEVEL VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
    echo "# gpu before: $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader)"
    echo "# started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } > "$log"
  start=$(date +%s)
  # shellcheck disable=SC2086
  env $run_env "${cmd[@]}" >> "$log" 2>&1 &
  pid=$!
  ended=timeout
  kv_at=0
  while :; do
    if grep -q "Actual usage is" "$log"; then ended=logged; break; fi
    kill -0 "$pid" 2>/dev/null || { ended=exited; break; }
    now=$(date +%s)
    if [ "$kv_at" = 0 ] && grep -q "GPU KV cache size" "$log"; then kv_at=$now; fi
    # KV lines but no memory split within 90 s (graph capture stuck): keep what is there
    if [ "$kv_at" != 0 ] && [ $(( now - kv_at )) -gt 90 ]; then ended=kv-only; break; fi
    [ $(( now - start )) -gt "$RUN_LIMIT_S" ] && break
    [ $(( BUDGET_S - (now - T0) )) -lt 5 ] && { ended=budget; break; }
    sleep 0.5
  done
  sleep 0.5
  status=-
  if [ "$ended" = exited ]; then wait "$pid" && status=0 || status=$?; else stop_server "$pid"; fi
  seconds=$(( $(date +%s) - start ))
  echo "# ended: $ended after ${seconds}s (exit status $status) $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$log"
  printf '%s\t%s\t%s\t%s\n' "$id" "$ended" "$seconds" "$status" >> "$LOGS/runs.tsv"
  echo "$id: $ended after ${seconds}s"
  grep -E "Model loading took|Available KV cache memory|GPU KV cache size|Maximum concurrency|Actual usage is|Error|error:" \
    "$log" | cut -c1-400 | head -12 || true
  wait_gpu_free
  pack_logs
done
# LOAD="ID:SEQS ..." (after the startups, each if LOAD_ESTIMATE_S fits in what is left of BUDGET_S): the row ID again, its KV
# pool pinned with --kv-cache-memory-bytes at what its own startup above logged as available plus 0.5 % of its budget
# (the most a plan within the planner's stated error could pin before its margin), --max-num-seqs SEQS, then SEQS
# requests at once of max_model_len - 32 prompt tokens (kv_load.py); the log (load-ID.log) keeps the server's output,
# the client's report and the GPU's memory every second.
for load in ${LOAD:-}; do
  id=${load%%:*}; seqs=${load##*:}
  IFS='|' read -r _ model util max_len flags estimate run_env <<< "$(row "$id")"
  left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ "$left" -lt "${LOAD_ESTIMATE_S:-150}" ]; then
    echo "skip load of $id: ${left}s left of BUDGET_S"
  else
    pool=$(python3 -c 'import re, sys
text = open(sys.argv[1]).read()
avail = float(re.findall(r"Available KV cache memory: ([\d.]+) GiB", text)[-1])
budget = float(re.findall(r"Requested memory: [\d.]+ \(util\), ([\d.]+) GiB", text)[-1])
print(int((avail + 0.005 * budget) * 2**30))' "$LOGS/$id.log")
    vocab=$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("text_config", c)["vocab_size"])' \
      "$CONFIGS/$model/config.json")
    dir="$STAGE/models/$model"
    # shellcheck disable=SC2206
    cmd=(python3 -m vllm.entrypoints.openai.api_server --model "$dir" --served-model-name "$model" --port 8000
         --load-format dummy --max-model-len "$max_len" --kv-cache-memory-bytes "$pool" --max-num-seqs "$seqs" $flags)
    log="$LOGS/load-$id.log"
    {
      echo "# load: $id, pool = available logged in $id.log + 0.5 % of its budget = $pool bytes, $seqs requests"
      echo "# command: ${run_env:+$run_env }${cmd[*]}"
      echo "# client: python3 benchmarks/gpu_compare/kv_load.py http://127.0.0.1:8000 $model $seqs $(( max_len - 32 )) $vocab 16"
      echo "# gpu before: $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader)"
    } > "$log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    env $run_env "${cmd[@]}" >> "$log" 2>&1 &
    pid=$!
    ready=no
    while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - start )) -lt "$RUN_LIMIT_S" ]; do
      if python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8000/v1/models", timeout=2)' 2>/dev/null; then
        ready=yes; break
      fi
      sleep 1
    done
    echo "# ready: $ready after $(( $(date +%s) - start ))s" >> "$log"
    if [ "$ready" = yes ]; then
      nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 1 > "$LOGS/load-$id.gpu.csv" &
      smi=$!
      timeout $(( BUDGET_S - ($(date +%s) - T0) - 10 )) python3 benchmarks/gpu_compare/kv_load.py \
        http://127.0.0.1:8000 "$model" "$seqs" $(( max_len - 32 )) "$vocab" 16 > "$LOGS/load-$id.client" 2>&1 \
        && client=0 || client=$?
      kill "$smi" 2>/dev/null || true
      { echo "# client exit status $client:"; sed 's/^/# /' "$LOGS/load-$id.client";
        echo "# gpu memory used, MiB (max over the load): $(cut -d, -f2 "$LOGS/load-$id.gpu.csv" | tr -dc '0-9\n' | sort -n | tail -1)";
        echo "# server alive after the load: $(kill -0 "$pid" 2>/dev/null && echo yes || echo no)"; } >> "$log"
      rm -f "$LOGS/load-$id.client"
    fi
    stop_server "$pid"
    grep -E "out of memory|OutOfMemory|CUDA error|Traceback" "$log" | head -5 || true
    tail -8 "$log"
    printf 'load-%s\t%s\t%s\t-\n' "$id" "$ready" "$(( $(date +%s) - start ))" >> "$LOGS/runs.tsv"
    wait_gpu_free
    pack_logs
  fi
done
set +m
pack_logs
cat "$LOGS/runs.tsv"
echo "total $(( $(date +%s) - T0 )) s"

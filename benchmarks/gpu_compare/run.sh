#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# On a borrowed GPU machine (CUDA PyTorch 2.11, no vLLM, no network), from the repository root:
#   bash benchmarks/gpu_compare/run.sh stage   # calls 1 and 2, carrying .device/gpu-compare-1a, then -1b: vLLM's kernels
#   bash benchmarks/gpu_compare/run.sh         # call 3, carrying .device/gpu-compare-2: the comparison
#   bash benchmarks/gpu_compare/run.sh known-answers   # or, in call 3: the flags and the known-answer tolerance
#   bash benchmarks/gpu_compare/run.sh usage-cost      # or, in call 3: what token accounting costs a server
# Installs the pack (pack.sh), writes a Qwen3-shaped checkpoint (MODEL_SHAPE), starts vLLM's OpenAI server on CPUs 2-15, runs
# benchmarks/compare_vllm_bench.py in local mode with both clients on CPUs 0-1 (further arguments go to it; the lab's
# validated load: --output-len-range-ratio 0.5 --distinct-prompts --prompt-repeat 20). Results: $OUT
# (or ./gpu-compare-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${STAGE:-/root/gpu-compare}
OUT=${OUT:-$PWD/gpu-compare-out}
mkdir -p "$STAGE" "$OUT"
if [ "${1:-}" = stage ]; then
  # pack.sh's two parts (each call carries one; the second call joins them)
  cp .device/gpu-compare-1*/_C_stable_libtorch.abi3.so.xz.part-* "$STAGE/"
  parts=("$STAGE"/_C_stable_libtorch.abi3.so.xz.part-*)
  if [ "${#parts[@]}" -lt "${parts[0]##*-of-}" ]; then echo "stage: ${#parts[@]} part(s) here; carry the next"; exit 0; fi
  cat "${parts[@]}" > "$STAGE/_C_stable_libtorch.abi3.so.xz"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  exit 0
fi
SITE="$STAGE/site"
if [ ! -f "$SITE/vllm/_C_stable_libtorch.abi3.so" ]; then
  rm -rf "$SITE" && mkdir -p "$SITE"
  # Python's tarfile and lzma: the GPU image need not have xz.
  python3 -c 'import lzma, shutil, sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")
with lzma.open(sys.argv[3]) as src, open(sys.argv[2] + "/vllm/_C_stable_libtorch.abi3.so", "wb") as dst:
    shutil.copyfileobj(src, dst)' .device/gpu-compare-2/site.tar.xz "$SITE" "$STAGE/_C_stable_libtorch.abi3.so.xz"
fi
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
# Set on every lent GPU machine; keep them set for any program started here (the device tool's KINDS.md says why).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# FlashInfer is not in the pack: vLLM then samples top-k/top-p with PyTorch.
export VLLM_USE_FLASHINFER_SAMPLER=0
python3 -c 'import vllm, vllm._C_stable_libtorch; print("vllm", vllm.__version__)'
# MODEL_SHAPE=8b: steps of tens of milliseconds, where neither client's own lag nor step jitter weighs much.
MODEL_SHAPE=${MODEL_SHAPE:-0.6b}
MODEL="$STAGE/qwen3-$MODEL_SHAPE-shape"
[ -f "$MODEL/config.json" ] ||
  python3 benchmarks/gpu_compare/make_model.py .device/gpu-compare-2/tokenizer "$MODEL" "$MODEL_SHAPE"
# usage-cost: instead of one server, two side by side, without and with token accounting (usage_cost.py), the client
# on CPUs 0-1.
if [ "${1:-}" = usage-cost ]; then
  exec taskset -c 0-1 python3 benchmarks/gpu_compare/usage_cost.py --model "$MODEL" --out "$OUT"
fi
OPENAI_API_KEY=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
export OPENAI_API_KEY
# The key reaches the server through VLLM_API_KEY, never on a command line.
VLLM_API_KEY=$OPENAI_API_KEY taskset -c 2-15 python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name qwen3-gpu --port 8000 --max-model-len 4096 --gpu-memory-utilization 0.5 \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
healthy() {
  python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2)' 2>/dev/null
}
for _ in $(seq 1 300); do
  healthy && break
  kill -0 $SERVER 2>/dev/null || { tail -60 "$OUT/server.log"; exit 1; }
  sleep 1
done
healthy || { tail -60 "$OUT/server.log"; exit 1; }
grep -E "Available KV cache memory|GPU KV cache size|Maximum concurrency|Graph capturing finished|init engine" \
  "$OUT/server.log" || true
set +e
# known-answers: instead of the speed comparison, vLLM's own `vllm serve --help=all` (the flags of this release, a
# fixture) and the known-answer gate's tolerance measured on this GPU (benchmarks/known_answers_variance.py).
if [ "${1:-}" = known-answers ]; then
  python3 -c 'import sys; from vllm.entrypoints.cli.main import main; sys.argv = ["vllm", "serve", "--help=all"]; main()' \
    > "$OUT/vllm-$(python3 -c 'import vllm; print(vllm.__version__)')-serve-help-all.txt" 2>&1
  python3 benchmarks/known_answers_variance.py --url http://127.0.0.1:8000 --model qwen3-gpu \
    --clients "${CLIENTS:-16}" --rounds "${ROUNDS:-5}" --out "$OUT/known-answers-variance.json"
  exit $?
fi
python3 benchmarks/compare_vllm_bench.py --base-url http://127.0.0.1:8000 --model "$MODEL" \
  --served-model-name qwen3-gpu --vllm-python python3 --client-cpus 0-1 --waves "${WAVES:-8}" \
  --rounds "${ROUNDS:-3}" --concurrency "${CONCURRENCY:-1,4,8,16,32}" --json "$OUT/compare.json" "$@" \
  2>&1 | tee "$OUT/compare.txt"
status=${PIPESTATUS[0]}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv >> "$OUT/compare.txt"
exit "$status"

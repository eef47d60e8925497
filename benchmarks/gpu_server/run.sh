#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The vllm_server role's own server on a lent GPU machine (README.md beside this file). From the repository root:
#   here:   bash benchmarks/gpu_compare/pack.sh          # vLLM 0.26.0's pack, as for the KV startups
#           bash benchmarks/gpu_server/run.sh pack       # ansible-core's wheels -> .device/gpu-server
#   there:  bash benchmarks/gpu_compare/kv_startups.sh stage1                 (carry .device/gpu-compare-1a, again -1b)
#           bash benchmarks/gpu_server/run.sh           (carry .device/gpu-compare-2 and .device/gpu-server)
# Results in $OUT: report.json (the plan, the command, every check's result), spec.json (the rendered container
# spec), server.log (the server's output), play.log (the playbook's).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = pack ]; then
  rm -rf .device/gpu-server && mkdir -p .device/gpu-server
  # The controller's own ansible-core and resolvelib (jinja2, PyYAML and packaging are the GPU image's; cryptography
  # is in vLLM's pack).
  read -r -a PIP <<< "${PIP:-.venv/bin/pip}"
  "${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .device/gpu-server \
    "ansible-core==$(.venv/bin/python -c 'import ansible; print(ansible.__version__)')" \
    "resolvelib==$(.venv/bin/python -c 'import resolvelib; print(resolvelib.__version__)')"
  ls -la .device/gpu-server; exit 0
fi
STAGE=${STAGE:-/root/kv-startups}
STATE=/root/gpu-server   # gpu_server_state_dir of the overlay
OUT=${OUT:-$PWD/gpu-server-out}
MODEL_CONFIG=${MODEL_CONFIG:-Qwen3-0.6B}   # benchmarks/gpu_compare/model-configs: the router's model
MODEL_ID=${MODEL_ID:-Qwen/Qwen3-0.6B}      # as inventories/example names it
T0=$(date +%s)
mkdir -p "$OUT" "$STATE"

# vLLM's site and kernels, unpacked as for the KV startups (no startup listed: nothing else runs).
STAGE=$STAGE OUT=$STATE bash benchmarks/gpu_compare/kv_startups.sh run | tail -1
python3 -m pip install -q --no-deps --no-index --target "$STAGE/ansible" .device/gpu-server/*.whl

# The model where the example's hosts have it: the Hugging Face cache at onprem_vllm_hf_cache_path, the branch the
# plan pins (main) naming a commit (here the digest of the config.json: there is no hub to say one). config.json and
# the tokenizer only: the server loads dummy weights.
cache="/srv/hf-cache/hub/models--${MODEL_ID//\//--}"
commit=$(python3 -c 'import hashlib, sys; print(hashlib.sha1(open(sys.argv[1], "rb").read()).hexdigest())' \
  "benchmarks/gpu_compare/model-configs/$MODEL_CONFIG/config.json")
mkdir -p "$cache/snapshots/$commit" "$cache/refs"
cp benchmarks/gpu_compare/model-configs/"$MODEL_CONFIG"/*.json "$cache/snapshots/$commit/"
cp "$STAGE/tokenizer/tokenizer.json" "$STAGE/tokenizer/tokenizer_config.json" "$cache/snapshots/$commit/"
printf '%s' "$commit" > "$cache/refs/main"

# The collection as Ansible finds it in a checkout (the link is tracked; a copy that lost it gets it back).
[ -f .collections/ansible_collections/onprem/vllm/galaxy.yml ] || {
  mkdir -p .collections/ansible_collections/onprem; ln -sfn ../../.. .collections/ansible_collections/onprem/vllm; }
export PYTHONPATH="$STAGE/ansible:$STAGE/site" ANSIBLE_COLLECTIONS_PATH="$PWD/.collections" ANSIBLE_NOCOLOR=1 \
  ANSIBLE_STDOUT_CALLBACK=default ANSIBLE_HOST_KEY_CHECKING=0 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
python3 -m ansible playbook -i inventories/example -i benchmarks/gpu_server/inventory benchmarks/gpu_server/server.yml \
  -l gpu-ws -e "gpu_server_vllm_site=$STAGE/site" > "$STATE/play.log" 2>&1 || rc=$?
for f in report.json spec.json kv-plan.json server.log play.log; do [ -f "$STATE/$f" ] && cp "$STATE/$f" "$OUT/"; done
tail -40 "$STATE/play.log"
echo "playbook exit status $rc, $(( $(date +%s) - T0 )) s in all"
exit "$rc"

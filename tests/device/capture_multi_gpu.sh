#!/usr/bin/env bash
# Record what a multi-GPU host is and what the GPU preflight makes of it (issue 7), on the borrowed H200 machines:
#   device run (kind nvidia-h200-x2, carry .whl):  bash tests/device/capture_multi_gpu.sh
# Writes raw nvidia-smi outputs, the modules' results (both backends, TP=1..N), the gpu_preflight role's decision
# for the seed model at each TP, a real NCCL all-reduce under the plan's NCCL settings, and the module timings, into
# $OUT/capture.tar.gz (the device tool returns 8 files at most).
set -uo pipefail
# NVLink multicast stays off on these shared hosts (the device tool's rules), in every program started here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg
cap=${OUT:-/tmp/out}/capture; mkdir -p "$cap"
run() { local name=$1; shift; { echo "===== \$ $*"; "$@"; echo "===== rc=$?"; } >"$cap/$name" 2>&1; }

date -u +%FT%TZ >"$cap/date.txt"
run nvidia-smi.txt nvidia-smi
run nvidia-smi-L.txt nvidia-smi -L
nvidia-smi topo -m >"$cap/topo-m.txt" 2>&1
for mode in r w n a p; do nvidia-smi topo -p2p $mode >"$cap/topo-p2p-$mode.txt" 2>&1; done
nvidia-smi -q -x >"$cap/nvidia-smi-q.xml" 2>&1
run nvlink-status.txt nvidia-smi nvlink -s
run host.txt bash -c 'cat /proc/cmdline; ls /sys/class/iommu; ls /dev | grep -i nvidia; ls /proc/driver/nvidia-nvswitch/devices 2>&1;
  for g in /sys/bus/pci/drivers/nvidia/0000:*; do echo "$g numa_node=$(cat $g/numa_node)"; done; nproc; dmesg 2>&1 | grep -i xid | head'

ngpu=$(nvidia-smi -L | grep -c '^GPU ')
: >"$cap/facts.jsonl"
for backend in nvml nvidia-smi; do
  python3 tests/device/run_module.py gpu_health_info "{\"backend\": \"$backend\"}" >>"$cap/facts.jsonl"
  python3 tests/device/run_module.py gpu_topology_info "{\"backend\": \"$backend\"}" >>"$cap/facts.jsonl"
  for tp in $(seq 1 $((ngpu + 1))); do
    python3 tests/device/run_module.py gpu_topology_info "{\"backend\": \"$backend\", \"tensor_parallel_size\": $tp}" >>"$cap/facts.jsonl"
  done
done

for tp in $(seq 1 $((ngpu + 1))); do
  OUT=$cap ansible-playbook -i localhost, -c local tests/device/preflight_real.yml -e tp=$tp >"$cap/preflight-tp$tp.log" 2>&1
done

# A real all-reduce over the GPUs under the NCCL settings the plan chose for TP=ngpu: NCCL's log says which transport
# (P2P over NVLink/PCIe, or SHM) it used, against what the module reported for each pair.
python3 - "$cap" "$ngpu" <<'PY' >"$cap/nccl-env.txt" 2>&1
import json, sys
cap, n = sys.argv[1], int(sys.argv[2])
for line in open(cap + "/facts.jsonl"):
    r = json.loads(line)
    if r["_module"] == "gpu_topology_info" and r["_args"] == {"backend": "nvml", "tensor_parallel_size": n}:
        print(" ".join("%s=%s" % kv for kv in sorted(((r.get("plan") or {}).get("nccl_env") or {}).items())))
PY
cat >/tmp/allreduce.py <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank(); torch.cuda.set_device(rank)
x = torch.full((64 * 1024 * 1024,), float(rank + 1), device="cuda")
dist.all_reduce(x); torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10): dist.all_reduce(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
if rank == 0:
    print("sum ok:", bool((x[:8] != 0).all().item()), "busbw GB/s: %.1f" % (2 * (dist.get_world_size() - 1) / dist.get_world_size() * x.numel() * 4 / dt / 1e9))
    print("can_device_access_peer:", {f"{i}-{j}": torch.cuda.can_device_access_peer(i, j) for i in range(torch.cuda.device_count()) for j in range(torch.cuda.device_count()) if i != j})
dist.destroy_process_group()
PY
( env $(head -1 "$cap/nccl-env.txt") NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM \
    timeout 300 python3 -m torch.distributed.run --nproc_per_node "$ngpu" /tmp/allreduce.py ) >"$cap/nccl-allreduce.log" 2>&1
echo "rc=$?" >>"$cap/nccl-allreduce.log"

timeout 300 python3 benchmarks/gpu_modules_speed.py --repeat 5 --json "$cap/bench.json" >"$cap/bench.txt" 2>&1
tar -C "$(dirname "$cap")" -czf "${OUT:-/tmp/out}/capture.tar.gz" capture
ls -la "$cap"

#!/usr/bin/env bash
# Device run (kind nvidia-h200, carry .whl: ansible-core 2.21.5 and its needs, nvidia-ml-py):
#   bash tests/device/plan_check_real.sh
# The plan check then the GPU preflight for the seed model at TP=1 (passes), TP=2 (one GPU: refused in the plan
# check, from PCI sysfs), and TP=1 with nvidia_driver_branch 575 (refused: the v0.32.0 image needs R580); the raw
# PCI ids and the loaded driver beside them. Everything lands in $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --find-links .whl --no-compile --no-cache-dir --target /tmp/site \
  ansible-core==2.21.5 nvidia-ml-py 2>&1 | tail -3
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg
out=${OUT:-/tmp/out}; mkdir -p "$out"
{ python3 --version; cat /proc/driver/nvidia/version;
  for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor)" = 0x10de ] && echo "$d $(cat $d/device) $(cat $d/class)"; done
  grep -c nouveau /proc/modules; } >"$out/host.txt" 2>&1
for args in "-e tp=1" "-e tp=2" "-e tp=1 -e nvidia_driver_branch=575 -e tag=r575"; do
  name=$(echo "$args" | sed 's/-e //g; s/[^a-z0-9]\+/_/g')
  start=$(date +%s.%N)
  ansible-playbook -i localhost, -c local tests/device/plan_check_real.yml $args >"$out/run_${name}.log" 2>&1
  echo "rc=$? wall $(python3 -c "import time; print('%.1f' % (time.time() - $start))") s" >>"$out/run_${name}.log"
  tail -4 "$out/run_${name}.log"
done
ls -la "$out"

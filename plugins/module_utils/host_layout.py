# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the collection keeps its things on a host and in the vLLM container, each stated once: the roles' defaults and
the playbooks read them through the onprem.vllm.host_layout lookup."""

from __future__ import annotations

HOST_LAYOUT = {
    # vllm_server's configuration folder (0700): deployment records, key files, middleware, the in-progress marker;
    # the plan check reads the running server's key file there, the rollback its records.
    "config_dir": "/etc/onprem-vllm",
    # The Xid monitor's GPU fault flag: monitoring writes it, vllm_server mounts its folder, the rollout and
    # gpu_return.yml read it. Under /var/lib: it outlives a reboot, so only gpu_return.yml puts the host back.
    "gpu_fault_flag": "/var/lib/onprem-vllm-gpu-fault/xid.json",
    # The gateway's runtime folder on its host: HAProxy's admin socket (admin.sock), which the drain and undrain use.
    "gateway_runtime_dir": "/run/onprem-gateway",
    # The port vLLM listens on inside its container (the host port is the plan's onprem_vllm_port).
    "container_port": 8000,
}

# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_server's checks before the running server is touched (the vllm_server_check action, tasks/validate.yml):
every refusal at once, from the role's settings and one read of the host (onprem.vllm.vllm_host_info's result).
Pure: no I/O."""
from __future__ import annotations

import re

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_secret_args import secret_settings_errors
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_settings import settings_errors

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1", "localhost")


def _bad_key(value):
    """A key that is not one string without whitespace (a Vault variable left as its placeholder text, or a list)."""
    return not isinstance(value, str) or re.search(r"\s", value) is not None


def port_is_ours(container, port):
    """Whether the server's own container (vllm_host_info's inspect of it, or None) publishes PORT."""
    if not container:
        return False
    bindings = (container.get("HostConfig") or {}).get("PortBindings") or {}
    published = [binding.get("HostPort") for value in bindings.values() for binding in value or []]
    return any(str(host_port).isdigit() and int(host_port) == int(port) for host_port in published)


def _key_errors(api_key, rotation, bind_address):
    key_bad, rotation_bad = _bad_key(api_key), _bad_key(rotation)
    errors = []
    if key_bad:
        errors.append("vllm_server_api_key must be one string without spaces or newlines (check the Vault variable).")
    if rotation_bad:
        errors.append("vllm_server_api_key_rotation (the plan's onprem_vllm_api_key_rotation) must be one string "
                      "without spaces or newlines (check the Vault variable), or empty outside a key rotation.")
    if not key_bad and not api_key and rotation:
        errors.append("vllm_server_api_key_rotation is set but vllm_server_api_key is empty: a rotation needs the "
                      "current key too (docs/key_rotation.md).")
    if not key_bad and bind_address not in LOOPBACK_ADDRESSES and not api_key:
        errors.append("vllm_server_bind_address=%s exposes the server beyond this host: set vllm_server_api_key "
                      "(from Vault) or bind to 127.0.0.1." % bind_address)
    return errors


def refusals(params, host):
    """Every reason the server's settings or the host refuse the deployment (empty: none).

    params: the vllm_server_check action's arguments; host: what onprem.vllm.vllm_host_info read (containers by
    name, port_listening, paths)."""
    errors = settings_errors(dict(params["settings"]), "vllm_server_")
    errors += _key_errors(params["api_key"], params["api_key_rotation"], params["bind_address"])
    uuids = list(params["gpu_uuids"] or [])
    if not params["cpu_mode"] and len(uuids) != params["gpu_count"]:
        errors.append("tensor_parallel_size x pipeline_parallel_size = %d GPUs, but %d are assigned (%s): run "
                      "gpu_preflight first, set vllm_server_gpu_uuids, or lower vllm_server_tensor_parallel_size."
                      % (params["gpu_count"], len(uuids), ", ".join(uuids) or "none"))
    revision = params["model_revision"]
    if revision and not _COMMIT.match(revision):
        errors.append("vllm_server_model_revision must be the 40-hex commit the server runs, not '%s' (the cache names "
                      "snapshots by commit): pin the branch or tag in the plan's onprem_vllm_model_revision, which "
                      "hf_cache resolves once to its commit and the playbooks pass on." % revision)
    clients = (params["tls_clients"] or "").strip()
    if clients and "-----BEGIN CERTIFICATE-----" not in clients:
        errors.append("vllm_server_tls_clients must hold PEM certificates (-----BEGIN CERTIFICATE-----), the clients "
                      "the server trusts (playbooks/tls.yml publishes those of the gateways and Prometheus), or be "
                      "empty for plain http.")
    errors += secret_settings_errors(params["extra_args"], params["env"])
    existing = (host.get("containers") or {}).get(params["container_name"]) or {}
    ours = existing.get("exists") and port_is_ours(existing.get("container"), params["port"])
    if host.get("port_listening") and not ours:
        errors.append("Port %s on %s is in use by something other than the %s container: choose another "
                      "vllm_server_port or stop what listens there (ss -ltnp 'sport = :%s')."
                      % (params["port"], params["host_name"], params["container_name"], params["port"]))
    snapshot_config = params["snapshot_config"]
    if snapshot_config and not (host.get("paths") or {}).get(snapshot_config):
        errors.append("Revision %s of %s is not in the cache at %s and the server runs with HF_HUB_OFFLINE=1: stage "
                      "it with the hf_cache role (the plan's onprem_vllm_model_revision) or fix "
                      "vllm_server_model_revision." % (revision, params["model"], params["hf_cache_path"]))
    return errors

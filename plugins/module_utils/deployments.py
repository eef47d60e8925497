# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan's deployments: what each server of the fleet runs, stated once and proved before anything changes.

A deployment is one vLLM server per host it lands on: its own container, port, records, gate and gateway backend.
`normalize` turns the plan (onprem_vllm_deployments, the fleet-wide onprem_vllm_* defaults and
onprem_vllm_deployment_overrides) into complete deployments; without onprem_vllm_deployments the one-model plan is a
list of one. `placement_errors` proves what lands on one host: unique names and served names, unique ports and
containers, whole GPUs that exist, and shared GPUs whose memory fractions fit. Pure logic, used through the
onprem.vllm.plan_deployments and onprem.vllm.deployment_placement_errors filters.
"""
from __future__ import annotations

import copy
import re

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_settings import as_fraction

# Deployment key -> the fleet-wide plan variable it defaults from (onprem_vllm_<key>).
FLEET_KEYS = (
    "image", "image_tag", "image_digest", "image_cuda", "model", "model_revision", "tensor_parallel_size",
    "pipeline_parallel_size", "enable_expert_parallel", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
    "gpu_memory_utilization", "kv_cache_dtype", "kv_cache_memory", "enforce_eager", "cpu_kv_cache_space_gib",
)
# Keys with their own default (not a fleet-wide variable).
OWN_DEFAULTS = {
    "served_model_aliases": [],
    "runner": "generate",
    "extra_args": [],
    "env": {},
    "shares_gpu_with": "",
    "shared_gpu_index": 0,
    # The known-answer gate's prompts for this deployment ([]: the collection's default set).
    "known_answer_prompts": [],
    # A vision-language model's --limit-mm-per-prompt ({image: 2, video: 0}; {}: vLLM's 999 of each). Every
    # modality at 0 serves it text-only: no vision tower in memory (the KV plan counts it either way).
    "limit_mm_per_prompt": {},
}
# Keys set per deployment only (their defaults depend on the deployment's name).
NAMED_KEYS = ("name", "served_model_name", "hosts", "container_name", "port")
KNOWN_KEYS = frozenset(FLEET_KEYS) | frozenset(OWN_DEFAULTS) | frozenset(NAMED_KEYS)
RUNNERS = ("generate", "pooling")
# The one-model plan's deployment (no onprem_vllm_deployments): its name in records, the gateway and alerts.
SINGLE_NAME = "default"
DEFAULT_HOSTS_GROUP = "vllm_servers"
# Deployment names become container, backend and file names: short, lower case, no dots.
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
# Served names and aliases go into the gateway's model map and vLLM's --served-model-name: no spaces or quotes.
_SERVED_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
# Deployments sharing one GPU: their gpu_memory_utilization fractions must sum to at most this. vLLM refuses to start
# unless FREE memory >= total x utilization, and every process on the GPU also holds a CUDA context (~0.3-0.5 GiB)
# outside its fraction.
SHARED_GPU_UTILIZATION_LIMIT = 0.95


class PlanError(ValueError):
    """The plan's structure is wrong (not a list of mappings, unknown keys, a missing name)."""


def _count(value, default=1):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def normalize(deployments, fleet: dict, overrides=None, container_name="vllm", port=8000,
              served_model_name="") -> list[dict]:
    """Complete deployments from the plan.

    deployments: onprem_vllm_deployments (None or [] = the one-model plan); fleet: {key: onprem_vllm_<key>} for
    FLEET_KEYS; overrides: {deployment name: {key: value}} applied last (a group's or the lab's adjustments without
    restating the list); container_name, port, served_model_name: the one-model plan's (onprem_vllm_container_name,
    onprem_vllm_port, onprem_vllm_served_model_name), also the defaults of a list's items (an item's served name
    defaults to the fleet's, else to its name; its container to <container_name>-<name>).
    """
    overrides = overrides or {}
    if not isinstance(overrides, dict):
        raise PlanError("onprem_vllm_deployment_overrides must be a mapping of deployment name to settings")
    base = {key: fleet.get(key) for key in FLEET_KEYS}
    base.update(OWN_DEFAULTS)
    base["hosts"] = DEFAULT_HOSTS_GROUP
    if not deployments:
        single = dict(copy.deepcopy(base), name=SINGLE_NAME, served_model_name=served_model_name,
                      container_name=container_name, port=port)
        result = [_apply_overrides(single, overrides)]
        _refuse_unknown_overrides(result, overrides)
        return result
    if not isinstance(deployments, list):
        raise PlanError("onprem_vllm_deployments must be a list of deployments ({name: chat, model: ..., ...})")
    result = []
    for index, item in enumerate(deployments):
        if not isinstance(item, dict):
            raise PlanError(f"onprem_vllm_deployments[{index}] must be a mapping, got {type(item).__name__}")
        name = item.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise PlanError(f"onprem_vllm_deployments[{index}].name must be a short lower-case name (a-z, 0-9, -; "
                            f"starting with a letter), got {name!r}: it names the container, records and backend")
        unknown = sorted(set(item) - KNOWN_KEYS)
        if unknown:
            raise PlanError(f"deployment {name}: unknown key(s) {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(KNOWN_KEYS))}")
        deployment = dict(copy.deepcopy(base), name=name, served_model_name=served_model_name or name,
                          container_name=f"{container_name}-{name}", port=port)
        deployment.update(item)
        result.append(_apply_overrides(deployment, overrides))
    _refuse_unknown_overrides(result, overrides)
    return result


def _refuse_unknown_overrides(deployments: list[dict], overrides: dict) -> None:
    unknown = sorted(set(overrides) - {d["name"] for d in deployments})
    if unknown:
        raise PlanError(f"onprem_vllm_deployment_overrides names no deployment of the plan: {', '.join(unknown)}")


def _apply_overrides(deployment: dict, overrides: dict) -> dict:
    extra = overrides.get(deployment["name"]) or {}
    if not isinstance(extra, dict):
        raise PlanError(f"onprem_vllm_deployment_overrides.{deployment['name']} must be a mapping")
    unknown = sorted(set(extra) - KNOWN_KEYS - {"name"})
    if unknown or "name" in extra:
        raise PlanError(f"onprem_vllm_deployment_overrides.{deployment['name']}: cannot set "
                        f"{', '.join(unknown + (['name'] if 'name' in extra else []))}")
    result = dict(deployment)
    result.update(extra)
    if not isinstance(result["port"], bool):
        result["port"] = _count(result["port"], result["port"])
    return result


def served_names(deployment: dict) -> list[str]:
    """The names a deployment answers to: its served name first (what vLLM reports), then its aliases."""
    return [deployment["served_model_name"]] + [a for a in deployment.get("served_model_aliases") or []
                                                if a != deployment["served_model_name"]]


def gpu_count(deployment: dict) -> int:
    """Whole GPUs a deployment takes: 0 when it shares another deployment's GPU."""
    if deployment.get("shares_gpu_with"):
        return 0
    return _count(deployment.get("tensor_parallel_size")) * _count(deployment.get("pipeline_parallel_size"))


def on_host(deployments: list[dict], group_names) -> list[dict]:
    """The deployments that land on a host in the given inventory groups."""
    groups = set(group_names or [])
    return [d for d in deployments if isinstance(d.get("hosts"), str) and d["hosts"] in groups]


def canaries(deployments: list[dict], hosts, groups: dict) -> dict:
    """Each deployment's canary: the first of HOSTS (the rollout's hosts, in play order) in its inventory group.
    A deployment that lands on none of them has none."""
    found = {}
    for deployment in deployments:
        members = set(groups.get(deployment.get("hosts"), []) or [])
        host = next((h for h in hosts if h in members), None)
        if host is not None:
            found[deployment["name"]] = host
    return found


def first_per_image(deployments: list[dict], restores=None) -> list[dict]:
    """The first of DEPLOYMENTS for each image (name, tag and digest; where RESTORES, rollback.yml's records by
    deployment name, restore one, the restored image), in order: a host checks and stages an image once, not once per
    deployment that runs it."""
    restores = restores or {}
    seen, first = set(), []
    for deployment in deployments:
        restore = restores.get(deployment["name"]) or {}
        image = tuple(restore.get(key, deployment.get(key)) for key in ("image", "image_tag", "image_digest"))
        if image not in seen:
            seen.add(image)
            first.append(deployment)
    return first


def fleet_errors(deployments: list[dict]) -> list[str]:
    """Problems of the plan as a whole: names, served names and aliases, runners and sharing references."""
    errors = []
    seen_names, seen_served, seen_containers = {}, {}, {}
    by_name = {d["name"]: d for d in deployments}
    for deployment in deployments:
        name = deployment["name"]
        if name in seen_names:
            errors.append(f"deployment name {name} is used twice in onprem_vllm_deployments: names must be unique")
        seen_names[name] = True
        if not isinstance(deployment.get("hosts"), str) or not deployment.get("hosts"):
            errors.append(f"deployment {name}: hosts must name one inventory group (e.g. vllm_servers), got "
                          f"{deployment.get('hosts')!r}")
        container = deployment.get("container_name")
        if container in seen_containers:
            errors.append(f"deployments {seen_containers[container]} and {name} both use container_name "
                          f"{container}: give each its own")
        seen_containers.setdefault(container, name)
        if deployment.get("runner") not in RUNNERS:
            errors.append(f"deployment {name}: runner must be one of {', '.join(RUNNERS)} (pooling serves "
                          f"embeddings and rerank), got {deployment.get('runner')!r}")
        aliases = deployment.get("served_model_aliases")
        if not isinstance(aliases, list):
            errors.append(f"deployment {name}: served_model_aliases must be a list of names")
            aliases = []
        for served in [deployment.get("served_model_name")] + aliases:
            if not isinstance(served, str) or not _SERVED_RE.match(served):
                errors.append(f"deployment {name}: served name {served!r} must be one word (letters, digits, "
                              f". _ : / -): clients send it as the request's model")
                continue
            if served in seen_served and seen_served[served] != name:
                errors.append(f"deployments {seen_served[served]} and {name} both answer to the model name "
                              f"{served}: the gateway could not tell where to send it; rename one "
                              f"(served_model_name or served_model_aliases)")
            seen_served.setdefault(served, name)
        if not isinstance(deployment.get("extra_args"), list):
            errors.append(f"deployment {name}: extra_args must be a list of arguments")
        prompts = deployment.get("known_answer_prompts")
        if not isinstance(prompts, list) or not all(isinstance(p, str) and p.strip() for p in prompts):
            errors.append(f"deployment {name}: known_answer_prompts must be a list of non-empty prompts")
        if not isinstance(deployment.get("env"), dict):
            errors.append(f"deployment {name}: env must be a mapping of variable to value")
        limits = deployment.get("limit_mm_per_prompt")
        if not isinstance(limits, dict) or any(not str(count).isdigit() for count in limits.values()):
            errors.append(f"deployment {name}: limit_mm_per_prompt must map modalities to counts of 0 or more "
                          f"(e.g. {{image: 2, video: 0}}), got {limits!r}")
        shared = deployment.get("shares_gpu_with")
        if shared:
            target = by_name.get(shared)
            if target is None:
                errors.append(f"deployment {name}: shares_gpu_with names {shared}, which is not a deployment of the "
                              f"plan")
            elif target.get("shares_gpu_with"):
                errors.append(f"deployment {name}: shares_gpu_with names {shared}, which itself shares a GPU; name "
                              f"the deployment that owns the GPU")
            if _count(deployment.get("tensor_parallel_size")) * _count(deployment.get("pipeline_parallel_size")) != 1:
                errors.append(f"deployment {name} shares one GPU of {shared}: set tensor_parallel_size and "
                              f"pipeline_parallel_size to 1")
            if str(deployment.get("kv_cache_memory") or "").strip() == "":
                errors.append(f"deployment {name} shares a GPU: pin its KV pool (kv_cache_memory: auto, the planned "
                              f"pool, or bytes) so that vLLM does not size it from the memory its neighbour left "
                              f"free")
    return errors


def placement_errors(deployments: list[dict], host: str, group_names, gpus: int, cpu_mode: bool) -> list[str]:
    """Problems of what lands on one host: ports, whole GPUs, shared GPUs' memory fractions."""
    errors = []
    here = on_host(deployments, group_names)
    if not here:
        return [f"{host} is in no deployment's hosts group "
                f"({', '.join(sorted({str(d.get('hosts')) for d in deployments}))}): "
                f"add it to one, or take it out of vllm_servers"]
    ports = {}
    for deployment in here:
        port = deployment.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            errors.append(f"deployment {deployment['name']}: port must be a TCP port number, got {port!r}")
            continue
        if port in ports:
            errors.append(f"deployments {ports[port]} and {deployment['name']} both listen on port {port} of {host}: "
                          f"give each its own port in onprem_vllm_deployments")
        ports.setdefault(port, deployment["name"])
    if cpu_mode:
        return errors
    whole = sum(gpu_count(d) for d in here)
    if gpus and whole > gpus:
        errors.append(f"{host} has {gpus} GPU(s) but its deployments take {whole} whole GPUs "
                      f"({', '.join('%s: %d' % (d['name'], gpu_count(d)) for d in here if gpu_count(d))}): lower a "
                      f"tensor_parallel_size, share a GPU (shares_gpu_with) or move a deployment to other hosts")
    by_name = {d["name"]: d for d in here}
    shares = {}
    for deployment in here:
        owner = deployment.get("shares_gpu_with")
        if not owner:
            continue
        if owner not in by_name:
            if any(d["name"] == owner for d in deployments):
                errors.append(f"deployment {deployment['name']} shares a GPU of {owner}, which does not run on {host}: "
                              f"its hosts group ({deployment.get('hosts')}) must hold only hosts of {owner}'s "
                              f"({next(d.get('hosts') for d in deployments if d['name'] == owner)})")
            continue
        index = _count(deployment.get("shared_gpu_index"), 0)
        if not 0 <= index < gpu_count(by_name[owner]):
            errors.append(f"deployment {deployment['name']}: shared_gpu_index {index} is not one of {owner}'s "
                          f"{gpu_count(by_name[owner])} GPU(s) (0 to {gpu_count(by_name[owner]) - 1})")
            continue
        shares.setdefault((owner, index), [by_name[owner]]).append(deployment)
    for (owner, index), sharing in sorted(shares.items()):
        fractions = [as_fraction(d.get("gpu_memory_utilization")) for d in sharing]
        if None in fractions:
            errors.append(f"GPU {index} of {owner} on {host} is shared: every deployment on it needs "
                          f"gpu_memory_utilization as a fraction (0 < x <= 1), so that their sum can be proved")
            continue
        total = sum(fractions)
        if total > SHARED_GPU_UTILIZATION_LIMIT + 1e-9:
            errors.append(f"GPU {index} of {owner} on {host} is shared by "
                          f"{', '.join('%s (%s)' % (d['name'], d.get('gpu_memory_utilization')) for d in sharing)}: "
                          f"their gpu_memory_utilization sums to {total:.2f}, above {SHARED_GPU_UTILIZATION_LIMIT} "
                          f"(vLLM needs that much free memory at start, and each process holds a CUDA context "
                          f"besides): lower them so the sum fits")
    return errors

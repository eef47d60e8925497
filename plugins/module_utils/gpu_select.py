# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Choose the GPU set for a tensor-parallel size and derive the NCCL environment for it. Pure functions.

Input is the topology fact built by gpu_smi / gpu_nvml. Every decision carries a one-line reason.

Preference order for a set (first difference decides):
  1. fewest GPU pairs whose P2P read/write status is known and not OK (never a broken pair when a better set exists);
  2. the worst link inside the set, best first: NVLink, PIX, PXB (one PCIe switch), PHB, NODE (one NUMA node), SYS;
  3. fewest NUMA nodes spanned;
  4. the sum of link ranks (fewer slow pairs), then more NVLinks per pair;
  5. least memory already used on the GPUs, then the lowest indices (stable result).
"""

from __future__ import annotations

import itertools
import math

LINK_RANK = {"NV": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
LINK_WORDS = {
    "NV": "NVLink",
    "PIX": "at most one PCIe bridge (PIX)",
    "PXB": "one PCIe switch tree (PXB)",
    "PHB": "through the CPU host bridge (PHB)",
    "NODE": "across host bridges within one NUMA node (NODE)",
    "SYS": "across NUMA nodes / sockets (SYS)",
}
CUSTOM_ALL_REDUCE_WORLD_SIZES = (2, 4, 6, 8)
MAX_COMBINATIONS = 20000


def link_kind(link_type):
    if not link_type:
        return None
    return "NV" if link_type.startswith("NV") else link_type


def link_rank(link_type):
    kind = link_kind(link_type)
    return LINK_RANK.get(kind, 6)


def pair_key(i, j):
    return "%d-%d" % (min(i, j), max(i, j))


def p2p_problem(link):
    """The first known non-OK P2P status of a link as 'read=GNS', or None when none is known to be broken."""
    for key, label in (("p2p_read", "read"), ("p2p_write", "write")):
        value = (link or {}).get(key)
        if value and value != "OK":
            return "%s=%s" % (label, value)
    return None


def _score(indices, gpus_by_index, links):
    pairs = list(itertools.combinations(indices, 2))
    broken = sum(1 for i, j in pairs if p2p_problem(links.get(pair_key(i, j))))
    ranks = [link_rank(links.get(pair_key(i, j), {}).get("type")) for i, j in pairs]
    worst = max(ranks) if ranks else 0
    numa = set(gpus_by_index[i].get("numa_node") for i in indices)
    nvl = [links.get(pair_key(i, j), {}).get("nvlink_count") or 0 for i, j in pairs]
    used = sum(gpus_by_index[i].get("memory_used_bytes") or 0 for i in indices)
    return (broken, worst, len(numa), sum(ranks), -(min(nvl) if nvl else 0), used, tuple(indices))


def foreign_memory_bytes(gpu, allowed_process_names=None, allowed_pids=None):
    """Memory in use on a GPU minus what allowed processes hold (by name, or by PID: the server being replaced)."""
    used = gpu.get("memory_used_bytes") or 0
    allowed = set(allowed_process_names or [])
    pids = set(allowed_pids or [])
    for proc in gpu.get("processes") or []:
        if (proc.get("name") in allowed or proc.get("pid") in pids) and proc.get("used_memory_bytes"):
            used -= proc["used_memory_bytes"]
    return max(used, 0)


def _describe_set(indices, gpus_by_index, links):
    pairs = list(itertools.combinations(indices, 2))
    if not pairs:
        return "single GPU %d" % indices[0]
    types = [links.get(pair_key(i, j), {}).get("type") for i, j in pairs]
    worst = max(types, key=link_rank)
    kinds = set(link_kind(t) for t in types)
    if kinds == {"NV"}:
        link_text = "NVLink between every pair (%s)" % ", ".join(sorted(set(types)))
    else:
        link_text = "worst link %s" % (LINK_WORDS.get(link_kind(worst), "unknown (%s)" % worst))
    numa = sorted(set(str(gpus_by_index[i].get("numa_node")) for i in indices))
    numa_text = "NUMA node %s" % numa[0] if len(numa) == 1 else "NUMA nodes %s" % ",".join(numa)
    broken = ["%d-%d %s" % (i, j, p2p_problem(links.get(pair_key(i, j)))) for i, j in pairs
              if p2p_problem(links.get(pair_key(i, j)))]
    p2p_text = "P2P not OK on %s" % "; ".join(broken) if broken else "P2P read/write OK or not reported"
    return "%s; %s; %s" % (link_text, numa_text, p2p_text)


def select_gpus(topology, tensor_parallel_size, gpu_uuids=None):
    """Choose GPUs for a TP size. Returns dict(ok, msg, indices, uuids, reason, alternatives_considered)."""
    gpus = list((topology or {}).get("gpus") or [])
    links = (topology or {}).get("links") or {}
    result = {"ok": False, "msg": "", "indices": [], "uuids": [], "reason": "", "alternatives_considered": 0}
    try:
        tp = int(tensor_parallel_size)
    except (TypeError, ValueError):
        result["msg"] = "tensor_parallel_size must be an integer, got %r" % (tensor_parallel_size,)
        return result
    if tp < 1:
        result["msg"] = "tensor_parallel_size must be at least 1, got %d" % tp
        return result
    by_uuid = {g.get("uuid"): g for g in gpus}
    candidates = gpus
    if gpu_uuids:
        missing = [u for u in gpu_uuids if u not in by_uuid]
        if missing:
            result["msg"] = "GPU UUID(s) %s not present on this host; present: %s" % (
                ", ".join(missing), ", ".join("%s=%s" % (g.get("index"), g.get("uuid")) for g in gpus) or "none")
            return result
        candidates = [by_uuid[u] for u in gpu_uuids]
    if tp > len(candidates):
        what = "the %d GPU(s) listed in gpu_uuids" % len(candidates) if gpu_uuids else "the %d GPU(s) on this host" % len(candidates)
        result["msg"] = "tensor_parallel_size %d needs %d GPUs, but only %s are available%s" % (
            tp, tp, what, (": " + ", ".join("%s %s" % (g.get("index"), g.get("name")) for g in candidates)) if candidates else "")
        return result
    gpus_by_index = {g["index"]: g for g in gpus}
    indices_pool = sorted(g["index"] for g in candidates)
    total = math.comb(len(indices_pool), tp)
    if total <= MAX_COMBINATIONS:
        combos = itertools.combinations(indices_pool, tp)
    else:  # pragma: no cover - only for very large hosts
        combos = [tuple(indices_pool[:tp])]
    best = None
    considered = 0
    for combo in combos:
        considered += 1
        score = _score(combo, gpus_by_index, links)
        if best is None or score < best[0]:
            best = (score, combo)
    indices = list(best[1])
    result.update(
        ok=True,
        indices=indices,
        uuids=[gpus_by_index[i].get("uuid") for i in indices],
        alternatives_considered=considered,
        msg="selected GPU(s) %s" % ",".join(str(i) for i in indices),
    )
    origin = "from gpu_uuids" if gpu_uuids else "of %d" % len(gpus)
    result["reason"] = "GPUs %s chosen (%d %s, %d set(s) compared): %s" % (
        ",".join(str(i) for i in indices), tp, origin, considered, _describe_set(indices, gpus_by_index, links))
    return result


def derive_nccl_env(topology, indices, p2p_risks=None):
    """NCCL environment and vLLM switches for a chosen set.

    Returns dict(env, disable_custom_all_reduce, reasons). env values are strings (container env)."""
    links = (topology or {}).get("links") or {}
    indices = list(indices or [])
    reasons = []
    env = {}
    if len(indices) < 2:
        reasons.append("single GPU: no NCCL peer traffic, no NCCL settings needed")
        return {"env": env, "disable_custom_all_reduce": False, "reasons": reasons}
    pairs = list(itertools.combinations(indices, 2))
    broken = [(i, j, p2p_problem(links.get(pair_key(i, j)))) for i, j in pairs if p2p_problem(links.get(pair_key(i, j)))]
    unknown = [(i, j) for i, j in pairs if not (links.get(pair_key(i, j)) or {}).get("p2p_read")]
    all_nvlink = all(link_kind((links.get(pair_key(i, j)) or {}).get("type")) == "NV" for i, j in pairs)
    risks = list(p2p_risks or [])
    if broken:
        env["NCCL_P2P_DISABLE"] = "1"
        reasons.append("NCCL_P2P_DISABLE=1: P2P is not OK between %s; NCCL must use host shared memory "
                       "(a hard-coded NCCL_P2P_DISABLE=0 hangs on such GPUs)" % ", ".join(
                           "GPU %d-%d (%s)" % b for b in broken))
    elif risks and not all_nvlink:
        env["NCCL_P2P_DISABLE"] = "1"
        reasons.append("NCCL_P2P_DISABLE=1: the driver reports P2P OK but the host routes peer traffic through "
                       "the root complex: %s" % risks[0])
    else:
        env["NCCL_P2P_DISABLE"] = "0"
        if unknown:
            reasons.append("NCCL_P2P_DISABLE=0: P2P status not reported for %s; NCCL decides by itself"
                           % ", ".join("GPU %d-%d" % p for p in unknown))
        else:
            reasons.append("NCCL_P2P_DISABLE=0: P2P read/write OK between every chosen pair%s" % (
                " over NVLink" if all_nvlink else ""))
    disable_car = False
    if env["NCCL_P2P_DISABLE"] == "1":
        disable_car = True
        reasons.append("custom all-reduce off: it needs GPU P2P, which is disabled for this set")
    elif len(indices) > 2 and not all_nvlink:
        disable_car = True
        reasons.append("custom all-reduce off: %d PCIe-connected GPUs (vLLM supports it on PCIe only for 2)" % len(indices))
    elif len(indices) not in CUSTOM_ALL_REDUCE_WORLD_SIZES:
        disable_car = True
        reasons.append("custom all-reduce off: world size %d is not one of %s" % (
            len(indices), ", ".join(str(s) for s in CUSTOM_ALL_REDUCE_WORLD_SIZES)))
    elif unknown:
        reasons.append("custom all-reduce left on: %d GPUs %s, P2P not reported; vLLM tests P2P at start and turns "
                       "it off itself when P2P fails" % (len(indices), "on NVLink" if all_nvlink else "on PCIe"))
    else:
        reasons.append("custom all-reduce on: %d GPUs %s with P2P OK" % (len(indices), "on NVLink" if all_nvlink else "on PCIe"))
    return {"env": env, "disable_custom_all_reduce": disable_car, "reasons": reasons}


def min_compute_capability(topology, indices):
    """Lowest compute capability among the chosen GPUs as a (major, minor) tuple, or None when unknown."""
    by_index = {g["index"]: g for g in (topology or {}).get("gpus") or []}
    values = []
    for i in indices or []:
        cc = (by_index.get(i) or {}).get("compute_capability")
        if not cc:
            return None
        major, _sep, minor = str(cc).partition(".")
        values.append((int(major), int(minor or 0)))
    return min(values) if values else None


def plan(topology, tensor_parallel_size, gpu_uuids=None, p2p_risks=None, allowed_process_names=None,
         allowed_pids=None):
    """Selection + NCCL env + per-GPU numbers the role publishes."""
    selection = select_gpus(topology, tensor_parallel_size, gpu_uuids)
    out = {
        "ok": selection["ok"],
        "msg": selection["msg"],
        "selected_indices": selection["indices"],
        "selected_uuids": selection["uuids"],
        "reasons": [selection["reason"]] if selection["reason"] else [],
        "nccl_env": {},
        "disable_custom_all_reduce": False,
        "gpu_memory_bytes": None,
        "foreign_memory_bytes": {},
        "min_compute_capability": None,
    }
    if not selection["ok"]:
        return out
    nccl = derive_nccl_env(topology, selection["indices"], p2p_risks)
    by_index = {g["index"]: g for g in topology.get("gpus") or []}
    totals = [by_index[i].get("memory_total_bytes") for i in selection["indices"]]
    cc = min_compute_capability(topology, selection["indices"])
    out.update(
        nccl_env=nccl["env"],
        disable_custom_all_reduce=nccl["disable_custom_all_reduce"],
        gpu_memory_bytes=min(totals) if totals and None not in totals else None,
        foreign_memory_bytes={by_index[i].get("uuid"): foreign_memory_bytes(by_index[i], allowed_process_names, allowed_pids)
                              for i in selection["indices"]},
        min_compute_capability="%d.%d" % cc if cc else None,
    )
    out["reasons"].extend(nccl["reasons"])
    return out

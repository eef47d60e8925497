# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsers for nvidia-smi output: ``-q -x``, ``topo -m`` and ``topo -p2p r|w|n``.

Pure functions (standard library only). They turn recorded or live nvidia-smi text into the
fact shape shared with the NVML collector (``gpu_nvml``):

``{"driver_version", "cuda_driver_version", "gpus": [...], "links": {"i-j": {...}}, "nvswitch": {...}}``

Each GPU entry: index, uuid, name, pci_bus_id, memory_total_bytes, memory_used_bytes,
memory_reserved_bytes, compute_capability, compute_capability_source, architecture, pcie_gen,
pcie_width, pcie_gen_max, pcie_width_max, numa_node, persistence_mode, mig_mode, processes,
ecc (health counters), recovery_action, fabric_state.
"""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

LINK_TYPES = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)\s*$")
_MEM_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

# Messages nvidia-smi prints instead of a report (seen in public bug reports and the driver's own strings).
SMI_FAILURES = (
    ("driver_library_mismatch", re.compile(r"Driver/library version mismatch", re.I)),
    ("no_driver", re.compile(r"couldn't communicate with the NVIDIA driver|NVIDIA driver is not loaded|"
                             r"Driver Not Loaded|No devices were found|NVML Shared Library Not Found", re.I)),
    ("gpu_lost", re.compile(r"GPU is lost|fallen off the bus|Unable to determine the device handle", re.I)),
    ("no_permission", re.compile(r"Insufficient Permissions", re.I)),
)


class SmiParseError(ValueError):
    """Raised when nvidia-smi output cannot be understood."""


def strip_ansi(text):
    return _ANSI_RE.sub("", text or "")


def classify_smi_failure(text):
    """Return a status keyword for an nvidia-smi failure message (or 'error')."""
    for status, pattern in SMI_FAILURES:
        if pattern.search(text or ""):
            if status == "no_driver" and re.search(r"No devices were found", text or "", re.I):
                return "no_gpu"
            return status
    return "error"


def normalize_pci_bus_id(bus_id):
    """'00000000:0A:00.0' / '0000:0a:00' / 'PCI:0000:0a:00' -> '0000:0a:00.0' (the sysfs spelling)."""
    if not bus_id:
        return None
    text = str(bus_id).strip()
    if text.upper().startswith("PCI:"):
        text = text[4:]
    match = re.match(r"^(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?$", text)
    if not match:
        return text.lower()
    domain, bus, dev, func = match.groups()
    domain_int = int(domain, 16) if domain else 0
    return "%04x:%02x:%02x.%s" % (domain_int, int(bus, 16), int(dev, 16), func or "0")


def parse_memory(text):
    """'143771 MiB' -> bytes; 'N/A' or unknown -> None."""
    if text is None:
        return None
    match = _MEM_RE.match(str(text))
    if not match:
        return None
    return int(float(match.group(1)) * _MEM_UNITS[match.group(2)])


def _int_or_none(text):
    if text is None:
        return None
    match = re.match(r"^\s*(-?\d+)", str(text))
    return int(match.group(1)) if match else None


def _yes_no(text):
    if text is None:
        return None
    value = str(text).strip().lower()
    if value in ("yes", "enabled", "on", "true", "1"):
        return True
    if value in ("no", "disabled", "off", "false", "0"):
        return False
    return None


def _text(node, path):
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value if value != "" else None


# Compute capability by architecture and product name. nvidia-smi -q -x does not report it; NVML does.
# Sources: NVIDIA CUDA GPUs list (https://developer.nvidia.com/cuda-gpus) and the CUDA C Programming Guide,
# "Compute Capabilities" table.
def compute_capability_from_name(architecture, name):
    arch = (architecture or "").strip().lower()
    product = (name or "").upper()
    if arch == "hopper":
        return "9.0"
    if arch in ("ada lovelace", "ada"):
        return "8.9"
    if arch == "ampere":
        if re.search(r"\bA100\b|\bA800\b|\bA30\b", product):
            return "8.0"
        return "8.6"
    if arch == "blackwell":
        if re.search(r"\bGB?300\b|\bB300\b", product):
            return "10.3"
        if re.search(r"\bGB?200\b|\bB100\b|\bB200\b", product):
            return "10.0"
        if "RTX" in product or "GEFORCE" in product:
            return "12.0"
        return None
    if arch == "turing":
        return "7.5"
    if arch == "volta":
        return "7.0"
    if arch == "pascal":
        return "6.0" if "P100" in product else "6.1"
    return None


def _ecc_from_xml(gpu):
    ecc_mode = _yes_no(_text(gpu, "ecc_mode/current_ecc"))
    errors = gpu.find("ecc_errors")

    def uncorrected(section):
        node = errors.find(section) if errors is not None else None
        if node is None:
            return None
        total = None
        for child in node.iter():
            tag = child.tag.lower()
            value = _int_or_none(child.text)
            if value is None:
                continue
            # driver >= 535 layout: sram_uncorrectable_*, dram_uncorrectable
            if "uncorrectable" in tag:
                total = (total or 0) + value
        if total is None:
            # older layout: <double_bit><total>N</total></double_bit>
            value = _int_or_none(_text(node, "double_bit/total"))
            if value is not None:
                total = value
        return total

    remapped = gpu.find("remapped_rows")
    retired = gpu.find("retired_pages")

    def first_int(node, *paths):
        for path in paths:
            value = _int_or_none(_text(node, path))
            if value is not None:
                return value
        return None

    def first_bool(node, *paths):
        for path in paths:
            value = _yes_no(_text(node, path))
            if value is not None:
                return value
        return None

    return {
        "mode_enabled": ecc_mode,
        "volatile_uncorrected": uncorrected("volatile"),
        "aggregate_uncorrected": uncorrected("aggregate"),
        "retired_pages_sbe": first_int(retired, "multiple_single_bit_retirement/retired_count"),
        "retired_pages_dbe": first_int(retired, "double_bit_retirement/retired_count"),
        "retired_pages_pending": first_bool(retired, "pending_retirement", "pending_blacklist"),
        "remapped_rows_correctable": first_int(remapped, "remapped_row_corr", "correctable"),
        "remapped_rows_uncorrectable": first_int(remapped, "remapped_row_unc", "uncorrectable"),
        "remapped_rows_pending": first_bool(remapped, "remapped_row_pending", "pending"),
        "remapped_rows_failure": first_bool(remapped, "remapped_row_failure", "remapping_failure_occurred"),
    }


def _processes_from_xml(gpu):
    processes = []
    node = gpu.find("processes")
    if node is None:
        return processes
    for proc in node.findall("process_info"):
        processes.append({
            "pid": _int_or_none(_text(proc, "pid")),
            "name": _text(proc, "process_name"),
            "type": _text(proc, "type"),
            "used_memory_bytes": parse_memory(_text(proc, "used_memory")),
        })
    return processes


def parse_query_xml(xml_text):
    """Parse ``nvidia-smi -q -x``. Returns (header dict, list of GPU dicts)."""
    if not xml_text or not xml_text.strip():
        raise SmiParseError("nvidia-smi -q -x returned no output")
    # Drop the DOCTYPE line: ElementTree does not fetch DTDs, but some outputs carry odd ones.
    cleaned = re.sub(r"<!DOCTYPE[^>]*>", "", xml_text, count=1)
    try:
        root = ET.fromstring(cleaned)
    except ET.ParseError as exc:
        raise SmiParseError("nvidia-smi -q -x output is not valid XML: %s" % exc)
    if root.tag != "nvidia_smi_log":
        raise SmiParseError("nvidia-smi -q -x output has root <%s>, expected <nvidia_smi_log>" % root.tag)
    header = {
        "driver_version": _text(root, "driver_version"),
        "cuda_driver_version": _text(root, "cuda_version"),
        "attached_gpus": _int_or_none(_text(root, "attached_gpus")),
    }
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        name = _text(gpu, "product_name")
        architecture = _text(gpu, "product_architecture")
        cc = _text(gpu, "cuda_compute_capability") or _text(gpu, "compute_cap")
        cc_source = "nvidia-smi" if cc else None
        if not cc:
            cc = compute_capability_from_name(architecture, name)
            cc_source = "architecture-table" if cc else None
        pci_bus_id = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
        gpus.append({
            "index": index,
            "uuid": _text(gpu, "uuid"),
            "name": name,
            "architecture": architecture,
            "pci_bus_id": pci_bus_id,
            "memory_total_bytes": parse_memory(_text(gpu, "fb_memory_usage/total")),
            "memory_used_bytes": parse_memory(_text(gpu, "fb_memory_usage/used")),
            "memory_reserved_bytes": parse_memory(_text(gpu, "fb_memory_usage/reserved")),
            "compute_capability": cc,
            "compute_capability_source": cc_source,
            "pcie_gen": _int_or_none(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "pcie_width": _int_or_none(_text(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
            "pcie_gen_max": _int_or_none(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "pcie_width_max": _int_or_none(_text(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
            "numa_node": None,
            "persistence_mode": _yes_no(_text(gpu, "persistence_mode")),
            "mig_mode": _yes_no(_text(gpu, "mig_mode/current_mig")),
            "processes": _processes_from_xml(gpu),
            "ecc": _ecc_from_xml(gpu),
            "recovery_action": _text(gpu, "gpu_recovery_action"),
            "fabric_state": _text(gpu, "fabric/state"),
        })
    return header, gpus


def _split_header(line):
    """Header cells of a topo matrix: tab separated when intact, 2+ spaces when pasted."""
    line = strip_ansi(line).strip("\n")
    if "\t" in line:
        cells = [c.strip() for c in line.split("\t")]
    else:
        cells = [c.strip() for c in re.split(r"\s{2,}", line)]
    cells = [c for c in cells if c]
    # A pasted header can glue a single-space separated device list: "GPU0 GPU1    CPU Affinity".
    out = []
    for cell in cells:
        parts = cell.split(" ")
        if len(parts) > 1 and all(re.match(r"^(GPU|NIC)\d+$|^mlx\d+_\d+$", p) for p in parts):
            out.extend(parts)
        else:
            out.append(cell)
    return out


def _gpu_rows(lines):
    """(GPU index, the cells after its label) for each GPU row of a topo matrix, up to the blank line or the legend
    that ends it. Other rows (NICs) are skipped."""
    seen_row = False
    for line in lines:
        tokens = line.split()
        if not tokens:
            if seen_row:
                return
            continue
        if tokens[0].startswith("Legend"):
            return
        match = _GPU_LABEL_RE.match(tokens[0])
        if match:
            seen_row = True
            yield int(match.group(1)), tokens[1:]


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m``.

    Returns {"gpu_count": n, "links": {(i, j): "NV4"|"PIX"|...}, "numa": {i: int|None},
    "cpu_affinity": {i: str|None}}. Device columns other than GPUs (NICs) are skipped.
    """
    lines = [strip_ansi(line) for line in (text or "").splitlines()]
    header = None
    header_idx = None
    for idx, line in enumerate(lines):
        cells = _split_header(line)
        if cells and cells[0] == "GPU0":
            header, header_idx = cells, idx
            break
    if header is None:
        raise SmiParseError("nvidia-smi topo -m output has no GPU0 header line")
    device_cols = []
    for cell in header:
        if "Affinity" in cell or cell == "GPU NUMA ID":
            break
        device_cols.append(cell)
    trailing = header[len(device_cols):]
    gpu_cols = [i for i, c in enumerate(device_cols) if _GPU_LABEL_RE.match(c)]
    gpu_ids = [int(_GPU_LABEL_RE.match(device_cols[i]).group(1)) for i in gpu_cols]
    links = {}
    numa = {}
    affinity = {}
    for row, values in _gpu_rows(lines[header_idx + 1:]):
        for col_pos, col in zip(gpu_cols, gpu_ids):
            if col_pos >= len(values):
                continue
            value = values[col_pos]
            if col == row or value == "X":
                continue
            if value.startswith("NV") or value in LINK_TYPES:
                pair = (min(row, col), max(row, col))
                links.setdefault(pair, value)
        # Trailing columns are read from the right: a pasted row can lose a separator among the NIC columns.
        tail = values[-len(trailing):] if trailing and len(values) > len(trailing) else []
        cells = dict(zip(trailing, tail))
        numa[row] = _int_or_none(cells.get("NUMA Affinity")) if cells.get("NUMA Affinity") not in (None, "N/A") else None
        cpu = cells.get("CPU Affinity")
        affinity[row] = cpu if cpu and cpu != "N/A" else None
    return {"gpu_count": len(gpu_ids), "links": links, "numa": numa, "cpu_affinity": affinity}


def parse_topo_p2p(text):
    """Parse ``nvidia-smi topo -p2p r|w|n|a|p``. Returns {(i, j): status} for i < j (the upper triangle,
    falling back to the lower one when the matrix is not symmetric the upper value wins)."""
    lines = [strip_ansi(line) for line in (text or "").splitlines()]
    for idx, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and all(_GPU_LABEL_RE.match(t) for t in tokens):
            header_ids = [int(_GPU_LABEL_RE.match(t).group(1)) for t in tokens]
            break
    else:
        raise SmiParseError("nvidia-smi topo -p2p output has no GPU header line")
    result = {}
    for row, values in _gpu_rows(lines[idx + 1:]):
        for col, value in zip(header_ids, values):
            if col == row or value == "X":
                continue
            pair = (min(row, col), max(row, col))
            if row < col or pair not in result:
                result[pair] = value
    return result


def nvlink_count(link_type):
    match = re.match(r"^NV(\d+)$", link_type or "")
    return int(match.group(1)) if match else 0


def detect_nvswitch(gpus, links, host_evidence=None):
    """Decide whether the GPUs sit on an NVSwitch fabric. Returns {"present": bool, "evidence": [...]}.

    Evidence, strongest first: host device nodes (/dev/nvidia-nvswitch*, /proc/driver/nvidia-nvswitch),
    NVML reporting a switch at the far end of an NVLink, a fabric state reported per GPU (Hopper and later
    on NVSwitch systems), and more than four GPUs all pairwise NVLink-connected (a direct mesh cannot
    do that: each GPU has at most 18 links and NVIDIA's direct meshes stop at four GPUs).
    """
    evidence = list(host_evidence or [])
    for gpu in gpus:
        state = gpu.get("fabric_state")
        if state and state not in ("N/A", "Not Supported", "Not supported"):
            evidence.append("GPU %s reports NVLink fabric state %r" % (gpu.get("index"), state))
            break
    n = len(gpus)
    if n > 4:
        pairs = list(itertools.combinations(range(n), 2))
        if all(nvlink_count(links.get("%d-%d" % p, {}).get("type")) > 0 for p in pairs):
            evidence.append("all %d GPUs are pairwise connected by NVLink (%s)" % (
                n, links.get("0-1", {}).get("type")))
    return {"present": bool(evidence), "evidence": evidence}


def build_links(gpu_count, topo_links, p2p_read=None, p2p_write=None, p2p_nvlink=None):
    """Merge topo -m and topo -p2p matrices into the ``links`` fact: {"i-j": {...}} for every i < j."""
    links = {}
    for i, j in itertools.combinations(range(gpu_count), 2):
        link_type = topo_links.get((i, j))
        links["%d-%d" % (i, j)] = {
            "type": link_type,
            "nvlink_count": nvlink_count(link_type),
            "p2p_read": (p2p_read or {}).get((i, j)),
            "p2p_write": (p2p_write or {}).get((i, j)),
            "p2p_nvlink": (p2p_nvlink or {}).get((i, j)),
        }
    return links


def assemble(xml_text, topo_text=None, p2p_texts=None, host_evidence=None):
    """Build the full topology fact from nvidia-smi outputs. ``p2p_texts`` maps 'r'/'w'/'n' to text (or None).

    Returns (facts, warnings)."""
    warnings = []
    header, gpus = parse_query_xml(xml_text)
    topo = {"links": {}, "numa": {}, "cpu_affinity": {}, "gpu_count": len(gpus)}
    if len(gpus) and topo_text is not None:
        try:
            topo = parse_topo_matrix(topo_text)
        except SmiParseError as exc:
            warnings.append(str(exc))
        if topo["gpu_count"] and topo["gpu_count"] != len(gpus):
            warnings.append("nvidia-smi topo -m lists %d GPUs but -q -x lists %d" % (topo["gpu_count"], len(gpus)))
    for gpu in gpus:
        gpu["numa_node"] = topo["numa"].get(gpu["index"])
        gpu["cpu_affinity"] = topo["cpu_affinity"].get(gpu["index"])
    p2p = {}
    for key in ("r", "w", "n"):
        text = (p2p_texts or {}).get(key)
        if text is None or len(gpus) < 2:
            p2p[key] = {}
            continue
        try:
            p2p[key] = parse_topo_p2p(text)
        except SmiParseError as exc:
            warnings.append("topo -p2p %s: %s" % (key, exc))
            p2p[key] = {}
    links = build_links(len(gpus), topo["links"], p2p["r"], p2p["w"], p2p["n"])
    facts = {
        "driver_version": header["driver_version"],
        "cuda_driver_version": header["cuda_driver_version"],
        "gpus": gpus,
        "links": links,
        "nvswitch": detect_nvswitch(gpus, links, host_evidence),
    }
    return facts, warnings


def collect(run, smi_path):
    """Run nvidia-smi through ``run(argv) -> (rc, stdout, stderr)`` and assemble the topology fact.

    Returns (facts or None, status, message, warnings). status: ok | no_gpu | no_driver |
    driver_library_mismatch | gpu_lost | no_permission | error."""
    rc, out, err = run([smi_path, "-q", "-x"])
    if rc != 0 or not (out or "").strip():
        text = ((out or "") + "\n" + (err or "")).strip()
        status = classify_smi_failure(text)
        first = text.splitlines()[0] if text else "no output"
        return None, status, "nvidia-smi -q -x failed (rc=%s): %s" % (rc, first), []
    warnings = []
    try:
        header, gpus = parse_query_xml(out)
    except SmiParseError as exc:
        return None, "error", str(exc), []
    if not gpus:
        facts, _w = assemble(out)
        return facts, "no_gpu", "nvidia-smi reports no GPU", []
    topo_text = None
    rc, topo_out, topo_err = run([smi_path, "topo", "-m"])
    if rc == 0:
        topo_text = topo_out
    else:
        warnings.append("nvidia-smi topo -m failed (rc=%s): %s" % (rc, (topo_err or topo_out or "").strip()[:200]))
    p2p_texts = {}
    if len(gpus) > 1:
        for key in ("r", "w", "n"):
            rc, p2p_out, p2p_err = run([smi_path, "topo", "-p2p", key])
            if rc == 0:
                p2p_texts[key] = p2p_out
            else:
                warnings.append("nvidia-smi topo -p2p %s failed (rc=%s): %s" % (key, rc, (p2p_err or p2p_out or "").strip()[:200]))
    facts, more = assemble(out, topo_text, p2p_texts)
    warnings.extend(more)
    return facts, "ok", "nvidia-smi: %d GPU(s)" % len(facts["gpus"]), warnings

#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_fault_flag_info
short_description: Read a host's GPU fault flag, and the time after which a return counts Xids
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Read-only. Reads the Xid monitor's GPU fault flag (O(path)) and C(<path>.returning), where a return
    (M(onprem.vllm.gpu_fault_flag) O(onprem.vllm.gpu_fault_flag#module:state=returning)) sets it aside until the host
    is back in rotation. Either file means the host is out of rotation after a GPU fault; a set-aside file alone is
    left by a return that did not finish.
  - Returns the events of both, when the fault was flagged, and RV(xids_after), the time after which the return's GPU
    preflight counts Xids (M(onprem.vllm.gpu_health_info) O(onprem.vllm.gpu_health_info#module:xids_after)) - an
    Xid logged at or before the fault belongs to the fault that took the host out.
extends_documentation_fragment:
  - onprem.vllm.read_only
options:
  path:
    description: The GPU fault flag (the monitoring role's C(monitoring_xid_drain_flag)).
    type: path
    required: true
  confirmed_after:
    description:
      - The operator's word that the GPU was fixed at this time (seconds since the epoch, or ISO 8601 with its offset,
        e.g. C(2026-12-05T10:10:00+01:00)), for Xids the fix itself logged after the fault (a GPU reset can). When
        later than the fault, RV(xids_after) is this time.
    type: str
notes:
  - A file that exists but cannot be read fails the module; it is never taken for an absent flag.
"""

EXAMPLES = r"""
- name: Read the host's GPU fault flag
  onprem.vllm.gpu_fault_flag_info:
    path: /var/lib/onprem-vllm-gpu-fault/xid.json
  register: gpu_fault

- name: Refuse a host out of rotation after a GPU fault
  ansible.builtin.assert:
    that: not gpu_fault.fault
    fail_msg: "out of rotation since {{ gpu_fault.fault_time }}: {{ gpu_fault.events | map(attribute='code') | join(', ') }}"
"""

RETURN = r"""
fault:
  description: The host is out of rotation after a GPU fault (the flag, or the flag set aside by a return that did not
    finish).
  returned: always
  type: bool
flagged:
  description: The flag itself exists (the servers' middleware fails C(/health)).
  returned: always
  type: bool
returning:
  description: C(<path>.returning) exists (a return set the flag aside and has not put the host back in rotation).
  returned: always
  type: bool
files:
  description: The files of the two that exist.
  returned: always
  type: list
  elements: str
events:
  description: The Xid events of both files (code, pci_bus_id, severity, description, seen), each once, oldest first.
  returned: always
  type: list
  elements: dict
fault_time:
  description: When the fault was flagged (ISO 8601, UTC) - the latest time the monitor saw one of its events, else
    when the flag was written; null without a fault.
  returned: always
  type: str
  sample: "2026-12-05T09:00:02+00:00"
xids_after:
  description: The later of RV(fault_time) and O(confirmed_after) (ISO 8601, UTC); null without a fault.
  returned: always
  type: str
  sample: "2026-12-05T09:00:02+00:00"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_fault_flag
from ansible_collections.onprem.vllm.plugins.module_utils.gpu_health_checks import parse_time


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True), confirmed_after=dict(type="str")),
        supports_check_mode=True,
    )
    path, confirmed = module.params["path"], module.params["confirmed_after"]
    try:
        confirmed_after = parse_time(confirmed) if confirmed else None
    except ValueError as exc:
        module.fail_json(msg="confirmed_after: %s" % exc)
    try:
        flag, returning = gpu_fault_flag.read(path)
    except OSError as exc:
        module.fail_json(msg="cannot read the GPU fault flag %s (or its set-aside file): %s" % (path, exc))
    state = gpu_fault_flag.view(flag, returning)
    fault_time = state["fault_time"]
    xids_after = None if fault_time is None else max(fault_time, confirmed_after or fault_time)
    module.exit_json(
        changed=False,
        fault=state["fault"],
        flagged=state["flagged"],
        returning=state["returning"],
        files=[p for p, f in ((path, flag), (gpu_fault_flag.returning_path(path), returning)) if f is not None],
        events=state["events"],
        fault_time=None if fault_time is None else gpu_fault_flag.format_time(fault_time),
        xids_after=None if xids_after is None else gpu_fault_flag.format_time(xids_after),
    )


if __name__ == "__main__":
    main()

#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_fault_flag
short_description: Set a host's GPU fault flag aside for its return, put it back, or remove it once the host is back
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - The Xid monitor's GPU fault flag (O(path)) keeps a host out of rotation - its servers' middleware fails
    C(/health) while it exists. A return (C(playbooks/gpu_return.yml)) needs the gates to reach the servers, but must
    not lose the flag before the host is back, so it sets the flag aside as C(<path>.returning), which the middleware
    does not read and everything else reads as the flag (M(onprem.vllm.gpu_fault_flag_info)).
  - O(state=returning) sets the flag aside (merged into a set-aside file a stopped return left); O(state=present)
    puts it back (a server failed its gates), merged with a flag the monitor wrote meanwhile, or writes a flag without
    events where both are gone; O(state=absent) removes the set-aside file once every server is back in rotation,
    and fails, removing nothing, where the monitor flagged the host again meanwhile.
  - Each step is a rename or a whole file written through a temporary file renamed over the old one; a run killed
    between two steps leaves files the next run takes on from. The decisions are in C(module_utils/gpu_fault_flag.py).
options:
  path:
    description: The GPU fault flag (the monitoring role's C(monitoring_xid_drain_flag)).
    type: path
    required: true
  state:
    description: Where the flag is taken (see the description).
    type: str
    required: true
    choices: [returning, present, absent]
  xids_checked_after:
    description:
      - With O(state=returning), the time after which the return's GPU preflight counted Xids
        (M(onprem.vllm.gpu_fault_flag_info)'s RV(onprem.vllm.gpu_fault_flag_info#module:xids_after); seconds since the
        epoch or ISO 8601 with its offset). A fault flagged later than it was not checked - the module then fails and
        changes nothing (a flag it set aside in that moment is put back).
    type: str
notes:
  - Check mode is supported.
attributes:
  check_mode:
    description: Reports what would change and changes nothing.
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
"""

EXAMPLES = r"""
- name: Set the GPU fault flag aside (the gates reach the servers; the flag is kept)
  onprem.vllm.gpu_fault_flag:
    path: /var/lib/onprem-vllm-gpu-fault/xid.json
    state: returning
    xids_checked_after: "{{ gpu_fault.xids_after }}"

- name: Remove it once every server of the host is back in rotation
  onprem.vllm.gpu_fault_flag:
    path: /var/lib/onprem-vllm-gpu-fault/xid.json
    state: absent
"""

RETURN = r"""
flagged:
  description: The flag exists after the run (in check mode, now); the host's servers fail C(/health).
  returned: always
  type: bool
returning:
  description: C(<path>.returning) exists after the run (in check mode, now).
  returned: always
  type: bool
steps:
  description: What was done (or would be, in check mode), in order - C(rename flag returning), C(write flag),
    C(remove returning), ...
  returned: always
  type: list
  elements: str
"""

import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_fault_flag
from ansible_collections.onprem.vllm.plugins.module_utils.gpu_health_checks import parse_time


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", required=True, choices=list(gpu_fault_flag.STATES)),
            xids_checked_after=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    path, state, checked = module.params["path"], module.params["state"], module.params["xids_checked_after"]
    try:
        checked_after = parse_time(checked) if checked else None
    except ValueError as exc:
        module.fail_json(msg="xids_checked_after: %s" % exc)

    def decide(target):
        try:
            flag, returning = gpu_fault_flag.read(path)
        except OSError as exc:
            module.fail_json(msg="cannot read the GPU fault flag %s (or its set-aside file): %s" % (path, exc))
        return gpu_fault_flag.transition(target, flag, returning, int(time.time()), socket.gethostname(), checked_after)

    def act(steps):
        try:
            gpu_fault_flag.apply(steps, path)
        except OSError as exc:
            module.fail_json(msg="cannot change the GPU fault flag %s: %s" % (path, exc), steps=described(steps))

    steps, error = decide(state)
    if error:
        module.fail_json(msg=error, steps=[])
    if steps and not module.check_mode:
        act(steps)
        if state == "returning":
            # The monitor may have extended the flag between the read and the rename: an Xid the preflight did not
            # check must not return with it.
            _none, error = decide("returning")
            if error:
                act(decide("present")[0])
                module.fail_json(msg=error, steps=described(steps))
    flag, returning = gpu_fault_flag.read(path)
    module.exit_json(changed=bool(steps), flagged=flag is not None, returning=returning is not None,
                     steps=described(steps))


def described(steps):
    return [" ".join(str(part) for part in step[:3] if isinstance(part, str)) for step in steps]


if __name__ == "__main__":
    main()

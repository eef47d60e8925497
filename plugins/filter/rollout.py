# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: serial_batches
short_description: The batches a C(serial) play makes of its hosts
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Splits a play's hosts into the batches Ansible runs for a C(serial) value (a count, a percentage such as C(25%),
    or a list of them whose last entry repeats), by Ansible's own rule. The rollout uses the first batch as its canary.
positional: hosts
options:
  _input:
    description: The play's C(serial) value; empty or 0 means all hosts in one batch.
    type: raw
    required: true
  hosts:
    description: The play's hosts in play order, such as C(ansible_play_hosts_all).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Show the canary of a [1, '25%'] ramp
  ansible.builtin.debug:
    msg: "{{ [1, '25%'] | onprem.vllm.serial_batches(ansible_play_hosts_all) | first }}"
"""

RETURN = r"""
_value:
  description: One list of host names per batch, in the order Ansible runs them.
  type: list
  elements: list
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.onprem.vllm.plugins.module_utils.rollout_batches import SerialError, serial_batches as _batches


def serial_batches(serial, hosts):
    try:
        return _batches(serial, list(hosts))
    except SerialError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"serial_batches": serial_batches}

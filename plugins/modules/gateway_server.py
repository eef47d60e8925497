#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: gateway_server
short_description: Take a vLLM host out of the fleet gateway's rotation (drain) or put it back
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Runs on the gateway host and talks to the gateway's HAProxy admin socket (runtime API).
  - C(state=maint) drains the server (no new requests), waits until its requests in flight and queued are done,
    then puts it in maintenance (health checks stop too). C(state=drain) stops after the wait.
  - C(state=ready) puts the server back; with O(fresh_check) its health is forced DOWN first (leaving maintenance,
    HAProxy would otherwise report at once the health it had before), so with O(wait) the module returns only once
    HAProxy's own checks have passed again after the undrain. A server that does not come UP in time is put back in
    maintenance (it stays drained) and the module fails.
  - With O(hold), a drain of a backend's last server in rotation first puts the backend on hold at the gateway, where
    its requests wait (at most O(hold) seconds) until a server of the backend is UP again, instead of getting 503.
    C(state=ready) ends a hold of the backend once the server is UP, and returns what it held.
options:
  socket:
    description: Path of the HAProxy admin socket on the gateway host.
    type: path
    default: /run/onprem-gateway/admin.sock
  backend:
    description: HAProxy backend that holds the vLLM hosts.
    type: str
    default: vllm
  server:
    description: The server's name in the backend (the role uses the inventory hostname).
    type: str
    required: true
  state:
    description: Wanted state of the server.
    type: str
    required: true
    choices: [ready, drain, maint]
  wait:
    description: Wait for in-flight requests to finish (drain, maint) or for a passed health check (ready).
    type: bool
    default: true
  fresh_check:
    description:
      - For C(state=ready) of a server out of rotation, force its health DOWN before putting it back, so that only
        fresh passing health checks bring it UP.
    type: bool
    default: true
  timeout:
    description: Seconds the wait may take before the module fails.
    type: int
    default: 600
  poll_interval:
    description: Seconds between two reads of the server's statistics.
    type: float
    default: 0.5
  hold:
    description:
      - For C(state=drain) or C(state=maint) where no other server of the backend is in rotation (the deployment's
        only server is restarted), seconds the gateway holds the backend's requests until a server is UP again.
      - C(0) holds nothing (requests get the gateway's JSON 503 with Retry-After while no server is UP).
      - A gateway whose configuration predates holds (no C(onprem hold) command) is drained without one.
    type: int
    default: 0
  state_file:
    description:
      - HAProxy's server-state file on the gateway host (its C(server-state-file), loaded when HAProxy starts or
        reloads). After each command sent, the servers' states are written there (atomically, fsync'd), so a drained
        server stays drained across a reload, a restart of the container and a reboot of the host.
      - Omitted, the state lives only in HAProxy's memory.
    type: path
attributes:
  check_mode:
    support: full
    description: In check mode nothing is sent to HAProxy; the result says whether the state would change.
  diff_mode:
    support: full
    description:
      - "Returns the server's admin state (READY, DRAIN or MAINT) before and after, e.g. C(vllm/ws1: READY) to
        C(vllm/ws1: MAINT); in check mode the state it would reach."
"""

EXAMPLES = r"""
- name: Take the host out of rotation once its requests are done
  onprem.vllm.gateway_server:
    server: "{{ inventory_hostname }}"
    state: maint
  delegate_to: "{{ groups['vllm_gateways'][0] }}"

- name: Put it back and wait until the gateway's health check passes
  onprem.vllm.gateway_server:
    server: "{{ inventory_hostname }}"
    state: ready
    timeout: 120
  delegate_to: "{{ groups['vllm_gateways'][0] }}"
"""

RETURN = r"""
before:
  description: HAProxy's status of the server before the change (UP, DOWN, DRAIN, MAINT, ...).
  returned: always
  type: str
  sample: UP
status:
  description: HAProxy's status of the server at the end.
  returned: always
  type: str
  sample: MAINT
in_flight_before:
  description: Requests running on or queued for the server when the module started.
  returned: always
  type: int
  sample: 2
in_flight:
  description: Requests running on or queued for the server at the end.
  returned: always
  type: int
  sample: 0
waited:
  description: Seconds spent waiting (for requests to finish, or for the health check).
  returned: always
  type: float
  sample: 1.5
started:
  description: Wall-clock time (seconds since the epoch) at which the module began (the drain started).
  returned: always
  type: float
  sample: 1767225598.75
timestamp:
  description: Wall-clock time (seconds since the epoch) at which the server reached the state.
  returned: always
  type: float
  sample: 1767225600.25
hold:
  description:
    - The hold of the backend's requests this call began (drain, maint) or ended (ready), as the gateway counts it
      (V(null) when there was none); C(held) requests have waited for a server, the longest C(longest_ms).
  returned: always
  type: dict
  sample: {backend: vllm-embed, remaining_ms: 299800, waiting: 0, held: 12, longest_ms: 41250}
commands:
  description: Runtime API commands sent (or that would be sent in check mode).
  returned: always
  type: list
  elements: str
  sample: [set server vllm/ws1 state drain, set server vllm/ws1 state maint]
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils.haproxy_runtime import (
    RuntimeError_,
    RuntimeSocket,
    admin_state,
    commands_for,
    find_server,
    hold_command,
    in_flight,
    is_serving,
    others_serving,
    parse_hold_answer,
    release_command,
    save_server_state,
    wait_for,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", default="/run/onprem-gateway/admin.sock"),
            backend=dict(type="str", default="vllm"),
            server=dict(type="str", required=True),
            state=dict(type="str", required=True, choices=["ready", "drain", "maint"]),
            wait=dict(type="bool", default=True),
            fresh_check=dict(type="bool", default=True),
            timeout=dict(type="int", default=600),
            poll_interval=dict(type="float", default=0.5),
            state_file=dict(type="path"),
            hold=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    params = module.params
    api = RuntimeSocket(params["socket"])
    backend, server, state = params["backend"], params["server"], params["state"]

    def fetch():
        return find_server(api.stat_rows(), backend, server)

    def send(cmd):
        """One runtime command, then the states saved where HAProxy loads them (a reload must not undo a drain)."""
        api.set_command(cmd)
        if params["state_file"]:
            try:
                save_server_state(params["state_file"], api.server_state)
            except OSError as exc:
                raise RuntimeError_(f"`{cmd}` was applied, but the server-state file {params['state_file']} could not "
                                    f"be written ({exc}): a reload of the gateway would forget it. Check the folder "
                                    "(gateway_state_dir) exists on the gateway host") from exc

    def admin_line(admin):
        return f"{backend}/{server}: {admin.upper()}\n"

    started = time.time()
    try:
        row = fetch()
        before = row.get("status", "")
        result = dict(changed=False, before=before, in_flight_before=in_flight(row), waited=0.0, started=started,
                      hold=None)
        commands = commands_for(before, state, backend, server, params["fresh_check"])
        result["commands"] = commands
        result["changed"] = bool(commands)

        def note_after(admin):
            """The diff's after: the state asked for in check mode, what HAProxy reports (or was set to) otherwise."""
            if module._diff:
                result["diff"] = dict(before=admin_line(admin_state(before)), after=admin_line(admin))

        note_after(state)
        if module.check_mode:
            module.exit_json(status=before, in_flight=in_flight(row), timestamp=time.time(), **result)
        if state in ("drain", "maint") and params["hold"] > 0 and not others_serving(api.stat_rows(), backend, server):
            # Before the drain: from its first command on, no other server would take the backend's requests.
            result["hold"] = parse_hold_answer(api.command(hold_command(backend, params["hold"])))
        drain_cmds = [cmd for cmd in commands if cmd.endswith("state drain")]
        for cmd in drain_cmds:
            send(cmd)
        if state in ("drain", "maint") and params["wait"]:
            row, waited, finished = wait_for(fetch, lambda r: in_flight(r) == 0, params["timeout"],
                                             params["poll_interval"])
            result["waited"] = round(waited, 2)
            if not finished:
                note_after(admin_state(row.get("status", "")))
                module.fail_json(msg=f"{backend}/{server} still has {in_flight(row)} request(s) in flight after "
                                     f"{params['timeout']} s of draining: raise the timeout or look for stuck "
                                     "clients; the server stays drained", status=row.get("status"),
                                 in_flight=in_flight(row), timestamp=time.time(), **result)
        for cmd in commands:
            if cmd not in drain_cmds:
                send(cmd)
        row = fetch()
        # Only a server this call put back is waited for: one already in rotation but DOWN is the health check's.
        if state == "ready" and params["wait"] and commands:
            row, waited, finished = wait_for(fetch, lambda r: is_serving(r.get("status", "")), params["timeout"],
                                             params["poll_interval"])
            result["waited"] = round(waited, 2)
            if not finished:
                # Out of rotation again: a server the gateway cannot check must not flap back in later unverified.
                send(f"set server {backend}/{server} state maint")
                note_after("maint")
                module.fail_json(msg=f"{backend}/{server} did not pass a fresh health check by the gateway within "
                                     f"{params['timeout']} s (status {row.get('status')}, last check: "
                                     f"{row.get('check_status', '')} {row.get('check_desc', '')}; the gateway checks "
                                     f"{row.get('addr', 'its configured address')}): it stays drained (MAINT). Check "
                                     "that the gateway reaches the host (advertise host, port, bind address, "
                                     "firewall)",
                                 status=row.get("status"), in_flight=in_flight(row), timestamp=time.time(), **result)
        if params["state_file"] and (commands or not os.path.exists(params["state_file"])):
            # At the end too: a server put back is saved UP, not as the DOWN its fresh check started from; and a
            # gateway that has no file yet gets one. Not counted as a change: the file only mirrors HAProxy's state,
            # and the rollouts read `changed` as "this host was put back" (the undrain's canary).
            save_server_state(params["state_file"], api.server_state)
        if state == "ready" and is_serving(row.get("status", "")):
            result["hold"] = parse_hold_answer(api.command(release_command(backend)))
        note_after(admin_state(row.get("status", "")))
        if admin_state(row.get("status", "")) != state:
            module.fail_json(msg=f"{backend}/{server} is {row.get('status')} after {commands}, not {state}",
                             status=row.get("status"), in_flight=in_flight(row), timestamp=time.time(), **result)
        module.exit_json(status=row.get("status", ""), in_flight=in_flight(row), timestamp=time.time(), **result)
    except (RuntimeError_, OSError) as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()

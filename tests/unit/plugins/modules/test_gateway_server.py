# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway_server module against a real unix socket that speaks HAProxy's runtime API (conftest's
haproxy_socket): drain and undrain in check mode, applied, and again (nothing sent the second time), the diff of the
server's admin state, and the failures that leave the server out of rotation."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.modules import gateway_server

DRAIN = "set server vllm/ws1 state drain"
HEALTH_DOWN = "set server vllm/ws1 health down"
READY = "set server vllm/ws1 state ready"
MAINT = "set server vllm/ws1 state maint"


@pytest.fixture
def gateway(call_module):
    """gateway(fake, state, **args) -> (exit status, result) of the module on the fake's socket, with a diff."""
    def run(fake, state, **args):
        args = dict({"socket": fake.path, "server": "ws1", "state": state, "poll_interval": 0.01, "timeout": 5,
                     "_ansible_diff": True}, **args)
        return call_module(gateway_server, **args)
    return run


def sent(fake):
    """The state-changing commands the fake received (every `show ...` and hold left out), and forget them."""
    changes = [cmd for cmd in fake.commands if not cmd.startswith(("show ", "onprem "))]
    fake.commands.clear()
    return changes


def test_a_drain_of_the_last_server_in_rotation_holds_its_requests_until_one_is_up_again(gateway, haproxy_socket):
    """ws2 already out: draining ws1 leaves no server, so the backend is put on hold BEFORE the drain; the undrain
    of ws1 ends the hold once ws1 is UP and returns what it held. In check mode nothing is held."""
    fake = haproxy_socket("ws1", "ws2")
    fake.states["ws2"] = "maint"
    rc, check = gateway(fake, "maint", hold=300, _ansible_check_mode=True)
    assert rc == 0 and check["hold"] is None and fake.holds == {}
    rc, drained = gateway(fake, "maint", hold=300)
    assert rc == 0 and drained["hold"] == {"backend": "vllm", "remaining_ms": 300000, "waiting": 0, "held": 0,
                                           "longest_ms": 0}, drained
    assert [c for c in fake.commands if not c.startswith("show ")][:2] == ["onprem hold vllm 300", DRAIN]
    fake.commands.clear()
    rc, back = gateway(fake, "ready")
    assert rc == 0 and back["status"] == "UP" and back["hold"]["held"] == 3 and back["hold"]["longest_ms"] == 1500
    assert fake.commands[-1] == "onprem release vllm" and fake.holds == {}


@pytest.mark.parametrize("hold, others", [(0, "DOWN"), (300, "UP")])
def test_no_hold_without_a_bound_or_while_another_server_serves(gateway, haproxy_socket, hold, others):
    fake = haproxy_socket("ws1", "ws2")
    fake.health["ws2"] = others
    rc, drained = gateway(fake, "maint", hold=hold)
    assert rc == 0 and drained["hold"] is None and fake.holds == {}
    assert not [c for c in fake.commands if c.startswith("onprem hold")]


def test_a_gateway_without_holds_is_drained_and_undrained_as_before(gateway, haproxy_socket):
    fake = haproxy_socket("ws1", holds=False)
    rc, drained = gateway(fake, "maint", hold=300)
    assert rc == 0 and drained["status"] == "MAINT" and drained["hold"] is None
    rc, back = gateway(fake, "ready")
    assert rc == 0 and back["status"] == "UP" and back["hold"] is None


def test_drain_check_then_apply_then_again(gateway, haproxy_socket):
    fake = haproxy_socket("ws1", "ws2")
    rc, check = gateway(fake, "maint", _ansible_check_mode=True)
    assert rc == 0 and check["changed"] is True and check["commands"] == [DRAIN, MAINT]
    assert check["diff"] == {"before": "vllm/ws1: READY\n", "after": "vllm/ws1: MAINT\n"}
    assert sent(fake) == [] and fake.status("ws1") == "UP"

    fake.scur["ws1"] = 3  # requests in flight: maint only once they are done
    rc, apply = gateway(fake, "maint")
    assert rc == 0 and apply["changed"] is True and apply["status"] == "MAINT", apply.get("msg")
    assert apply["before"] == "UP" and apply["in_flight_before"] == 3 and apply["in_flight"] == 0
    assert apply["diff"] == {"before": "vllm/ws1: READY\n", "after": "vllm/ws1: MAINT\n"}
    assert sent(fake) == [DRAIN, MAINT] and fake.status("ws1") == "MAINT" and fake.status("ws2") == "UP"

    rc, again = gateway(fake, "maint")
    assert rc == 0 and again["changed"] is False and again["commands"] == [] and again["status"] == "MAINT"
    assert again["diff"] == {"before": "vllm/ws1: MAINT\n", "after": "vllm/ws1: MAINT\n"}
    assert sent(fake) == []


def test_maint_waits_for_the_requests_in_flight_before_maint(gateway, haproxy_socket):
    fake = haproxy_socket("ws1")
    fake.scur["ws1"] = 4
    rc, result = gateway(fake, "maint")
    assert rc == 0
    # One request finishes per `show stat` read: maint was sent only after the reads that saw 4, 3, 2, 1 and then 0.
    assert fake.commands.index(DRAIN) == 1 and fake.commands.index(MAINT) == 1 + 5
    assert fake.commands[:fake.commands.index(MAINT)].count("show stat") == 5 and result["waited"] > 0


def test_undrain_check_then_apply_then_again(gateway, haproxy_socket):
    fake = haproxy_socket("ws1", rise=3)
    fake.states["ws1"] = "maint"
    rc, check = gateway(fake, "ready", _ansible_check_mode=True)
    assert rc == 0 and check["changed"] is True and check["commands"] == [DRAIN, HEALTH_DOWN, READY]
    assert check["diff"] == {"before": "vllm/ws1: MAINT\n", "after": "vllm/ws1: READY\n"}
    assert sent(fake) == [] and fake.status("ws1") == "MAINT"

    rc, apply = gateway(fake, "ready")
    assert rc == 0 and apply["changed"] is True and apply["status"] == "UP", apply.get("msg")
    assert apply["diff"] == {"before": "vllm/ws1: MAINT\n", "after": "vllm/ws1: READY\n"}
    # forced DOWN before ready, so only fresh passing checks brought it back
    assert sent(fake) == [DRAIN, HEALTH_DOWN, READY] and fake.status("ws1") == "UP"

    rc, again = gateway(fake, "ready")
    assert rc == 0 and again["changed"] is False and again["commands"] == [] and sent(fake) == []
    assert again["diff"] == {"before": "vllm/ws1: READY\n", "after": "vllm/ws1: READY\n"}


def test_a_server_that_never_passes_its_check_goes_back_to_maint(gateway, haproxy_socket):
    fake = haproxy_socket("ws1", rise=10 ** 6)
    fake.states["ws1"] = "maint"
    rc, result = gateway(fake, "ready", timeout=1)
    assert rc == 1 and "did not pass a fresh health check by the gateway within 1 s" in result["msg"]
    assert "the gateway checks 10.0.0.1:8000" in result["msg"] and "it stays drained (MAINT)" in result["msg"]
    assert sent(fake) == [DRAIN, HEALTH_DOWN, READY, MAINT] and fake.status("ws1") == "MAINT"
    assert result["diff"] == {"before": "vllm/ws1: MAINT\n", "after": "vllm/ws1: MAINT\n"}


def test_a_drain_that_times_out_leaves_the_server_drained(gateway, haproxy_socket):
    fake = haproxy_socket("ws1")
    fake.scur["ws1"] = 10 ** 6
    rc, result = gateway(fake, "maint", timeout=1)
    assert rc == 1 and "request(s) in flight after 1 s of draining" in result["msg"]
    assert sent(fake) == [DRAIN] and fake.status("ws1") == "DRAIN"
    assert result["diff"] == {"before": "vllm/ws1: READY\n", "after": "vllm/ws1: DRAIN\n"}


def test_an_unknown_server_names_the_known_ones(gateway, haproxy_socket):
    fake = haproxy_socket("ws1", "ws2")
    rc, result = gateway(fake, "maint", server="ws9")
    assert rc == 1 and "server vllm/ws9 is not in the gateway's configuration (known in vllm: vllm/ws1, vllm/ws2)" in result["msg"]
    assert sent(fake) == []


def test_a_missing_socket_says_what_to_check(call_module, tmp_path):
    rc, result = call_module(gateway_server, socket=str(tmp_path / "absent.sock"), server="ws1", state="maint")
    assert rc == 1 and "is the gateway container running?" in result["msg"]


def test_ansible_check_and_diff_through_the_cli(run_module, haproxy_socket):
    """`ansible --check --diff` reaches the module: the diff comes back, nothing is sent."""
    fake = haproxy_socket("ws1")
    result = run_module("gateway_server", {"socket": fake.path, "server": "ws1", "state": "drain"}, check=True,
                        diff=True)
    assert result["changed"] is True and result["commands"] == [DRAIN]
    assert result["diff"] == {"before": "vllm/ws1: READY\n", "after": "vllm/ws1: DRAIN\n"}
    assert sent(fake) == []


def saved_admin_state(path):
    """{server: srv_admin_state} of a server-state file."""
    rows = [line.split() for line in path.read_text().splitlines()[2:]]
    return {row[3]: int(row[6]) for row in rows}


def test_every_change_is_saved_where_haproxy_loads_it_on_reload(gateway, haproxy_socket, tmp_path):
    """A drain survives a reload or restart of HAProxy only through its server-state file: written after each command,
    0640 with the folder's group, never in check mode; the undrain saves the server back in rotation."""
    fake = haproxy_socket("ws1", "ws2")
    state_file = tmp_path / "state" / "servers.state"
    state_file.parent.mkdir()
    rc, check = gateway(fake, "maint", state_file=str(state_file), _ansible_check_mode=True)
    assert rc == 0 and check["changed"] and not state_file.exists()

    rc, drained = gateway(fake, "maint", state_file=str(state_file))
    assert rc == 0 and drained["status"] == "MAINT", drained.get("msg")
    assert state_file.read_text().startswith("1\n# be_id ")
    assert saved_admin_state(state_file) == {"ws1": 1, "ws2": 0}
    assert oct(state_file.stat().st_mode & 0o777) == "0o640"
    assert state_file.stat().st_gid == state_file.parent.stat().st_gid
    # No temporary file left; the lock the writers of the file share stays.
    assert sorted(p.name for p in state_file.parent.iterdir()) == [".servers.state.lock", "servers.state"]

    rc, back = gateway(fake, "ready", state_file=str(state_file))
    assert rc == 0 and back["status"] == "UP", back.get("msg")
    assert saved_admin_state(state_file) == {"ws1": 0, "ws2": 0}


def test_a_gateway_without_a_state_file_gets_one_even_with_nothing_to_change(gateway, haproxy_socket, tmp_path):
    fake = haproxy_socket("ws1")
    fake.states["ws1"] = "maint"
    state_file = tmp_path / "servers.state"
    rc, result = gateway(fake, "maint", state_file=str(state_file))
    assert rc == 0 and result["changed"] is False and result["commands"] == [] and sent(fake) == []
    assert saved_admin_state(state_file) == {"ws1": 1}


def test_a_state_file_that_cannot_be_written_fails_and_says_where(gateway, haproxy_socket, tmp_path):
    fake = haproxy_socket("ws1")
    rc, result = gateway(fake, "maint", state_file=str(tmp_path / "missing" / "servers.state"))
    assert rc == 1 and "could not be written" in result["msg"] and "gateway_state_dir" in result["msg"]
    assert fake.status("ws1") == "DRAIN"  # applied: the message says so

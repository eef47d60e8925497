# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import threading
import time

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import haproxy_runtime
from ansible_collections.onprem.vllm.plugins.module_utils.haproxy_runtime import (
    RuntimeError_,
    RuntimeSocket,
    admin_state,
    commands_for,
    find_server,
    in_flight,
    is_serving,
    parse_stat,
    wait_for,
)

# Trimmed `show stat` of HAProxy 2.6.12 (Debian 12) as the gateway role configures it: the first columns, as printed.
STAT = """# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight
openai,FRONTEND,,,1,3,2000,40,1,2,0,0,0,,,,,OPEN,
vllm,fleet-ws1,0,0,2,2,,20,1,2,,0,,0,0,0,0,UP,1
vllm,fleet-ws2,1,1,0,1,,10,1,2,,0,,0,0,0,0,DRAIN,1
vllm,fleet-ws3,0,0,0,1,,10,1,2,,0,,0,0,0,0,MAINT,1
vllm,BACKEND,1,1,2,3,200,40,1,2,0,0,,0,0,0,0,UP,2

"""


def test_parse_stat_reads_rows_by_column_name():
    rows = parse_stat(STAT)
    assert [row["svname"] for row in rows] == ["FRONTEND", "fleet-ws1", "fleet-ws2", "fleet-ws3", "BACKEND"]
    assert find_server(rows, "vllm", "fleet-ws1")["scur"] == "2"


def test_parse_stat_refuses_other_output():
    with pytest.raises(RuntimeError_):
        parse_stat("Unknown command.\n")


def test_find_server_names_the_known_servers():
    with pytest.raises(RuntimeError_, match="vllm/fleet-ws1, vllm/fleet-ws2, vllm/fleet-ws3"):
        find_server(parse_stat(STAT), "vllm", "fleet-ws9")


def test_in_flight_counts_running_and_queued():
    rows = parse_stat(STAT)
    assert in_flight(find_server(rows, "vllm", "fleet-ws1")) == 2
    assert in_flight(find_server(rows, "vllm", "fleet-ws2")) == 1
    assert in_flight({"scur": "", "qcur": None}) == 0


@pytest.mark.parametrize("status, state", [
    ("UP", "ready"), ("DOWN", "ready"), ("UP 1/2", "ready"), ("DOWN 1/2", "ready"), ("no check", "ready"),
    ("DRAIN", "drain"), ("NOLB", "drain"), ("MAINT", "maint"), ("MAINT (via vllm/x)", "maint"), ("MAINT (resolution)", "maint"),
])
def test_admin_state(status, state):
    assert admin_state(status) == state


def test_is_serving_only_when_fully_up():
    assert is_serving("UP") and is_serving("no check")
    assert not is_serving("UP 1/2") and not is_serving("DOWN 1/2") and not is_serving("DRAIN")


def test_commands_drain_before_maint():
    assert commands_for("UP", "maint", "vllm", "ws1") == ["set server vllm/ws1 state drain",
                                                          "set server vllm/ws1 state maint"]
    assert commands_for("DRAIN", "maint", "vllm", "ws1") == ["set server vllm/ws1 state maint"]
    assert commands_for("MAINT", "maint", "vllm", "ws1") == []
    # Back in rotation only after fresh checks: forced DOWN before the admin state leaves MAINT/DRAIN.
    assert commands_for("MAINT", "ready", "vllm", "ws1") == ["set server vllm/ws1 state drain",
                                                             "set server vllm/ws1 health down",
                                                             "set server vllm/ws1 state ready"]
    assert commands_for("DRAIN", "ready", "vllm", "ws1") == ["set server vllm/ws1 health down",
                                                             "set server vllm/ws1 state ready"]
    assert commands_for("MAINT", "ready", "vllm", "ws1", fresh_check=False) == ["set server vllm/ws1 state ready"]
    assert commands_for("UP", "ready", "vllm", "ws1") == []
    assert commands_for("DOWN", "ready", "vllm", "ws1") == []
    with pytest.raises(RuntimeError_):
        commands_for("UP", "off", "vllm", "ws1")


def test_wait_for_returns_when_done(fake_clock):
    clock = fake_clock
    rows = iter([{"scur": "2"}, {"scur": "1"}, {"scur": "0"}])
    row, waited, finished = wait_for(lambda: next(rows), lambda r: in_flight(r) == 0, 10, 0.5, clock, clock.sleep)
    assert finished and row == {"scur": "0"} and waited == 1.0


def test_wait_for_gives_up_at_the_timeout(fake_clock):
    clock = fake_clock
    row, waited, finished = wait_for(lambda: {"scur": "3"}, lambda r: in_flight(r) == 0, 2, 0.5, clock, clock.sleep)
    assert not finished and waited >= 2 and in_flight(row) == 3


def test_runtime_socket_drains_after_requests_finish(haproxy_socket):
    fake = haproxy_socket("fleet-ws1", "fleet-ws2")
    fake.scur["fleet-ws1"] = 1
    api = RuntimeSocket(fake.path)
    row = find_server(api.stat_rows(), "vllm", "fleet-ws1")
    assert row["status"] == "UP"
    cmds = commands_for(row["status"], "maint", "vllm", "fleet-ws1")
    api.set_command(cmds[0])
    row, _waited, finished = wait_for(lambda: find_server(api.stat_rows(), "vllm", "fleet-ws1"),
                                      lambda r: in_flight(r) == 0, 5, 0.01)
    assert finished and row["status"] == "DRAIN"
    api.set_command(cmds[1])
    assert find_server(api.stat_rows(), "vllm", "fleet-ws1")["status"] == "MAINT"
    assert find_server(api.stat_rows(), "vllm", "fleet-ws2")["status"] == "UP"
    with pytest.raises(RuntimeError_, match="No such server"):
        api.set_command("set server vllm/fleet-ws9 state ready")


def test_runtime_socket_missing_socket_says_what_to_check(tmp_path):
    with pytest.raises(RuntimeError_, match="is the gateway container running"):
        RuntimeSocket(str(tmp_path / "absent.sock")).stat_rows()


STATE = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n3 vllm 1 ws1 10.0.0.1 2 1\n"


def test_server_state_output_is_checked_before_it_is_saved(tmp_path):
    with pytest.raises(RuntimeError_, match="unexpected `show servers state` output"):
        haproxy_runtime.write_server_state(str(tmp_path / "servers.state"), "Unknown command.\n")
    assert list(tmp_path.iterdir()) == []


def test_a_crash_before_the_rename_keeps_the_old_state_file(tmp_path, monkeypatch):
    """Killed between writing the new state and renaming it over the old one: the old file is whole, no temporary
    file is left (HAProxy never loads a torn file)."""
    path = tmp_path / "servers.state"
    path.write_text(STATE)

    def power_cut(src, dst):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(haproxy_runtime.os, "replace", power_cut)
    with pytest.raises(KeyboardInterrupt):
        haproxy_runtime.write_server_state(str(path), STATE.replace(" 2 1\n", " 2 0\n"))
    assert path.read_text() == STATE and [p.name for p in tmp_path.iterdir()] == ["servers.state"]


def test_two_drains_at_once_never_lose_one_in_the_state_file(tmp_path):
    """Drain A reads HAProxy's states (its own drain only), drain B applies its own and saves; without the lock A then
    wrote its older read over B's and B's server came back UP at the next reload. With it B waits for A and reads
    the states after both."""
    path = tmp_path / "servers.state"
    only_a = STATE.replace(" 2 1\n", " 2 1\n3 vllm 2 ws2 10.0.0.2 2 0\n")
    both = STATE.replace(" 2 1\n", " 2 1\n3 vllm 2 ws2 10.0.0.2 2 1\n")
    a_reading = threading.Event()

    def slow_read_of_a():
        a_reading.set()
        time.sleep(0.3)  # B's drain lands meanwhile
        return only_a

    drain_a = threading.Thread(target=haproxy_runtime.save_server_state, args=(str(path), slow_read_of_a))
    drain_a.start()
    assert a_reading.wait(5)
    haproxy_runtime.save_server_state(str(path), lambda: both)
    drain_a.join(5)
    assert path.read_text() == both


@pytest.mark.parametrize("statuses, serving", [
    ({"ws2": "UP"}, True), ({"ws2": "no check"}, True), ({"ws2": "UP 1/2"}, False), ({"ws2": "DOWN"}, False),
    ({"ws2": "MAINT"}, False), ({"ws2": "DRAIN"}, False), ({}, False), ({"ws2": "DOWN", "ws3": "UP"}, True)])
def test_others_serving_counts_only_other_servers_in_rotation_and_up(statuses, serving):
    rows = [{"pxname": "vllm-chat", "svname": "ws1", "status": "UP"},
            {"pxname": "vllm-embed", "svname": "ws9", "status": "UP"},
            {"pxname": "vllm-chat", "svname": "BACKEND", "status": "UP"}]
    rows += [{"pxname": "vllm-chat", "svname": name, "status": status} for name, status in statuses.items()]
    assert haproxy_runtime.others_serving(rows, "vllm-chat", "ws1") is serving


def test_hold_answers_are_read_and_a_gateway_without_holds_is_none():
    held = '{"backend":"vllm-embed","remaining_ms":1200,"waiting":1,"held":4,"longest_ms":900}\n'
    assert haproxy_runtime.parse_hold_answer(held) == {"backend": "vllm-embed", "remaining_ms": 1200, "waiting": 1,
                                                       "held": 4, "longest_ms": 900}
    assert haproxy_runtime.parse_hold_answer('{"backend":"vllm-embed","not_held":true}\n') is None
    assert haproxy_runtime.parse_hold_answer("Unknown command: 'onprem'\n") is None
    assert haproxy_runtime.hold_command("vllm-embed", 300) == "onprem hold vllm-embed 300"
    assert haproxy_runtime.release_command("vllm-embed") == "onprem release vllm-embed"
    for bad in ("onprem hold: no such backend, or seconds is not a positive number\n", "{not json"):
        with pytest.raises(haproxy_runtime.RuntimeError_):
            haproxy_runtime.parse_hold_answer(bad)

#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# idle-priority.sh COMMAND...: run COMMAND on the CPU the rest of the machine leaves idle (tools/test.sh runs the unit
# tests so beside the molecule scenarios). nice alone is not enough where the kernel groups processes by session
# (sched_autogroup_enabled): nice then ranks a process only within its session, and the niced unit tests beside the
# scenarios still took about half the CPU from the lab hosts' containers. In a session of its own whose autogroup is
# at nice 19, COMMAND weighs 15 against 1024 for any other session or container. A TERM or INT (tools/timed.sh's
# budget) stops the whole session.
setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' idle-priority "$@" &
session=$!
trap 'kill -TERM -- "-$session" 2>/dev/null' TERM INT
wait "$session"; rc=$?
while kill -0 "$session" 2>/dev/null; do wait "$session"; rc=$?; done  # a trapped signal ends the first wait early
exit $rc

# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One address's flood of slow connections against a gateway (issue #51): COUNT connections opened one after another,
each a request head that never ends and carries no key (over TLS when "tls" is given; the certificate is not checked,
an attacker does not care). Prints "holding" once all were tried, then, when every one has ended (or 30 s after the
first), one JSON list: each connection's start and end (seconds since the first) and the status the gateway answered
(None: refused at accept or closed without an answer). Run by molecule/fleet/security_checks.yml from a workstation
and by tests/unit/roles/test_gateway_routing.py from a container beside its gateway.
Usage: flood.py HOST PORT COUNT [tls]"""
import json
import selectors
import socket
import ssl
import sys
import time

host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
context = None
if sys.argv[4:] == ["tls"]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
selector, opened, held, started = selectors.DefaultSelector(), time.monotonic(), {}, {}


def ended(index, status):
    held[index] = {"started": started[index], "seconds": round(time.monotonic() - opened, 2), "status": status}


def reap(timeout):
    """Notes the connections the gateway answered or closed (when, and the status), and closes them here."""
    for key, _events in selector.select(timeout=timeout):
        try:
            data = key.fileobj.recv(65536)
        except ssl.SSLWantReadError:
            continue  # part of a TLS record: the rest comes
        except OSError:
            data = b""
        ended(key.data, data[9:12].decode() or None)
        selector.unregister(key.fileobj)
        key.fileobj.close()


for index in range(count):
    if selector.get_map():
        reap(0)  # while the flood is still opening: a held connection's end is seen when it comes
    started[index] = round(time.monotonic() - opened, 2)
    try:  # a connection refused at accept may be reset before connect (or the TLS handshake) returns
        sock = socket.create_connection((host, port), timeout=10)
        if context is not None:
            sock = context.wrap_socket(sock)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Length: 1000000\r\n")
    except OSError:
        ended(index, None)
        continue
    sock.setblocking(False)
    selector.register(sock, selectors.EVENT_READ, index)
print("holding", flush=True)
while len(held) < count and time.monotonic() - opened < 30:
    reap(1)
print(json.dumps(sorted(held.values(), key=lambda one: one["seconds"])))

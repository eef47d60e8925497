# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tls_identity module with the real openssl CLI on real files: a key (0600, or 0640 in a group) and a certificate
made on the first run, nothing on the second, the certificate issued again with the same key where its names change or
it expires soon, a new key only where it is gone, check mode changes nothing, the key never comes back. Then what the
identities are for: mutual TLS between a server and its pinned clients, with Python's ssl (OpenSSL) on 127.0.0.1."""
from __future__ import annotations

import grp
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import threading

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import tls_identity as tls
from ansible_collections.onprem.vllm.plugins.modules import tls_identity

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


@pytest.fixture
def identities(call_module):
    return lambda *items, **args: call_module(tls_identity, identities=list(items), **args)


def _identity(directory, ident="vllm", usage="server", names=("localhost", "127.0.0.1"), **options):
    return dict(id=ident, key_path=str(directory / (ident + ".key")), certificate_path=str(directory / (ident + ".crt")),
                common_name=ident, names=list(names), usage=usage, **options)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _openssl(*argv):
    return subprocess.run(["openssl", *argv], check=True, capture_output=True, text=True).stdout


def _certificate(path):
    return tls.parse_certificate_text(_openssl("x509", "-noout", "-text", "-in", str(path)))


def _public_key(certificate_path):
    return _openssl("x509", "-noout", "-pubkey", "-in", str(certificate_path))


def _warnings(result):
    """The module's warning texts (ansible-core 2.19 and later return them as structured events)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def _key_text(path):
    with open(path) as handle:
        return handle.read()


def test_the_first_run_makes_the_key_and_certificate_the_second_nothing(identities, tmp_path):
    item = _identity(tmp_path, names=["localhost", "127.0.0.1", "VLLM-1.lab", "::1"])
    rc, result = identities(item)
    assert rc == 0 and result["changed"] is True, result
    assert result["actions"] == {"vllm": ["create_key", "issue_certificate"]}
    assert result["reasons"] == {"vllm": ["no key"]}
    key, certificate = tmp_path / "vllm.key", tmp_path / "vllm.crt"
    assert _mode(key) == 0o600 and _mode(certificate) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["vllm.crt", "vllm.key"]  # no temporary file left behind
    parsed = _certificate(certificate)
    assert parsed["dns_names"] == ["localhost", "vllm-1.lab"] and parsed["ip_addresses"] == ["127.0.0.1", "::1"]
    assert parsed["usages"] == ["serverAuth"] and parsed["common_name"] == "vllm"
    text = _openssl("x509", "-noout", "-text", "-in", str(certificate))
    assert "CA:FALSE" in text and "ASN1 OID: prime256v1" in text  # an EC P-256 key, no CA
    assert _public_key(certificate) == _openssl("pkey", "-pubout", "-in", str(key))
    assert result["certificates"]["vllm"] == certificate.read_text()
    # The key never comes back (nor any part of it).
    assert "PRIVATE KEY" not in json.dumps(result) and _key_text(key).splitlines()[1] not in json.dumps(result)

    rc, again = identities(item)
    assert rc == 0 and again["changed"] is False, again
    assert again["actions"] == {"vllm": []} and again["reasons"] == {"vllm": []}
    assert again["certificates"]["vllm"] == result["certificates"]["vllm"]


def test_changed_names_issue_the_certificate_again_with_the_same_key(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    key_before = _key_text(tmp_path / "vllm.key")
    rc, result = identities(dict(item, names=["localhost", "vllm.lab"]))
    assert rc == 0 and result["actions"] == {"vllm": ["issue_certificate"]}
    assert result["reasons"] == {"vllm": ["names changed: +DNS:vllm.lab -IP:127.0.0.1"]}
    assert _key_text(tmp_path / "vllm.key") == key_before
    assert _certificate(tmp_path / "vllm.crt")["dns_names"] == ["localhost", "vllm.lab"]
    assert _certificate(tmp_path / "vllm.crt")["ip_addresses"] == []


def test_a_changed_usage_issues_the_certificate_again(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    rc, result = identities(dict(item, usage="client"))
    assert rc == 0 and result["reasons"] == {"vllm": ["usage changed: serverAuth -> clientAuth"]}
    assert _certificate(tmp_path / "vllm.crt")["usages"] == ["clientAuth"]


def test_a_removed_key_is_made_again_with_its_certificate(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    old_public = _public_key(tmp_path / "vllm.crt")
    os.unlink(tmp_path / "vllm.key")
    rc, result = identities(item)
    assert rc == 0 and result["actions"] == {"vllm": ["create_key", "issue_certificate"]}
    assert result["reasons"] == {"vllm": ["no key"]}
    new_public = _public_key(tmp_path / "vllm.crt")
    assert new_public != old_public and new_public == _openssl("pkey", "-pubout", "-in", str(tmp_path / "vllm.key"))


def test_a_certificate_of_another_key_is_issued_again(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    identities(_identity(tmp_path, ident="other"))
    shutil.copy(tmp_path / "other.crt", tmp_path / "vllm.crt")
    rc, result = identities(item)
    assert rc == 0 and "certificate does not match the key" in result["reasons"]["vllm"]
    assert _public_key(tmp_path / "vllm.crt") == _openssl("pkey", "-pubout", "-in", str(tmp_path / "vllm.key"))


def test_an_unreadable_certificate_is_issued_again(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    (tmp_path / "vllm.crt").write_text("not a certificate\n")
    rc, result = identities(item)
    assert rc == 0 and result["reasons"] == {"vllm": ["certificate unreadable"]}
    assert _certificate(tmp_path / "vllm.crt")["usages"] == ["serverAuth"]


def test_a_certificate_expiring_soon_is_issued_again_with_the_same_key(identities, tmp_path):
    item = _identity(tmp_path, days=1, renew_before_days=30)
    rc, first = identities(item)
    assert rc == 0 and first["actions"]["vllm"] == ["create_key", "issue_certificate"]
    assert any("renew_before_days" in warning for warning in _warnings(first))
    key_before = _key_text(tmp_path / "vllm.key")
    serial_before = _openssl("x509", "-noout", "-serial", "-in", str(tmp_path / "vllm.crt"))
    rc, result = identities(item)
    assert rc == 0 and result["actions"] == {"vllm": ["issue_certificate"]}
    assert len(result["reasons"]["vllm"]) == 1 and result["reasons"]["vllm"][0].startswith("expires ")
    assert _key_text(tmp_path / "vllm.key") == key_before
    assert _openssl("x509", "-noout", "-serial", "-in", str(tmp_path / "vllm.crt")) != serial_before


def test_check_mode_reports_and_changes_nothing(identities, tmp_path):
    item = _identity(tmp_path)
    rc, result = identities(item, _ansible_check_mode=True)
    assert rc == 0 and result["changed"] is True
    assert result["actions"] == {"vllm": ["create_key", "issue_certificate"]}
    assert result["certificates"] == {"vllm": ""} and os.listdir(tmp_path) == []

    identities(item)
    before = {name: (tmp_path / name).read_bytes() for name in ("vllm.key", "vllm.crt")}
    (tmp_path / "vllm.key").chmod(0o644)
    rc, result = identities(dict(item, names=["vllm.lab"]), _ansible_check_mode=True)
    assert rc == 0 and result["actions"] == {"vllm": ["issue_certificate", "key_attributes"]}
    assert result["certificates"]["vllm"] == before["vllm.crt"].decode()  # the existing one
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert _mode(tmp_path / "vllm.key") == 0o644 and sorted(os.listdir(tmp_path)) == ["vllm.crt", "vllm.key"]


def test_the_key_group_and_modes_are_kept_on_every_run(identities, tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    item = _identity(tmp_path, key_group=group)
    rc, result = identities(item)
    assert rc == 0 and _mode(tmp_path / "vllm.key") == 0o640 and os.stat(tmp_path / "vllm.key").st_gid == os.getgid()
    (tmp_path / "vllm.key").chmod(0o604)
    (tmp_path / "vllm.crt").chmod(0o600)
    rc, result = identities(item)
    assert rc == 0 and result["changed"] is True
    assert result["actions"] == {"vllm": ["key_attributes", "certificate_attributes"]}
    assert _mode(tmp_path / "vllm.key") == 0o640 and _mode(tmp_path / "vllm.crt") == 0o644
    rc, result = identities(dict(item, key_group=""))
    assert rc == 0 and result["actions"] == {"vllm": ["key_attributes"]} and _mode(tmp_path / "vllm.key") == 0o600


def test_diff_mode_shows_the_names_and_usage_not_the_key(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    rc, result = identities(dict(item, names=["vllm.lab"]), _ansible_diff=True)
    assert rc == 0 and len(result["diff"]) == 1
    diff = result["diff"][0]
    assert "names: DNS:localhost, IP:127.0.0.1" in diff["before"] and "names: DNS:vllm.lab" in diff["after"]
    assert "usage: serverAuth" in diff["after"] and "PRIVATE" not in json.dumps(result)


@pytest.mark.parametrize("change, message", [
    (dict(names=["bad name"]), "identity vllm: 'bad name' is neither an IP address nor a DNS name"),
    (dict(common_name="a/b"), "identity vllm: common name 'a/b'"),
    (dict(key_path="relative.key"), "key_path relative.key is not an absolute path"),
    (dict(days=0), "days must be at least 1"),
])
def test_bad_arguments_fail_before_anything_is_made(identities, tmp_path, change, message):
    rc, result = identities(dict(_identity(tmp_path), **change))
    assert rc == 1 and message in result["msg"] and os.listdir(tmp_path) == []


def test_an_id_or_a_path_given_twice_is_refused(identities, tmp_path):
    rc, result = identities(_identity(tmp_path), _identity(tmp_path, usage="client"))
    assert rc == 1 and "identity id vllm is given twice" in result["msg"]
    rc, result = identities(_identity(tmp_path), dict(_identity(tmp_path, ident="b"),
                                                      key_path=str(tmp_path / "vllm.key")))
    assert rc == 1 and "is used twice" in result["msg"] and os.listdir(tmp_path) == []


def test_a_missing_directory_is_made_private_and_check_mode_makes_none(identities, tmp_path):
    folder = tmp_path / "tls" / "server"
    rc, result = identities(_identity(folder), _ansible_check_mode=True)
    assert rc == 0 and result["actions"]["vllm"] == ["create_key", "issue_certificate"] and not folder.exists()
    rc, result = identities(_identity(folder))
    assert rc == 0 and result["actions"]["vllm"] == ["create_key", "issue_certificate"]
    assert _mode(folder) == 0o700 and _mode(folder / "vllm.key") == 0o600


def test_a_group_the_host_does_not_have_yet_leaves_the_key_private_until_it_exists(identities, tmp_path):
    missing = dict(_identity(tmp_path), key_group="onprem-no-such-group")
    rc, result = identities(missing)
    assert rc == 0 and _mode(tmp_path / "vllm.key") == 0o600
    assert result["pending_groups"] == {"vllm": "onprem-no-such-group"}
    # The group as it will be once its package is installed: here the test's own group, by name.
    rc, result = identities(dict(missing, key_group=grp.getgrgid(os.getgid()).gr_name))
    assert rc == 0 and result["actions"]["vllm"] == ["key_attributes"] and result["pending_groups"] == {}
    assert _mode(tmp_path / "vllm.key") == 0o640


def test_a_key_openssl_cannot_read_fails_and_is_kept(identities, tmp_path):
    item = _identity(tmp_path)
    identities(item)
    (tmp_path / "vllm.key").write_text("garbage\n")
    rc, result = identities(item)
    assert rc == 1 and "reading the key %s (remove it" % (tmp_path / "vllm.key") in result["msg"]
    assert (tmp_path / "vllm.key").read_text() == "garbage\n"


# Mutual TLS as the gateway, the vLLM servers and Prometheus use the identities: each side pins the other's
# self-signed certificate as its only trust anchor.

def _handshake(server_context, client_context, timeout=5.0):
    """(server's outcome, client's outcome) of one connection on 127.0.0.1: "ok" / the bytes the server sent, or the
    error. The server thread and every socket have timeouts, so nothing can hang."""
    outcome = {}
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(timeout)

        def serve():
            try:
                conn, _addr = listener.accept()
            except OSError as exc:
                outcome["server"] = exc
                return
            conn.settimeout(timeout)
            try:
                with server_context.wrap_socket(conn, server_side=True) as tls_conn:
                    tls_conn.sendall(b"pinned")
                    outcome["server"] = "ok"
            except (OSError, ssl.SSLError) as exc:
                outcome["server"] = exc
            finally:
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=timeout) as raw:
                with client_context.wrap_socket(raw, server_hostname="localhost") as tls_conn:
                    # TLS 1.3: the client's handshake ends before the server has checked the client's certificate;
                    # a refusal arrives as an alert on the first read.
                    outcome["client"] = tls_conn.recv(16)
        except (OSError, ssl.SSLError) as exc:
            outcome["client"] = exc
        thread.join(timeout + 1)
        assert not thread.is_alive(), "the server thread hung"
    return outcome["server"], outcome["client"]


def _server_context(server, trusted_clients):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server["certificate_path"], server["key_path"])
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=trusted_clients)
    return context


def _client_context(server, client):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=server["certificate_path"])
    if client is not None:
        context.load_cert_chain(client["certificate_path"], client["key_path"])
    return context


def _refused(outcome):
    server, client = outcome
    return isinstance(server, ssl.SSLError) and client != b"pinned"


def test_mutual_tls_accepts_the_pinned_client_only(identities, tmp_path):
    server = _identity(tmp_path, ident="vllm", usage="server", names=["localhost", "127.0.0.1"])
    client = _identity(tmp_path, ident="gateway", usage="client", names=["gateway.lab"])
    stranger = _identity(tmp_path, ident="stranger", usage="client", names=["gateway.lab"])
    rc, result = identities(server, client, stranger)
    assert rc == 0, result
    pinned = tmp_path / "clients.pem"  # uvicorn's --ssl-ca-certs: the concatenated client certificates
    pinned.write_text(result["certificates"]["gateway"])

    assert _handshake(_server_context(server, pinned), _client_context(server, client)) == ("ok", b"pinned")

    outcome = _handshake(_server_context(server, pinned), _client_context(server, stranger))
    assert _refused(outcome) and "certificate verify failed" in str(outcome[0]), outcome

    outcome = _handshake(_server_context(server, pinned), _client_context(server, None))
    assert _refused(outcome) and "did not return a certificate" in str(outcome[0]), outcome

    # The server's own certificate as a client's: refused, not pinned.
    outcome = _handshake(_server_context(server, pinned), _client_context(server, server))
    assert _refused(outcome) and "certificate verify failed" in str(outcome[0]), outcome


def test_mutual_tls_refuses_a_pinned_certificate_of_the_other_usage(identities, tmp_path):
    """Even where a server certificate is among the pinned client certificates (a mistaken concatenation), it is not
    a client's: its extended key usage is serverAuth alone. Likewise a client certificate pinned as a server's."""
    server = _identity(tmp_path, ident="vllm", usage="server", names=["localhost", "127.0.0.1"])
    client = _identity(tmp_path, ident="gateway", usage="client", names=["localhost", "127.0.0.1"])
    rc, result = identities(server, client)
    assert rc == 0, result
    pinned = tmp_path / "clients.pem"
    pinned.write_text(result["certificates"]["gateway"] + result["certificates"]["vllm"])

    assert _handshake(_server_context(server, pinned), _client_context(server, client)) == ("ok", b"pinned")
    outcome = _handshake(_server_context(server, pinned), _client_context(server, server))
    assert _refused(outcome) and "unsuitable certificate purpose" in str(outcome[0]), outcome

    # The client's identity serving, its certificate pinned by the client: refused by the client.
    outcome = _handshake(_server_context(client, pinned), _client_context(client, client))
    assert isinstance(outcome[1], ssl.SSLCertVerificationError) and "unsuitable certificate purpose" in str(outcome[1])

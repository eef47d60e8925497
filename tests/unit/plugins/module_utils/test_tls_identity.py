# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A TLS identity's decisions without I/O: the names a certificate carries, the extensions that make it, what
`openssl x509 -text` says of one (real openssl output), and each reason a certificate or a key is made again."""
from __future__ import annotations

import datetime
import shutil
import subprocess

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import tls_identity as tls

UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 12, 6, 19, 20, tzinfo=UTC)

DESIRED = dict(common_name="vllm-1", dns_names=["localhost", "vllm-1.lab"], ip_addresses=["10.0.0.5"],
               usage="server", days=3650, renew_before_days=30)
# What parse_certificate_text says of the certificate DESIRED issued.
CERTIFICATE = dict(common_name="vllm-1", dns_names=["localhost", "vllm-1.lab"], ip_addresses=["10.0.0.5"],
                   usages=["serverAuth"], not_after=NOW + datetime.timedelta(days=3000))
OBSERVED = dict(key_exists=True, certificate_exists=True, certificate=CERTIFICATE, certificate_matches_key=True)

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


def test_names_are_split_into_dns_names_and_addresses_sorted_and_normalized():
    dns_names, addresses = tls.normalize_names(
        ["vLLM-1.Lab", "", "10.0.0.5", "2001:DB8:0:0:0:0:0:1", "localhost", "vllm-1.lab", "::1", "10.0.0.10",
         "10.0.0.5", "_svc.lab"])
    assert dns_names == ["_svc.lab", "localhost", "vllm-1.lab"]
    assert addresses == ["10.0.0.5", "10.0.0.10", "::1", "2001:db8::1"]  # v4 first, each in numeric order


def test_no_names_is_allowed():
    assert tls.normalize_names([]) == ([], [])
    assert tls.normalize_names(["", " "]) == ([], [])


@pytest.mark.parametrize("name", ["bad name", "host/x", "*.lab", "a" * 254, "x..lab", "-x.lab", "10.0.0.5:443",
                                  "vllm;rm"])
def test_a_name_that_is_neither_an_address_nor_a_dns_name_is_refused(name):
    with pytest.raises(ValueError, match="neither an IP address nor a DNS name"):
        tls.normalize_names(["localhost", name])


def test_a_long_dns_name_up_to_253_characters_is_kept():
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61
    assert len(name) == 253 and tls.normalize_names([name]) == ([name], [])


@pytest.mark.parametrize("name", ["", " x", "a" * 65, "a/b", "a+b", "CN=x", "a\\b"])
def test_a_common_name_that_would_break_the_subject_is_refused(name):
    with pytest.raises(ValueError, match="common name"):
        tls.validate_common_name(name)


def test_a_plain_common_name_is_kept():
    assert tls.validate_common_name("gateway-1 client@lab") == "gateway-1 client@lab"


def test_extensions_of_a_server_certificate():
    assert tls.openssl_extensions(["localhost", "vllm-1.lab"], ["10.0.0.5", "2001:db8::1"], "server") == [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature",
        "extendedKeyUsage=serverAuth",
        "subjectAltName=DNS:localhost,DNS:vllm-1.lab,IP:10.0.0.5,IP:2001:db8::1",
    ]


def test_a_client_certificate_without_names_has_no_subject_alternative_name():
    assert tls.openssl_extensions([], [], "client") == [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature",
        "extendedKeyUsage=clientAuth",
    ]


def test_an_unknown_usage_is_refused():
    with pytest.raises(ValueError, match="usage"):
        tls.openssl_extensions(["x"], [], "both")


def _openssl_certificate(tmp_path, extensions, subject="/CN=vllm-1", days="400"):
    key, certificate = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
                   check=True, capture_output=True)
    argv = ["openssl", "req", "-x509", "-new", "-key", str(key), "-subj", subject, "-days", days, "-sha256"]
    for extension in extensions:
        argv += ["-addext", extension]
    subprocess.run(argv + ["-out", str(certificate)], check=True, capture_output=True)
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(certificate)], check=True,
                          capture_output=True, text=True).stdout
    end = subprocess.run(["openssl", "x509", "-noout", "-enddate", "-in", str(certificate)], check=True,
                         capture_output=True, text=True).stdout
    return text, end.strip().partition("=")[2]


@needs_openssl
def test_the_text_of_a_real_server_certificate_is_parsed(tmp_path):
    text, enddate = _openssl_certificate(tmp_path, tls.openssl_extensions(
        ["localhost", "vllm-1.lab"], ["10.0.0.5", "2001:db8::1"], "server"))
    parsed = tls.parse_certificate_text(text)
    assert parsed["dns_names"] == ["localhost", "vllm-1.lab"]
    assert parsed["ip_addresses"] == ["10.0.0.5", "2001:db8::1"]  # v6 written expanded by openssl, compressed here
    assert parsed["usages"] == ["serverAuth"] and parsed["common_name"] == "vllm-1"
    assert parsed["not_after"] == datetime.datetime.strptime(enddate, "%b %d %H:%M:%S %Y GMT").replace(tzinfo=UTC)
    assert parsed["not_after"].tzinfo is not None
    # What the module issues reads back as what was wanted: nothing to do.
    assert tls.decide(dict(DESIRED, dns_names=["localhost", "vllm-1.lab"], ip_addresses=["10.0.0.5", "2001:db8::1"]),
                      dict(OBSERVED, certificate=parsed), NOW)["actions"] == []


@needs_openssl
def test_the_text_of_a_real_client_certificate_without_names_is_parsed(tmp_path):
    text, _end = _openssl_certificate(tmp_path, tls.openssl_extensions([], [], "client"),
                                      subject="/CN=gateway-1 client")
    parsed = tls.parse_certificate_text(text)
    assert parsed["dns_names"] == [] and parsed["ip_addresses"] == []
    assert parsed["usages"] == ["clientAuth"] and parsed["common_name"] == "gateway-1 client"


@needs_openssl
def test_a_certificate_of_both_usages_or_none_reads_so(tmp_path):
    text, _end = _openssl_certificate(tmp_path, ["extendedKeyUsage=serverAuth,clientAuth"])
    assert tls.parse_certificate_text(text)["usages"] == ["serverAuth", "clientAuth"]
    text, _end = _openssl_certificate(tmp_path, ["basicConstraints=critical,CA:FALSE"])
    assert tls.parse_certificate_text(text)["usages"] == []


def test_the_openssl_3_text_is_parsed_as_written():
    text = """Certificate:
    Data:
        Validity
            Not Before: Dec  8 19:20:00 2026 GMT
            Not After : Dec  6 19:20:00 2036 GMT
        Subject: C = DE, CN = gw.lab, O = onprem
        X509v3 extensions:
            X509v3 Extended Key Usage:\x20
                TLS Web Client Authentication
            X509v3 Subject Alternative Name: critical
                DNS:GW.lab, IP Address:10.0.0.1, IP Address:FE80:0:0:0:0:0:0:1, email:ops@lab
"""
    assert tls.parse_certificate_text(text) == dict(
        dns_names=["gw.lab"], ip_addresses=["10.0.0.1", "fe80::1"], usages=["clientAuth"], common_name="gw.lab",
        not_after=datetime.datetime(2036, 12, 6, 19, 20, tzinfo=UTC))


def test_a_text_without_an_expiry_is_not_a_certificate():
    with pytest.raises(ValueError, match="Not After"):
        tls.parse_certificate_text("Could not read certificate from c.pem\n")


def test_only_the_certificate_blocks_of_a_pem_file_are_kept():
    certificate = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    key = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"
    assert tls.certificate_pem(key + certificate + "\n") == certificate + "\n"
    assert tls.certificate_pem("") == ""


def test_nothing_to_do_where_everything_matches():
    assert tls.decide(DESIRED, OBSERVED, NOW) == {"actions": [], "reasons": []}


def test_no_key_makes_a_key_and_its_certificate():
    # An existing certificate is of the lost key: it goes with it.
    assert tls.decide(DESIRED, dict(OBSERVED, key_exists=False, certificate_matches_key=None), NOW) == {
        "actions": ["create_key", "issue_certificate"], "reasons": ["no key"]}


def test_no_certificate_issues_one():
    assert tls.decide(DESIRED, dict(OBSERVED, certificate_exists=False, certificate=None,
                                    certificate_matches_key=None), NOW) == {
        "actions": ["issue_certificate"], "reasons": ["no certificate"]}


def test_an_unreadable_certificate_is_issued_again():
    assert tls.decide(DESIRED, dict(OBSERVED, certificate=None, certificate_matches_key=None), NOW) == {
        "actions": ["issue_certificate"], "reasons": ["certificate unreadable"]}


def test_changed_names_issue_it_again_saying_which():
    desired = dict(DESIRED, dns_names=["localhost", "vllm-1.lab", "vllm.lab"], ip_addresses=[])
    assert tls.decide(desired, OBSERVED, NOW) == {
        "actions": ["issue_certificate"], "reasons": ["names changed: +DNS:vllm.lab -IP:10.0.0.5"]}


def test_names_in_another_order_are_the_same_names():
    certificate = dict(CERTIFICATE, dns_names=["vllm-1.lab", "localhost"])
    assert tls.decide(DESIRED, dict(OBSERVED, certificate=certificate), NOW)["actions"] == []


@pytest.mark.parametrize("usages, reason", [
    (["clientAuth"], "usage changed: clientAuth -> serverAuth"),
    (["serverAuth", "clientAuth"], "usage changed: serverAuth,clientAuth -> serverAuth"),
    ([], "usage changed: none -> serverAuth"),
])
def test_a_certificate_whose_usage_is_not_exactly_the_one_wanted_is_issued_again(usages, reason):
    certificate = dict(CERTIFICATE, usages=usages)
    assert tls.decide(DESIRED, dict(OBSERVED, certificate=certificate), NOW) == {
        "actions": ["issue_certificate"], "reasons": [reason]}


def test_a_changed_common_name_issues_it_again():
    assert tls.decide(dict(DESIRED, common_name="vllm-2"), OBSERVED, NOW) == {
        "actions": ["issue_certificate"], "reasons": ["common name changed: 'vllm-1' -> 'vllm-2'"]}


def test_a_certificate_of_another_key_is_issued_again():
    assert tls.decide(DESIRED, dict(OBSERVED, certificate_matches_key=False), NOW) == {
        "actions": ["issue_certificate"], "reasons": ["certificate does not match the key"]}


def test_a_certificate_expiring_within_renew_before_days_is_issued_again():
    certificate = dict(CERTIFICATE, not_after=datetime.datetime(2026, 12, 31, 0, 0, tzinfo=UTC))
    assert tls.decide(DESIRED, dict(OBSERVED, certificate=certificate), NOW) == {
        "actions": ["issue_certificate"], "reasons": ["expires 2026-12-31"]}
    # Just past the window: kept.
    certificate = dict(CERTIFICATE, not_after=NOW + datetime.timedelta(days=30, seconds=1))
    assert tls.decide(DESIRED, dict(OBSERVED, certificate=certificate), NOW)["actions"] == []


def test_an_expired_certificate_is_issued_again():
    certificate = dict(CERTIFICATE, not_after=datetime.datetime(2026, 1, 1, tzinfo=UTC))
    assert tls.decide(DESIRED, dict(OBSERVED, certificate=certificate), NOW)["reasons"] == ["expired 2026-01-01"]


def test_every_reason_is_given_at_once():
    certificate = dict(CERTIFICATE, usages=["clientAuth"], common_name="old", dns_names=["localhost"],
                       not_after=NOW + datetime.timedelta(days=2))
    decision = tls.decide(DESIRED, dict(OBSERVED, certificate=certificate, certificate_matches_key=False), NOW)
    assert decision["actions"] == ["issue_certificate"]
    assert [reason.split(" ", maxsplit=1)[0] for reason in decision["reasons"]] == [
        "certificate", "names", "usage", "common", "expires"]

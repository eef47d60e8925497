# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's TLS identity (a private key made on the host, a self-signed certificate for one use, server or client),
decided without I/O: the names a certificate carries, the openssl extensions that make it, what `openssl x509 -text`
says of an existing one, and whether the key or the certificate must be made again. The module tls_identity reads
the files, runs openssl and acts.

There is no CA: each side pins the other's certificate as its only trust anchor, so a certificate is trusted for
exactly what it says - its names, and its one extended key usage (a server's certificate put among a server's pinned
client certificates is still refused as a client).
"""

from __future__ import annotations

import datetime
import ipaddress
import re

USAGES = ("server", "client")

# The extended key usage each use gets, by the short name openssl's -addext takes.
EXTENDED_KEY_USAGE = {"server": "serverAuth", "client": "clientAuth"}

# `openssl x509 -text` writes extended key usages by their long names.
_EKU_NAMES = {
    "TLS Web Server Authentication": "serverAuth",
    "TLS Web Client Authentication": "clientAuth",
    "Code Signing": "codeSigning",
    "E-mail Protection": "emailProtection",
    "Time Stamping": "timeStamping",
    "OCSP Signing": "OCSPSigning",
    "Any Extended Key Usage": "anyExtendedKeyUsage",
}

_DNS_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# A common name goes into `-subj /CN=...`, where '/', '+', '=' and '\' have meanings of their own.
_COMMON_NAME = re.compile(r"^[A-Za-z0-9_.@: -]{1,64}$")
_MONTHS = {name: number for number, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}
_NOT_AFTER = re.compile(r"Not After\s*:\s*([A-Z][a-z]{2})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})\s+GMT")
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL)


def _sorted_addresses(addresses):
    """IPv4 before IPv6, each in numeric order; anything else (a certificate's malformed entry) last."""
    def key(address):
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return (7, 0, address)
        return (parsed.version, int(parsed), "")
    return sorted(addresses, key=key)


def _ip(name):
    """The address in its compressed form, or None when the name is not an IP address."""
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return None


def normalize_names(names):
    """(dns_names, ip_addresses) of the names a certificate is to carry, each sorted and without duplicates: IP
    addresses (v4 and v6) in their compressed form, DNS names lower-cased, empty strings dropped. ValueError for a name
    that is neither."""
    dns_names, ip_addresses = set(), set()
    for name in names:
        name = (name or "").strip()
        if not name:
            continue
        address = _ip(name)
        if address is not None:
            ip_addresses.add(address)
        elif len(name) <= 253 and _DNS_NAME.match(name) and ".." not in name and not name.startswith((".", "-")):
            dns_names.add(name.lower())
        else:
            raise ValueError("%r is neither an IP address nor a DNS name" % name)
    return sorted(dns_names), _sorted_addresses(ip_addresses)


def validate_common_name(common_name):
    """The common name, as it goes into `-subj /CN=...`; ValueError for one that is empty, longer than 64 characters
    (X.520's bound) or has a character other than letters, digits, ' ', '-', '.', '_', '@', ':'."""
    if not _COMMON_NAME.match(common_name or "") or common_name != common_name.strip():
        raise ValueError("common name %r must be 1 to 64 of letters, digits, ' ', '-', '.', '_', '@', ':' "
                         "(no leading or trailing space)" % common_name)
    return common_name


def openssl_extensions(dns_names, ip_addresses, usage):
    """The -addext values of `openssl req -x509` for a certificate of one use ('server' or 'client') with these
    names (no subjectAltName where there are none)."""
    if usage not in EXTENDED_KEY_USAGE:
        raise ValueError("usage must be one of %s, not %r" % (", ".join(USAGES), usage))
    extensions = ["basicConstraints=critical,CA:FALSE",
                  "keyUsage=critical,digitalSignature",  # EC keys sign only (RFC 5480)
                  "extendedKeyUsage=" + EXTENDED_KEY_USAGE[usage]]
    alt_names = ["DNS:" + name for name in dns_names] + ["IP:" + address for address in ip_addresses]
    if alt_names:
        extensions.append("subjectAltName=" + ",".join(alt_names))
    return extensions


def _extension_value(lines, header):
    """The (first) value line of an extension in `openssl x509 -text`: the line after its header."""
    for index, line in enumerate(lines):
        if line.strip().startswith(header + ":") and index + 1 < len(lines):
            return lines[index + 1].strip()
    return None


def parse_certificate_text(text):
    """What `openssl x509 -noout -text` (OpenSSL 1.1.1 and 3.x) says of a certificate: dns_names and ip_addresses
    (normalized as normalize_names does), usages (its extended key usages by short name, as written), not_after (an
    aware datetime in UTC), common_name. ValueError where the text has no expiry date (not a certificate)."""
    lines = text.splitlines()
    match = _NOT_AFTER.search(text)
    if not match or match.group(1) not in _MONTHS:
        raise ValueError("no 'Not After' date in the certificate's text")
    month, day, hour, minute, second, year = match.groups()
    not_after = datetime.datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second),
                                  tzinfo=datetime.timezone.utc)

    dns_names, ip_addresses = set(), set()
    for entry in (_extension_value(lines, "X509v3 Subject Alternative Name") or "").split(","):
        kind, _sep, value = entry.strip().partition(":")
        if kind == "DNS":
            dns_names.add(value.strip().lower())
        elif kind == "IP Address":
            # Some versions write a v6 address expanded and upper-cased; a malformed entry is kept as written, so
            # it counts as a name that differs.
            ip_addresses.add(_ip(value.strip()) or value.strip())

    usages = [_EKU_NAMES.get(name.strip(), name.strip())
              for name in (_extension_value(lines, "X509v3 Extended Key Usage") or "").split(",") if name.strip()]

    common_name = ""
    for line in lines:
        if line.strip().startswith("Subject:"):
            found = re.search(r"(?:^|[,/+]\s*)CN\s*=\s*([^,/+]*)", line.strip()[len("Subject:"):].strip())
            common_name = found.group(1).strip() if found else ""
            break

    return {"dns_names": sorted(dns_names),
            "ip_addresses": _sorted_addresses(ip_addresses),
            "usages": usages, "not_after": not_after, "common_name": common_name}


def certificate_pem(text):
    """The CERTIFICATE blocks of a PEM file only (a file that also holds a key must not hand the key back)."""
    return "".join(block + "\n" for block in _PEM_CERTIFICATE.findall(text or ""))


def _names_change(desired, certificate):
    wanted = {"DNS:" + name for name in desired["dns_names"]} | {"IP:" + a for a in desired["ip_addresses"]}
    have = {"DNS:" + name for name in certificate["dns_names"]} | {"IP:" + a for a in certificate["ip_addresses"]}
    if wanted == have:
        return None
    changes = ["+" + name for name in sorted(wanted - have)] + ["-" + name for name in sorted(have - wanted)]
    return "names changed: " + " ".join(changes)


def decide(desired, observed, now):
    """{"actions": [...], "reasons": [...]}: what to do for one identity - "create_key" then "issue_certificate",
    "issue_certificate" alone, or nothing - and why, in short words.

    desired: common_name, dns_names, ip_addresses (normalized), usage, days, renew_before_days. observed: key_exists,
    certificate (parse_certificate_text's dict, None where there is none or it cannot be read; certificate_exists,
    optional, tells the two apart in the reasons), certificate_matches_key (None where unknown). now: an aware
    datetime."""
    if not observed.get("key_exists"):
        return {"actions": ["create_key", "issue_certificate"], "reasons": ["no key"]}
    certificate = observed.get("certificate")
    if certificate is None:
        return {"actions": ["issue_certificate"],
                "reasons": ["certificate unreadable" if observed.get("certificate_exists") else "no certificate"]}

    reasons = []
    if observed.get("certificate_matches_key") is False:
        reasons.append("certificate does not match the key")
    names = _names_change(desired, certificate)
    if names:
        reasons.append(names)
    wanted_usage = EXTENDED_KEY_USAGE[desired["usage"]]
    if list(certificate["usages"]) != [wanted_usage]:
        reasons.append("usage changed: %s -> %s" % (",".join(certificate["usages"]) or "none", wanted_usage))
    if certificate["common_name"] != desired["common_name"]:
        reasons.append("common name changed: %r -> %r" % (certificate["common_name"], desired["common_name"]))
    left = certificate["not_after"] - now
    if left < datetime.timedelta(days=desired["renew_before_days"]):
        reasons.append(("expired %s" if left <= datetime.timedelta(0) else "expires %s")
                       % certificate["not_after"].strftime("%Y-%m-%d"))
    return {"actions": ["issue_certificate"] if reasons else [], "reasons": reasons}

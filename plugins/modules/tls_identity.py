#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: tls_identity
short_description: Make a host's TLS identities - a private key that never leaves it, a self-signed certificate for one use
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - For each of O(identities), a private key (EC P-256) made on the host with the C(openssl) CLI, and a self-signed
    certificate of that key for one use, server or client (its only extended key usage). There is no CA - each side of
    a mutual TLS connection pins the other's certificate as its only trust anchor (RV(certificates) hands them back to
    be pinned), so a certificate is trusted for its names and its one use only.
  - The key stays where it is made. It is never read by the module, never returned, logged or diffed; C(openssl) gets
    its path only. It is written into a temporary file of its directory created mode C(0600) before C(openssl) writes
    it, given its group and mode, then renamed over the old one, so it never sits in a wider mode and a reader or a
    power cut never sees half a key.
  - The certificate is issued again (with the same key) where there is none or it cannot be read, its names, common
    name or use differ from those wanted, it is not of the key, or it expires within O(identities[].renew_before_days).
    The key is made again only where there is none (and then a certificate for it). An existing key C(openssl) cannot
    read fails the module; remove it to have a new one made.
  - The key's group and mode, and the certificate's mode C(0644), are set on every run.
  - A missing directory of a key or certificate is made, mode C(0700) (the role that owns it may widen it later).
  - The decisions are in C(module_utils/tls_identity.py).
options:
  identities:
    description: The identities, each a key and a certificate. No path may serve two of them.
    type: list
    elements: dict
    required: true
    suboptions:
      id:
        description: A name of the identity, unique among O(identities); the key of its entries in what is returned.
        type: str
        required: true
      key_path:
        description: Absolute path of the private key (PEM). Its directory must exist.
        type: path
        required: true
      certificate_path:
        description: Absolute path of the certificate (PEM). Its directory must exist.
        type: path
        required: true
      common_name:
        description: The certificate's subject common name (1 to 64 of letters, digits, space, C(-), C(.), C(_), C(@),
          C(:)).
        type: str
        required: true
      names:
        description:
          - The certificate's subject alternative names - DNS names and IP addresses (v4 or v6), told apart by
            form. A server's must include every name its clients connect to; a client's normally holds its host name,
            and may be empty.
          - Compared as sets, DNS names lower-cased, addresses in their compressed form.
        type: list
        elements: str
        default: []
      usage:
        description: What the certificate is for; its extended key usage is C(serverAuth) or C(clientAuth) alone.
        type: str
        required: true
        choices: [server, client]
      key_group:
        description:
          - A group (name or id) that reads the key (the service's, not the module's user) - the key is then mode
            C(0640) in that group; empty, mode C(0600).
          - A group name the host does not have yet (its service's package is installed later in the run) leaves the
            key C(0600) and is listed in RV(pending_groups); a later run with the group sets it.
        type: str
        default: ""
      days:
        description: Days a new certificate is valid for. Should be more than O(identities[].renew_before_days), else
          every run issues it again (the module warns).
        type: int
        default: 3650
      renew_before_days:
        description: The certificate is issued again where it expires within this many days.
        type: int
        default: 30
  openssl:
    description: The C(openssl) binary, a path or a name looked up on E(PATH). OpenSSL 1.1.1 or later.
    type: path
    default: openssl
notes:
  - Check mode is supported.
  - Each side's pinned file is the concatenation of the certificates it accepts (for a vLLM server, uvicorn's
    C(--ssl-ca-certs)); a certificate of the other use in it is still refused (its extended key usage).
attributes:
  check_mode:
    description: Reports what would be done (RV(actions), RV(reasons)) and changes nothing; RV(certificates) are the
      existing ones.
    support: full
  diff_mode:
    description: For each certificate to be issued, its common name, use, names and expiry before and after (never
      the key).
    support: partial
"""

EXAMPLES = r"""
- name: The gateway's server identity (its frontend) and client identity (towards the vLLM servers)
  onprem.vllm.tls_identity:
    identities:
      - id: gateway-server
        key_path: /etc/haproxy/tls/gateway-server.key
        certificate_path: /etc/haproxy/tls/gateway-server.crt
        common_name: "{{ inventory_hostname }}"
        names: ["{{ inventory_hostname }}", "{{ ansible_host }}"]
        usage: server
        key_group: haproxy
      - id: gateway-client
        key_path: /etc/haproxy/tls/gateway-client.key
        certificate_path: /etc/haproxy/tls/gateway-client.crt
        common_name: "{{ inventory_hostname }} gateway"
        names: ["{{ inventory_hostname }}"]
        usage: client
        key_group: haproxy
  register: gateway_tls

- name: Each vLLM server pins the gateway's client certificate
  ansible.builtin.debug:
    msg: "{{ gateway_tls.certificates['gateway-client'] }}"
"""

RETURN = r"""
certificates:
  description: By identity id, its certificate (PEM; the certificate blocks of the file only). In check mode the
    existing one, empty where there is none.
  returned: always
  type: dict
  sample: {gateway-client: "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n"}
actions:
  description: By identity id, what was done (or would be, in check mode), in order - C(create_key),
    C(issue_certificate), C(key_attributes) (the key's group or mode set), C(certificate_attributes) (the
    certificate's mode set). Empty where nothing was.
  returned: always
  type: dict
  sample: {gateway-client: [issue_certificate], gateway-server: []}
pending_groups:
  description: By identity id, the O(identities[].key_group) the host does not have yet (the key was left C(0600)).
  returned: always
  type: dict
  sample: {prometheus-client: prometheus}
reasons:
  description: >-
    By identity id, why its key or certificate was made, in short words - C(no key), C(no certificate),
    C(certificate unreadable), C(names changed: +DNS:x -IP:y), C(usage changed: serverAuth -> clientAuth),
    C(common name changed: ...), C(certificate does not match the key), C(expires 2027-01-01), C(expired ...).
  returned: always
  type: dict
  sample: {gateway-client: ["names changed: +IP:10.0.0.5"], gateway-server: []}
"""

import datetime
import grp
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text

from ansible_collections.onprem.vllm.plugins.module_utils import tls_identity as tls

# `openssl req` reads a configuration; this one adds nothing, so the host's openssl.cnf (its v3_ca extensions, its
# prompts) cannot change what is issued. OpenSSL 1.1.1 wants the distinguished_name section even with -subj.
_REQ_CONFIG = "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n"


def _openssl(module, argv, what):
    """stdout of an openssl command; the module fails, with openssl's error output, where it fails."""
    rc, out, err = module.run_command([module.params["openssl"]] + argv)
    if rc != 0:
        module.fail_json(msg="%s failed (openssl rc %d): %s" % (what, rc, (to_text(err) or to_text(out)).strip()[-2000:]))
    return to_text(out)


def _read_text(module, path):
    try:
        with open(path, "rb") as handle:
            return to_text(handle.read(), errors="surrogate_or_replace")
    except OSError as exc:
        module.fail_json(msg="cannot read %s: %s" % (path, exc))


def _observe(module, item):
    """(observed, the certificate file's certificate PEM): what decide() takes, read from the files and openssl."""
    key, certificate = item["key_path"], item["certificate_path"]
    observed = dict(key_exists=os.path.exists(key), certificate_exists=os.path.exists(certificate),
                    certificate=None, certificate_matches_key=None)
    if not observed["certificate_exists"]:
        return observed, ""
    pem = tls.certificate_pem(_read_text(module, certificate))
    rc, out, _err = module.run_command([module.params["openssl"], "x509", "-noout", "-text", "-in", certificate])
    if rc == 0:
        try:
            observed["certificate"] = tls.parse_certificate_text(to_text(out))
        except ValueError:
            pass  # unreadable: issued again
    if observed["key_exists"] and observed["certificate"] is not None:
        key_public = _openssl(module, ["pkey", "-pubout", "-in", key],
                              "reading the key %s (remove it to have a new one made)" % key)
        certificate_public = _openssl(module, ["x509", "-noout", "-pubkey", "-in", certificate],
                                      "reading the public key of %s" % certificate)
        observed["certificate_matches_key"] = key_public.strip() == certificate_public.strip()
    return observed, pem


def _temporary(path):
    """A new empty file next to path, mode 0600 from its creation (mkstemp: O_CREAT|O_EXCL, 0600), for openssl to
    write into: openssl keeps an existing file's mode."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % os.path.basename(path), suffix=".tmp")
    os.close(fd)
    return tmp


def _replace(tmp, path):
    """Rename the written temporary file over path, both synced first and after, so a power cut leaves the old file
    or the whole new one."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _group_exists(group):
    if not group or group.isdigit():
        return True
    try:
        grp.getgrnam(group)
    except KeyError:
        return False
    return True


def _key_attributes(module, item, path):
    group = item["key_group"] if item["key_group"] and _group_exists(item["key_group"]) else None
    return module.load_file_common_arguments(dict(path=path, mode="0640" if group else "0600", group=group, owner=None))


def _certificate_attributes(module, path):
    return module.load_file_common_arguments(dict(path=path, mode="0644", owner=None, group=None))


def _write(module, path, what, write):
    """Make path with write(tmp) in a temporary file of its directory, then rename it over path; the temporary file
    is removed where anything fails."""
    tmp = None
    try:
        tmp = _temporary(path)
        write(tmp)
        _replace(tmp, path)
    except OSError as exc:
        module.fail_json(msg="cannot write the %s %s: %s" % (what, path, exc))
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def _create_key(module, item):
    def write(tmp):
        _openssl(module, ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", tmp],
                 "making the key %s" % item["key_path"])
        # Its group and mode before it takes the key's name: nobody else ever reads it in the meantime.
        module.set_fs_attributes_if_different(_key_attributes(module, item, tmp), True)

    _write(module, item["key_path"], "key", write)


def _issue_certificate(module, item, desired):
    extensions = tls.openssl_extensions(desired["dns_names"], desired["ip_addresses"], desired["usage"])

    def write(tmp):
        fd, config = tempfile.mkstemp(prefix="tls_identity.", suffix=".cnf")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(_REQ_CONFIG)
            argv = ["req", "-x509", "-new", "-config", config, "-key", item["key_path"],
                    "-subj", "/CN=" + desired["common_name"], "-days", str(desired["days"]), "-sha256"]
            for extension in extensions:
                argv += ["-addext", extension]
            _openssl(module, argv + ["-out", tmp], "issuing the certificate %s" % item["certificate_path"])
        finally:
            os.unlink(config)
        os.chmod(tmp, 0o644)

    _write(module, item["certificate_path"], "certificate", write)


def _described(common_name, usage, dns_names, ip_addresses, not_after):
    return "".join("%s: %s\n" % pair for pair in (
        ("common_name", common_name), ("usage", usage),
        ("names", ", ".join(["DNS:" + name for name in dns_names] + ["IP:" + a for a in ip_addresses])),
        ("not_after", not_after)))


def _diff(item, desired, observed, now):
    certificate = observed["certificate"]
    before = ("" if certificate is None else _described(
        certificate["common_name"], ",".join(certificate["usages"]), certificate["dns_names"],
        certificate["ip_addresses"], certificate["not_after"].strftime("%Y-%m-%d %H:%M:%S UTC")))
    after = _described(desired["common_name"], tls.EXTENDED_KEY_USAGE[desired["usage"]], desired["dns_names"],
                       desired["ip_addresses"],
                       (now + datetime.timedelta(days=desired["days"])).strftime("%Y-%m-%d (about)"))
    return dict(before=before, after=after, before_header=item["certificate_path"], after_header=item["certificate_path"])


def _desired(module, item):
    try:
        dns_names, ip_addresses = tls.normalize_names(item["names"])
        common_name = tls.validate_common_name(item["common_name"])
    except ValueError as exc:
        module.fail_json(msg="identity %s: %s" % (item["id"], exc))
    return dict(common_name=common_name, dns_names=dns_names, ip_addresses=ip_addresses, usage=item["usage"],
                days=item["days"], renew_before_days=item["renew_before_days"])


def _check_arguments(module):
    """Everything wrong with the arguments, before anything is read or changed."""
    seen_ids, seen_paths = set(), set()
    for item in module.params["identities"]:
        if item["id"] in seen_ids:
            module.fail_json(msg="identity id %s is given twice" % item["id"])
        seen_ids.add(item["id"])
        for kind in ("key_path", "certificate_path"):
            path = item[kind]
            if not os.path.isabs(path):
                module.fail_json(msg="identity %s: %s %s is not an absolute path" % (item["id"], kind, path))
            if path in seen_paths:
                module.fail_json(msg="identity %s: %s is used twice (a path serves one identity)" % (item["id"], path))
            seen_paths.add(path)
            if os.path.isdir(path):
                module.fail_json(msg="identity %s: %s %s is a directory" % (item["id"], kind, path))
        if item["days"] < 1 or item["renew_before_days"] < 0:
            module.fail_json(msg="identity %s: days must be at least 1 and renew_before_days not negative" % item["id"])
        if item["days"] <= item["renew_before_days"]:
            module.warn("identity %s: days (%d) is not more than renew_before_days (%d): every run issues its "
                        "certificate again" % (item["id"], item["days"], item["renew_before_days"]))


def _identity(module, item, now):
    """(actions, reasons, certificate PEM, diff or None) of one identity, acted on unless in check mode."""
    desired = _desired(module, item)
    observed, pem = _observe(module, item)
    decision = tls.decide(desired, observed, now)
    actions = list(decision["actions"])
    diff = _diff(item, desired, observed, now) if "issue_certificate" in actions else None
    if not module.check_mode:
        for path in (item["key_path"], item["certificate_path"]):
            if actions and not os.path.isdir(os.path.dirname(path)):
                try:
                    os.makedirs(os.path.dirname(path), mode=0o700)
                except OSError as exc:
                    module.fail_json(msg="identity %s: cannot make the directory of %s: %s" % (item["id"], path, exc))
        if "create_key" in actions:
            _create_key(module, item)
        if "issue_certificate" in actions:
            _issue_certificate(module, item, desired)
            pem = tls.certificate_pem(_read_text(module, item["certificate_path"]))
    if os.path.exists(item["key_path"]) and \
            module.set_fs_attributes_if_different(_key_attributes(module, item, item["key_path"]), False):
        actions.append("key_attributes")
    if os.path.exists(item["certificate_path"]) and "issue_certificate" not in actions and \
            module.set_fs_attributes_if_different(_certificate_attributes(module, item["certificate_path"]), False):
        actions.append("certificate_attributes")
    return actions, decision["reasons"], pem, diff


def main():
    module = AnsibleModule(
        argument_spec=dict(
            identities=dict(type="list", elements="dict", required=True, options=dict(
                id=dict(type="str", required=True),
                key_path=dict(type="path", required=True, no_log=False),
                certificate_path=dict(type="path", required=True),
                common_name=dict(type="str", required=True),
                names=dict(type="list", elements="str", default=[]),
                usage=dict(type="str", required=True, choices=list(tls.USAGES)),
                key_group=dict(type="str", default="", no_log=False),
                days=dict(type="int", default=3650),
                renew_before_days=dict(type="int", default=30),
            )),
            openssl=dict(type="path", default="openssl"),
        ),
        supports_check_mode=True,
    )
    if "/" not in module.params["openssl"]:
        module.params["openssl"] = module.get_bin_path(module.params["openssl"], required=True)
    _check_arguments(module)

    now = datetime.datetime.now(datetime.timezone.utc)
    certificates, actions, reasons, diffs, pending = {}, {}, {}, [], {}
    for item in module.params["identities"]:
        done, why, pem, diff = _identity(module, item, now)
        actions[item["id"]], reasons[item["id"]], certificates[item["id"]] = done, why, pem
        if diff:
            diffs.append(diff)
        if not _group_exists(item["key_group"]):
            pending[item["id"]] = item["key_group"]
    result = dict(changed=any(actions.values()), certificates=certificates, actions=actions, reasons=reasons,
                  pending_groups=pending)
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()

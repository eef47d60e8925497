# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's usage service: tokens per client and model across the fleet, budgets, and the report.

Standard library only: it runs on the gateway host as a systemd service (onprem-gateway-usage.service, root).

serve: every poll interval, GET /onprem/usage (with the servers' key) from every server of every backend. Each answer
is one server ledger's whole count per UTC day, client and model (roles/vllm_server, files/onprem_vllm_usage.py), kept
here under the ledger's id (state_dir/ledgers/<id>.json, written atomically): a server that does not answer, is
rebooting or was removed still counts with its last answer, and a ledger reached at two addresses counts once. The sum
of the kept answers:
  - is exported to Prometheus on listen (GET /metrics): onprem_vllm_usage_requests_total and onprem_vllm_usage_tokens_total by
    client and model; per budget onprem_vllm_usage_budget_tokens and onprem_vllm_usage_budget_used_tokens (the monitoring
    role's alerts fire at 80 % and at 100 %); onprem_vllm_usage_servers by poll result;
  - decides the budgets (each client's token_budgets in gateway_client_keys: tokens per UTC day, ISO week, calendar
    month or the last N days, of some models or all): a client at or over a budget gets OpenAI's 429
    insufficient_quota from HAProxy on the models of that budget until the period rolls over or the budget is raised.
    The refused client/model pairs are written to the ACL file HAProxy reads at start (gateway_state_dir, so a
    restart or reboot of the gateway keeps them) and applied at once over HAProxy's admin socket.
Between polls a client can go over by what it uses in one interval (plus its requests still running).

report: tokens and requests per client and model for a span of UTC days, from the kept answers: a table on stdout and
optionally CSV (playbooks/usage.yml runs it).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import http.server
import json
import os
import re
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.request

LEDGER_ID = re.compile(r"^[0-9a-f]{32}$")


# ---- pure: counts, periods, budgets ---------------------------------------------------------------------------------

def merge(answers) -> dict:
    """{(day, client, model): [requests, prompt, completion]} summed over the ledgers' last answers."""
    totals: dict = {}
    for answer in answers:
        for day, clients in (answer.get("days") or {}).items():
            for client, models in clients.items():
                for model, counts in models.items():
                    total = totals.setdefault((day, client, model), [0, 0, 0])
                    for index in range(3):
                        total[index] += int(counts[index])
    return totals


def period_bounds(period: str, today: datetime.date) -> tuple[datetime.date, datetime.date]:
    """[first day, first day of the next period) of the period that holds today (UTC days)."""
    if period == "day":
        return today, today + datetime.timedelta(days=1)
    if period == "week":
        start = today - datetime.timedelta(days=today.weekday())
        return start, start + datetime.timedelta(days=7)
    if period == "month":
        start = today.replace(day=1)
        following = (start + datetime.timedelta(days=32)).replace(day=1)
        return start, following
    days = int(period[:-1])  # the last N days, today included: rolls over one day at a time
    return today - datetime.timedelta(days=days - 1), today + datetime.timedelta(days=1)


def budget_states(totals: dict, clients: list, backends: list, today: datetime.date) -> list[dict]:
    """Each budget of each client: what it counts, what was used in its current period, and what it refuses."""
    states = []
    for client in clients:
        for budget in client.get("token_budgets") or []:
            names = set(budget.get("models") or [])
            chosen = [b for b in backends if not names or names & set(b["served_names"])]
            labels = {b["served_names"][0] for b in chosen}
            start, end = period_bounds(budget["period"], today)
            used = sum(counts[1] + counts[2] for (day, name, model), counts in totals.items()
                       if name == client["name"] and model in labels
                       and start.isoformat() <= day < end.isoformat())
            states.append({
                "client": client["name"], "period": budget["period"], "tokens": int(budget["tokens"]),
                "models": sorted(labels) if names else [], "used": used, "resets": end.isoformat(),
                "over": used >= int(budget["tokens"]),
                "grants": sorted("%s/%s" % (client["name"], served) for b in chosen for served in b["served_names"]),
            })
    return states


def refused_grants(states: list[dict]) -> list[str]:
    return sorted({grant for state in states if state["over"] for grant in state["grants"]})


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(totals: dict, states: list[dict], answered: int, unanswered: int, polled_at: float) -> str:
    per_model: dict = {}
    for (_day, client, model), counts in totals.items():
        total = per_model.setdefault((client, model), [0, 0, 0])
        for index in range(3):
            total[index] += counts[index]
    lines = ["# HELP onprem_vllm_usage_requests_total Requests answered, by the client the gateway named and the served model.",
             "# TYPE onprem_vllm_usage_requests_total counter"]
    lines += ['onprem_vllm_usage_requests_total{client="%s",model="%s"} %d' % (_label(c), _label(m), v[0])
              for (c, m), v in sorted(per_model.items())]
    lines += ["# HELP onprem_vllm_usage_tokens_total Tokens of the answers' usage (prompt, completion).",
              "# TYPE onprem_vllm_usage_tokens_total counter"]
    for (client, model), counts in sorted(per_model.items()):
        for kind, value in (("prompt", counts[1]), ("completion", counts[2])):
            lines.append('onprem_vllm_usage_tokens_total{client="%s",model="%s",kind="%s"} %d'
                         % (_label(client), _label(model), kind, value))
    lines += ["# HELP onprem_vllm_usage_budget_tokens A client's token budget for its period (models: all or a list).",
              "# TYPE onprem_vllm_usage_budget_tokens gauge",
              "# HELP onprem_vllm_usage_budget_used_tokens Tokens the client used in the budget's current period.",
              "# TYPE onprem_vllm_usage_budget_used_tokens gauge"]
    for state in states:
        labels = 'client="%s",period="%s",models="%s"' % (
            _label(state["client"]), state["period"], _label(",".join(state["models"]) or "all"))
        lines.append("onprem_vllm_usage_budget_tokens{%s} %d" % (labels, state["tokens"]))
        lines.append("onprem_vllm_usage_budget_used_tokens{%s} %d" % (labels, state["used"]))
    lines += ["# HELP onprem_vllm_usage_servers Servers by the result of the last poll.", "# TYPE onprem_vllm_usage_servers gauge",
              'onprem_vllm_usage_servers{result="answered"} %d' % answered,
              'onprem_vllm_usage_servers{result="unanswered"} %d' % unanswered,
              "# HELP onprem_vllm_usage_last_poll_timestamp_seconds When the last poll ended.",
              "# TYPE onprem_vllm_usage_last_poll_timestamp_seconds gauge",
              "onprem_vllm_usage_last_poll_timestamp_seconds %.3f" % polled_at]
    return "\n".join(lines) + "\n"


REPORT_FIELDS = ["client", "model", "requests", "prompt_tokens", "completion_tokens", "total_tokens"]


def report_rows(totals: dict, since: str, until: str) -> list[dict]:
    """Per client and model over the UTC days since..until (both included)."""
    rows: dict = {}
    for (day, client, model), counts in totals.items():
        if since <= day <= until:
            row = rows.setdefault((client, model), [0, 0, 0])
            for index in range(3):
                row[index] += counts[index]
    return [{"client": c, "model": m, "requests": v[0], "prompt_tokens": v[1], "completion_tokens": v[2],
             "total_tokens": v[1] + v[2]} for (c, m), v in sorted(rows.items())]


def report_rows_by_server(answers, since: str, until: str) -> list[dict]:
    """The same per server (the name the usage service last reached each ledger by): who was served where."""
    rows = []
    for answer in answers:
        for row in report_rows(merge([answer]), since, until):
            rows.append(dict(server=str(answer.get("server", answer.get("ledger"))), **row))
    return sorted(rows, key=lambda row: (row["server"], row["client"], row["model"]))


def report_table(rows: list[dict], since: str, until: str) -> str:
    head = tuple(rows[0]) if rows else tuple(REPORT_FIELDS)
    texts = sum(1 for name in head if name not in REPORT_FIELDS[2:])  # the leading text columns
    cells = [head] + [tuple(str(row[name]) for name in head) for row in rows]
    if rows:
        sums = tuple(str(sum(row[name] for row in rows)) for name in head[texts:])
        cells.append(("total",) + ("",) * (texts - 1) + sums)
    widths = [max(len(line[i]) for line in cells) for i in range(len(head))]
    out = ["Usage %s .. %s (UTC days)" % (since, until)]
    for number, line in enumerate(cells):
        out.append("  ".join(cell.rjust(w) if i >= texts else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(line, widths))).rstrip())
        if number == 0 or (rows and number == len(cells) - 2):
            out.append("  ".join("-" * w for w in widths))
    if not rows:
        out.append("(no requests)")
    return "\n".join(out) + "\n"


# ---- I/O ------------------------------------------------------------------------------------------------------------

def write_atomically(path: str, content: bytes, mode: int = 0o600) -> None:
    """A whole new file renamed over the old one. Its temporary name is its own: the service and a poll or report run
    by hand (playbooks/usage.yml) may write the same file at once, and each rename then lands whole."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix="." + os.path.basename(path) + ".")
    try:
        os.write(fd, content)
        os.fsync(fd)
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        os.unlink(temporary)
        raise
    os.close(fd)
    os.replace(temporary, path)


def kept_answers(state_dir: str) -> list[dict]:
    folder = os.path.join(state_dir, "ledgers")
    answers = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    answers.append(json.load(handle))
            except (OSError, ValueError):
                continue  # a torn copy (written atomically, so never): the next answer replaces it
    return answers


def tls_context(tls: dict | None) -> ssl.SSLContext | None:
    """A server over mutual TLS (its config entry's tls): its pinned certificate, and the gateway's client identity."""
    if not tls:
        return None
    context = ssl.create_default_context(cafile=tls["ca"])
    context.load_cert_chain(tls["cert"], tls["key"])
    return context


def poll(url: str, key: str, timeout: float, context: ssl.SSLContext | None = None) -> dict | None:
    request = urllib.request.Request(url.rstrip("/") + "/onprem/usage", headers={"Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:  # noqa: S310 (config URLs)
            data = json.load(answer)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not LEDGER_ID.match(str(data.get("ledger", ""))):
        return None
    return data


def keep(state_dir: str, server: str, answer: dict) -> None:
    folder = os.path.join(state_dir, "ledgers")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, answer["ledger"] + ".json")
    content = json.dumps(dict(answer, server=server), sort_keys=True).encode()
    try:
        with open(path, "rb") as handle:
            if json.loads(handle.read()) == json.loads(content):
                return
    except (OSError, ValueError):
        pass
    write_atomically(path, content)


def admin_command(socket_path: str, command: str, timeout: float = 5.0) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(socket_path)
        conn.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode()


def apply_refusals(config: dict, grants: list[str]) -> None:
    """The ACL file first (HAProxy reads it at every start), then the running HAProxy, entry by entry."""
    content = "".join(grant + "\n" for grant in grants).encode()
    try:
        with open(config["acl_file"], "rb") as handle:
            unchanged = handle.read() == content
    except OSError:
        unchanged = False
    if not unchanged:
        write_atomically(config["acl_file"], content, 0o644)
    try:
        listed = admin_command(config["admin_socket"], "show acl %s" % config["acl_name"])
    except OSError:
        return  # HAProxy is not running: it reads the file when it starts
    running = {line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("0x") and " " in line}
    for grant in sorted(set(grants) - running):
        admin_command(config["admin_socket"], "add acl %s %s" % (config["acl_name"], grant))
    for grant in sorted(running - set(grants)):
        admin_command(config["admin_socket"], "del acl %s %s" % (config["acl_name"], grant))


class Service:
    def __init__(self, config: dict) -> None:
        self.config = config
        self.metrics = render_metrics({}, [], 0, 0, 0.0).encode()
        self.lock = threading.Lock()

    def poll_once(self, today: datetime.date | None = None) -> list[dict]:
        answered = unanswered = 0
        for server in self.config["servers"]:
            try:
                context = tls_context(server.get("tls"))
            except (OSError, ValueError):
                unanswered += 1  # a certificate not there yet: counted as unanswered, asked again next time
                continue
            answer = poll(server["url"], self.config["key"], float(self.config.get("timeout", 3)), context)
            if answer is None:
                unanswered += 1
                continue
            answered += 1
            keep(self.config["state_dir"], server["name"], answer)
        totals = merge(kept_answers(self.config["state_dir"]))
        states = budget_states(totals, self.config["clients"], self.config["backends"],
                               today or datetime.datetime.now(datetime.timezone.utc).date())
        apply_refusals(self.config, refused_grants(states))
        with self.lock:
            self.metrics = render_metrics(totals, states, answered, unanswered, time.time()).encode()
        return states

    def serve(self) -> None:
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with service.lock:
                    body = service.metrics
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        if self.config.get("listen_port"):
            server = http.server.ThreadingHTTPServer((self.config["listen_address"], int(self.config["listen_port"])),
                                                     Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
        interval = float(self.config.get("interval", 10))
        while True:
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception as exc:  # pylint: disable=broad-except  # one bad poll must not end the service
                print("onprem-gateway-usage: poll failed: %s" % exc, file=sys.stderr, flush=True)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="poll the servers, export the counts, enforce the budgets")
    serve.add_argument("--config", required=True)
    once = sub.add_parser("poll", help="poll once and print the budgets' states (JSON)")
    once.add_argument("--config", required=True)
    report = sub.add_parser("report", help="tokens and requests per client and model for a span of UTC days")
    report.add_argument("--state-dir", required=True)
    report.add_argument("--since", required=True, help="first UTC day, YYYY-MM-DD")
    report.add_argument("--until", required=True, help="last UTC day, YYYY-MM-DD (included)")
    report.add_argument("--format", choices=["table", "csv", "json"], default="table")
    report.add_argument("--by-server", action="store_true", help="one row per server, client and model")
    args = parser.parse_args(argv)
    if args.command == "report":
        for day in (args.since, args.until):
            datetime.date.fromisoformat(day)
        answers = kept_answers(args.state_dir)
        rows = (report_rows_by_server(answers, args.since, args.until) if args.by_server
                else report_rows(merge(answers), args.since, args.until))
        if args.format == "csv":
            writer = csv.DictWriter(sys.stdout, fieldnames=(["server"] if args.by_server else []) + REPORT_FIELDS,
                                    lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        else:
            sys.stdout.write(json.dumps(rows) + "\n" if args.format == "json"
                             else report_table(rows, args.since, args.until))
        return 0
    with open(args.config, encoding="utf-8") as handle:
        config = json.load(handle)
    service = Service(config)
    if args.command == "poll":
        sys.stdout.write(json.dumps(service.poll_once(), sort_keys=True) + "\n")
        return 0
    service.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())

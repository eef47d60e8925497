# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's alert receiver: a tiny HTTP server appending every POSTed JSON body to a file, one line each, with the
time it arrived and the path it was posted to (Alertmanager's webhook, the Xid monitor's webhook)."""
import http.server
import json
import sys
import time

OUT = sys.argv[3]


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            payload = json.loads(body)
        except ValueError:
            payload = body.decode("utf-8", "replace")
        with open(OUT, "a") as handle:
            handle.write(json.dumps({"received": time.time(), "path": self.path, "body": payload}) + "\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Sink).serve_forever()

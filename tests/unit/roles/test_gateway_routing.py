# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway routes each request by its model to its deployment's backend, with the real parts: the role's files
rendered by ansible-playbook (the plan of two deployments through onprem.vllm.plan_deployments and the role's
defaults), the lab's HAProxy image running them, and the real OpenAI client (inside the serving image) calling it.

Two deployments: chat (generate, served as tiny-chat and chat-alias) and embed (pooling, tiny-embed), each one stand-in
server (a few lines of Python in the serving image, saying which backend answered and what it received); three
clients: one may use every model, one only tiny-chat, and a noisy one has limits (2 at once, 3 a second, 4 KiB
bodies). The buffer is made small (128 KiB) to keep the too-large body cheap, still above the 64 KiB chat that must
route with messages before model (the order older openai-python releases write; the image's 3.63.0 writes model
first, so that body goes through the client's own post()); a body whose model is beyond the buffer goes through the
model finder (files/onprem_model_finder.py, run here as the role runs it on the gateway host): photos of 2 and 8 MB in
base64 with messages first, plain and streamed, and 50 such 8 MB requests at once while the gateway's memory is
sampled. Then the role's drain and undrain
(tasks/drain.yml, undrain.yml) act on each deployment's backend through the gateway's admin socket, with the
undrain's canary through the gateway.

The images are the lab's (make lab-artifacts builds both): on a fresh machine `make test` runs this with the tests
that need the lab share, after the lab's artifacts are built.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest
import yaml

pytestmark = [pytest.mark.needs_docker, pytest.mark.needs_lab_share]

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# The image the lab runs (HAProxy 3.0 from Debian 13, lab/build_gateway_image.py), as the fleet scenario names it.
with open(os.path.join(ROOT, "molecule", "fleet", "lab_overlay.yml")) as _overlay:
    _OVERLAY = yaml.safe_load(_overlay)
    GATEWAY_IMAGE = "%s:%s" % (_OVERLAY["gateway_image"], _OVERLAY["gateway_image_tag"])
with open(os.path.join(ROOT, "inventories", "example", "group_vars", "all", "plan.yml")) as _plan:
    _PLAN = yaml.safe_load(_plan)
    SERVING_IMAGE = "%s:%s" % (_PLAN["onprem_vllm_image"], _PLAN["onprem_vllm_image_tag"])

BUFFER = 131072
PER_SOURCE = 20  # connections one client address may hold
FLOOD_CONNECTIONS = 5000  # slow connections one address opens (the flood), each a request head that never ends
# One address opens more connections than gateway_max_connections_per_source and never finishes a request's head: how
# long the gateway kept each (refused at accept: at once) and what it answered. The fleet's security checks run it too.
FLOOD_SCRIPT = pathlib.Path(ROOT, "molecule", "fleet", "flood.py")
SERVER_KEY = "server-key-0123456789abcdef"
FULL_KEY, LIMITED_KEY = "full-key-0123456789abcdef", "limited-key-0123456789abcdef"
NOISY_KEY, SIZED_KEY = "noisy-key-0123456789abcdef", "sized-key-0123456789abcdef"
ROOMY_KEY = "roomy-key-0123456789abcdef"
# The noisy client's limits: 2 requests at once, 3 a second, bodies of at most 4 KiB.
NOISY_LIMITS = {"max_concurrent_requests": 2, "requests_per_second": 3, "max_body_bytes": 4096}
# Quotes, a backslash and a non-ASCII letter: echoed JSON-escaped in the 404.
UNKNOWN = 'no-such-model "quoted" \\ \u00e9'
DEPLOYMENTS = [
    {"name": "chat", "served_model_name": "tiny-chat", "served_model_aliases": ["chat-alias"], "hosts": "vllm_chat",
     "port": 8000},
    {"name": "embed", "served_model_name": "tiny-embed", "runner": "pooling", "hosts": "vllm_embed", "port": 8001},
]

RENDER = """
- name: Render the gateway's files
  hosts: gw,gw_other
  gather_facts: false
  tasks:
    - name: Check the settings (and load the role's defaults and vars)
      ansible.builtin.import_role:
        name: gateway
        tasks_from: validate.yml

    - name: Render the configuration and maps
      ansible.builtin.template:
        src: "{{ templates }}/{{ item }}.j2"
        dest: "{{ out }}/{{ item }}"
        mode: "0644"
      loop: [haproxy.cfg, clients.map, models.map, grants.lst]

    - name: Render the gateway's own error answers
      ansible.builtin.template:
        src: "{{ templates }}/error.http.j2"
        dest: "{{ out }}/error-{{ _gateway_error.status }}.http"
        mode: "0644"
      loop: "{{ _gateway_error_answers }}"
      loop_control:
        loop_var: _gateway_error

    - name: Copy the hold's Lua
      ansible.builtin.copy:
        src: "{{ templates }}/../files/onprem_hold.lua"
        dest: "{{ out }}/onprem_hold.lua"
        mode: "0644"

    - name: Render each client's model list
      ansible.builtin.template:
        src: "{{ templates }}/client-models.json.j2"
        dest: "{{ out }}/models-{{ _gateway_client.name }}.json"
        mode: "0644"
      loop: "{{ gateway_client_keys }}"
      loop_control:
        loop_var: _gateway_client
"""
DRAIN_UNDRAIN = """
- name: Drain and undrain every deployment's host
  hosts: chat1,embed1
  gather_facts: false
  tasks:
    - name: Drain (chat without a hold, so that its request gets the gateway's 503)
      ansible.builtin.include_role:
        name: gateway
        tasks_from: drain.yml
      vars:
        gateway_hold_timeout: "{{ 0 if inventory_hostname == 'chat1' else 60 }}"

    - name: Put chat on a hold of 5 s by hand (it has no server UP, so its request waits, then gets the 503)
      ansible.builtin.command:
        argv: [python3, -c, "{{ hold_by_hand }}"]
      vars:
        hold_by_hand: >-
          import socket; s = socket.socket(socket.AF_UNIX); s.connect('{{ hostvars.gw.gateway_runtime_dir }}/admin.sock');
          s.sendall(b'onprem hold vllm-chat 5\\n'); print(s.recv(4096).decode())
      register: hold_by_hand
      changed_when: true
      run_once: true

    - name: Ask for the chat model while its only host is drained
      ansible.builtin.uri:
        url: "http://127.0.0.1:{{ hostvars.gw.gateway_port }}/v1/chat/completions"
        method: POST
        body_format: json
        body: {model: tiny-chat, messages: [{role: user, content: hi}]}
        headers: {Authorization: "Bearer {{ hostvars.gw.gateway_client_keys[0].key }}"}
        status_code: [200, 503]
      register: while_drained
      run_once: true

    - name: Ask for an embedding while its only host is drained (held until the undrain)
      ansible.builtin.uri:
        url: "http://127.0.0.1:{{ hostvars.gw.gateway_port }}/v1/embeddings"
        method: POST
        body_format: json
        body: {model: tiny-embed, input: hi}
        headers: {Authorization: "Bearer {{ hostvars.gw.gateway_client_keys[0].key }}", X-Request-Id: held-embedding}
        timeout: 90
      async: 90
      poll: 0
      register: held_request
      run_once: true

    - name: Let the held request reach the gateway
      ansible.builtin.wait_for:
        timeout: 2
      run_once: true

    - name: Undrain
      ansible.builtin.include_role:
        name: gateway
        tasks_from: undrain.yml

    - name: Collect the held request's answer
      ansible.builtin.async_status:
        jid: "{{ held_request.ansible_job_id }}"
      register: held_answer
      until: held_answer.finished
      retries: 60
      delay: 1
      run_once: true

    - name: Report the holds the undrain ended
      ansible.builtin.debug:
        var: gateway_holds
"""

# A vLLM stand-in: /health (passed only by a check that carries the server key), and its runner's routes the tests
# use (a pooling server has no completions, as vLLM's), each answer saying which backend answered, whether the
# gateway's key replaced the client's, the body's length and where "model" is in it.
STAND_IN = r'''
import http.server, json, os, sys, time

NAME, RUNNER, PORT, KEY = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ROUTES = {"generate": ("/v1/chat/completions", "/v1/completions", "/v1/responses"),
          "pooling": ("/v1/embeddings",)}[RUNNER]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, payload, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        if self.path == "/seen":  # asked directly (the gateway forwards no GET but /health's): what got through
            self.send(200, json.dumps(SEEN).encode())
            return
        # As the server's middleware: a check with a key it does not hold fails; one during a drain (the test writes
        # /test/<name>.state: "shutdown" or "fault") gets 503, and /onprem/drain says which.
        state = open("/test/%s.state" % NAME).read().strip() if os.path.exists("/test/%s.state" % NAME) else ""
        if self.path == "/health":
            keyed = self.headers.get("Authorization") == "Bearer " + KEY
            self.send(401 if not keyed else 503 if state else 200, b"{}")
            return
        if self.path == "/onprem/drain":
            self.send(200, json.dumps({"draining": bool(state), "gpu_fault": state == "fault", "in_flight": 0,
                                       "checks": {}}).encode())
            return
        self.send(404, b"{}")

    def do_POST(self):
        SEEN.append(self.headers.get("X-Request-Id"))
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = self.read_chunked()
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw)
        seen = {"backend": NAME, "body_length": len(raw), "model_offset": raw.find(b'"model"'),
                "auth_ok": self.headers.get("Authorization") == "Bearer " + KEY,
                "request_id": self.headers.get("X-Request-Id"), "client": self.headers.get("X-Onprem-Client")}
        model = body.get("model")
        if (body.get("messages") or [{}])[0].get("content") == "slow":
            time.sleep(1.5)  # a long generation: the client-limit checks hold requests open with it
        if self.path not in ROUTES:
            self.send(404, json.dumps({"error": "no such route", "backend": NAME}).encode())
            return
        if self.path == "/v1/embeddings":
            answer = {"object": "list", "model": model, "stand_in": seen,
                      "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
                      "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        elif self.path == "/v1/completions":
            answer = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": model, "stand_in": seen,
                      "choices": [{"index": 0, "text": "pong", "finish_reason": "length"}]}
        elif self.path == "/v1/chat/completions" and body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for delta, finish in (({"role": "assistant", "content": ""}, None), ({"content": "po"}, None),
                                  ({"content": "ng"}, "stop")):
                chunk = {"id": "chat-1", "object": "chat.completion.chunk", "created": 0, "model": model,
                         "stand_in": seen, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                self.chunk(("data: %s\n\n" % json.dumps(chunk)).encode())
            self.chunk(b"data: [DONE]\n\n")
            self.chunk(b"")
            return
        else:
            answer = {"id": "chat-1", "object": "chat.completion", "created": 0, "model": model, "stand_in": seen,
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "pong"}}]}
        self.send(200, json.dumps(answer).encode())

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def read_chunked(self):
        data = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            data += self.rfile.read(size)
            self.rfile.readline()
            if not size:
                return data


SEEN = []


http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
'''

# One address opens more connections than gateway_max_connections_per_source and never finishes a request's head:
# how long the gateway kept each (refused at accept: at once) and what it answered.

# Photo chats of 8 MB at once, messages before model (each through the model finder), with httpx: each one's status
# and the backend that answered, the seconds they took together. Five of these, ten each, make the test's 50.
PHOTO_BURST = r'''
import base64, concurrent.futures, json, os, sys, time
import httpx

url, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
photo = base64.b64encode(os.urandom(8 * 1024 * 1024)).decode()
body = json.dumps({"messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + photo}},
    {"type": "text", "text": "What is in this photo?"}]}], "model": "tiny-chat"}).encode()


def ask(_):
    answer = httpx.post(url + "/v1/chat/completions", content=body, timeout=120,
                        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    return answer.status_code, (answer.json().get("stand_in") or {}).get("backend") if answer.status_code == 200 else None


started = time.monotonic()
with concurrent.futures.ThreadPoolExecutor(count) as pool:
    results = list(pool.map(ask, range(count)))
print(json.dumps({"results": results, "seconds": round(time.monotonic() - started, 1), "body_bytes": len(body)}))
'''

# The checks, with the real OpenAI client: one JSON object of outcomes on stdout.
CLIENT = r'''
import base64, concurrent.futures, json, os, socket, threading, time, urllib.request
import httpx, openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

URL = os.environ["GW_URL"]
full = openai.OpenAI(base_url=URL + "/v1", api_key=os.environ["FULL_KEY"], max_retries=0, timeout=30)
limited = openai.OpenAI(base_url=URL + "/v1", api_key=os.environ["LIMITED_KEY"], max_retries=0, timeout=30)
BUFFER = int(os.environ["BUFFER"])
LONG = "lorem ipsum dolor sit amet " * 3200  # ~86 KB: over 64 KB, within the 128 KiB buffer
TOO_LONG = "lorem ipsum dolor sit amet " * 6400  # ~173 KB: beyond it


def outcome(call):
    try:
        return {"ok": True, "value": call()}
    except openai.APIStatusError as exc:
        return {"ok": False, "error": type(exc).__name__, "status": exc.status_code, "body": exc.body}
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__, "detail": str(exc)}


def chat(client, model, content="ping"):
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])
    return {"content": answer.choices[0].message.content, **answer.stand_in}


def chat_messages_first(content, model="tiny-chat"):
    # The body in the key order older openai-python releases write (messages, then model); this image's client
    # writes model first, so its own calls cannot show it.
    answer = full.post("/chat/completions", cast_to=ChatCompletion,
                       body={"messages": [{"role": "user", "content": content}], "model": model})
    return {"content": answer.choices[0].message.content, **answer.stand_in}


def photo_messages(megabytes):
    """A chat turn with one photo of that many megabytes (random bytes: a photo does not compress) in base64."""
    photo = base64.b64encode(os.urandom(int(megabytes * 1024 * 1024))).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + photo}},
                                         {"type": "text", "text": "What is in this photo?"}]}]


def photo_chat(megabytes, stream=False, client=full, model="tiny-chat"):
    """A photo chat in the order other clients write it (messages, then model): beyond the buffer."""
    body = {"messages": photo_messages(megabytes), "model": model}
    if not stream:
        answer = client.post("/chat/completions", cast_to=ChatCompletion, body=body)
        return {"content": answer.choices[0].message.content, **answer.stand_in}
    chunks = list(client.post("/chat/completions", cast_to=ChatCompletion, body=dict(body, stream=True), stream=True,
                              stream_cls=openai.Stream[ChatCompletionChunk]))
    return {"content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), "chunks": len(chunks),
            **chunks[0].stand_in}


def chat_stream(model):
    stream = full.chat.completions.create(model=model, messages=[{"role": "user", "content": "ping"}], stream=True)
    chunks = list(stream)
    return {"content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
            "chunks": len(chunks), **chunks[0].stand_in}


def embed(client, model):
    answer = client.embeddings.create(model=model, input=["ping"], encoding_format="float")
    return {"dims": len(answer.data[0].embedding), **answer.stand_in}


def raw(path, body, key=os.environ["FULL_KEY"], headers=()):
    answer = httpx.post(URL + path, content=json.dumps(body), timeout=30,
                        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json", **dict(headers)})
    return {"status": answer.status_code, "body": answer.text[:2000], "headers": dict(answer.headers)}


def wire(head, payload=b"", pause=0.0, until_closed=False):
    """Sends a request as bytes (head, then payload after pause seconds, while the answer is read): the status, the
    answer's body and the seconds it took (until_closed: until the gateway closed the connection, at most 15 s).
    Where the gateway answers before the payload is all sent, so be it."""
    host, port = URL.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=15 if until_closed else 30)
    started = time.monotonic()

    def send():
        try:
            sock.sendall(head)
            time.sleep(pause)
            sock.sendall(payload)
        except OSError:
            pass

    sender = threading.Thread(target=send)
    sender.start()
    answer = b""
    try:
        while until_closed or b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
                ([line.split(b":")[1] for line in answer.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                 or [b"0"])[0]):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except OSError as exc:
        answer += ("<%s>" % type(exc).__name__).encode()
    elapsed = time.monotonic() - started
    sock.close()
    sender.join()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return {"status": status, "body": answer.split(b"\r\n\r\n", 1)[-1][:2000].decode(errors="replace"),
            "seconds": round(elapsed, 2)}


def wire_post(body, key, version="HTTP/1.1", chunk=0, request_id=None, length=None, pause=0.0, until_closed=False,
              unfinished=False):
    """POSTs a chat body: with Content-Length (length, if given, instead of the true one), or chunked in pieces of
    chunk bytes (unfinished: without the last chunk)."""
    head = ["POST /v1/chat/completions " + version, "Host: gateway", "Content-Type: application/json"]
    head += ["Authorization: Bearer " + key] if key else []
    head += ["X-Request-Id: " + request_id] if request_id else []
    if chunk:
        head.append("Transfer-Encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + chunk]), body[i:i + chunk])
                           for i in range(0, len(body), chunk)) + (b"" if unfinished else b"0\r\n\r\n")
    else:
        head.append("Content-Length: %d" % (len(body) if length is None else length))
        payload = body
    return wire(("\r\n".join(head) + "\r\n\r\n").encode(), payload, pause, until_closed)


def chat_body(size):
    body = json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": ""}]}).encode()
    return body.replace(b'"content": ""', b'"content": "' + b"x" * (size - len(body)) + b'"')


deadline = time.monotonic() + 30  # the gateway and both stand-ins up
while not outcome(lambda: [chat(full, "tiny-chat"), embed(full, "tiny-embed")])["ok"] and time.monotonic() < deadline:
    time.sleep(0.2)

CHAT = {"model": "tiny-chat", "messages": [{"role": "user", "content": "x"}]}
CHAT_EMBED_FORGED = {"model": "tiny-embed", "messages": [{"role": "user", "content": "x"}]}
results = {
    "chat": outcome(lambda: chat(full, "tiny-chat")),
    "chat_stream": outcome(lambda: chat_stream("tiny-chat")),
    "alias": outcome(lambda: chat(full, "chat-alias")),
    "alias_stream": outcome(lambda: chat_stream("chat-alias")),
    "embed": outcome(lambda: embed(full, "tiny-embed")),
    "limited_chat": outcome(lambda: chat(limited, "tiny-chat")),
    "limited_alias": outcome(lambda: chat(limited, "chat-alias")),
    "long_messages_first": outcome(lambda: chat_messages_first(LONG)),
    "too_long_messages_first": outcome(lambda: chat_messages_first(TOO_LONG)),
    "photo_2mb_messages_first": outcome(lambda: photo_chat(2)),
    "photo_8mb_messages_first": outcome(lambda: photo_chat(8)),
    "photo_2mb_messages_first_stream": outcome(lambda: photo_chat(2, stream=True)),
    "photo_8mb_messages_first_stream": outcome(lambda: photo_chat(8, stream=True)),
    "photo_2mb_messages_first_limited_embed": outcome(lambda: photo_chat(2, client=limited, model="tiny-embed")),
    "photo_2mb_no_model": raw("/v1/chat/completions", {"messages": photo_messages(2)}),
    # A client whose max_body_bytes (twice the buffer) the photo exceeds: refused before the finder reads anything.
    "photo_2mb_over_client_limit": wire_post(
        json.dumps({"messages": photo_messages(2), "model": "tiny-chat"}).encode(), os.environ["ROOMY_KEY"],
        request_id="roomy-photo"),
    # The finder's header, forged by a client: ignored on the public port (the body's model routes and is judged).
    "forged_routed_model": raw("/v1/chat/completions", CHAT_EMBED_FORGED, key=os.environ["LIMITED_KEY"],
                               headers={"X-Onprem-Routed-Model": "tiny-chat"}.items()),
    "forged_routed_model_photo": raw("/v1/chat/completions", {"messages": photo_messages(2), "model": "tiny-embed"},
                                     key=os.environ["LIMITED_KEY"],
                                     headers={"X-Onprem-Routed-Model": "tiny-chat"}.items()),
    "too_long_own_order": outcome(lambda: chat(full, "tiny-chat", TOO_LONG)),
    "unknown": outcome(lambda: chat(full, os.environ["UNKNOWN_MODEL"])),
    "limited_embed": outcome(lambda: embed(limited, "tiny-embed")),
    "models_full": outcome(lambda: [m.to_dict() for m in full.models.list()]),
    "models_limited": outcome(lambda: [m.to_dict() for m in limited.models.list()]),
    "no_model": raw("/v1/chat/completions", {"messages": CHAT["messages"]}),
    "no_key": raw("/v1/chat/completions", CHAT, key="not-a-client-key-000"),
    "canary": raw("/v1/chat/completions", CHAT, headers={"X-Onprem-Canary": os.environ["CANARY_TOKEN"]}.items()),
    "plain": raw("/v1/chat/completions", CHAT),
    "own_request_id": raw("/v1/chat/completions", CHAT, headers={"X-Request-Id": "ide-7f3a:0001"}.items()),
    "bad_request_id": raw("/v1/chat/completions", CHAT, headers={"X-Request-Id": "two words"}.items()),
}
for path in ("/tokenize", "/pooling", "/classify", "/v1/models/tiny-embed", "/v1/rerank", "/score", "/v1/responses"):
    results["path " + path] = raw(path, {"model": "tiny-embed", "prompt": "x"})

# The noisy client (2 at once, 3 a second, 4 KiB bodies) and, meanwhile, the others.
SLOW = {"model": "tiny-chat", "messages": [{"role": "user", "content": "slow"}]}
noisy, burst = os.environ["NOISY_KEY"], []
threads = [threading.Thread(target=lambda: burst.append(raw("/v1/chat/completions", SLOW, key=noisy)))
           for _ in range(4)]
for thread in threads:
    thread.start()
time.sleep(0.3)  # the four are in: two generating, two refused
results["quiet_during_burst"] = raw("/v1/chat/completions", CHAT)
for thread in threads:
    thread.join()
results["noisy_concurrent"] = burst
time.sleep(2.5)  # the second's window of the burst is over
results["noisy_rate"] = [raw("/v1/chat/completions", CHAT, key=noisy) for _ in range(10)]
results["quiet_after_rate"] = raw("/v1/chat/completions", CHAT)
# HAProxy's rate adds a share of the previous second's count: two seconds on, the burst no longer counts.
time.sleep(2.5)
results["noisy_big_body"] = raw("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]},
                                key=noisy)
results["noisy_small_body"] = raw("/v1/chat/completions", CHAT, key=noisy)

# The sized client (4 KiB bodies) and the roomy one (twice the buffer, as the example's clients: more than the gateway
# buffers) send bodies every way HTTP/1 can: each over its limit is refused by the gateway and never reaches a server
# (the request id says which did).
sized, roomy = os.environ["SIZED_KEY"], os.environ["ROOMY_KEY"]
results["sized"] = {
    "small_chunked": wire_post(chat_body(1000), sized, chunk=100, request_id="sized-small-chunked"),
    "small_http10": wire_post(chat_body(1000), sized, version="HTTP/1.0", request_id="sized-small-http10"),
    "big_length": wire_post(chat_body(5000), sized, request_id="sized-big-length"),
    "big_chunked": wire_post(chat_body(5000), sized, chunk=100, request_id="sized-big-chunked"),
    "big_http10": wire_post(chat_body(5000), sized, version="HTTP/1.0", request_id="sized-big-http10"),
    "big_http10_chunked": wire_post(chat_body(5000), sized, version="HTTP/1.0", chunk=100,
                                    request_id="sized-big-http10-chunked"),
}
results["roomy"] = {
    "quarter_buffer_chunked": wire_post(chat_body(BUFFER // 4), roomy, chunk=1024,
                                        request_id="roomy-quarter-buffer-chunked"),
    "buffer_chunked": wire_post(chat_body(BUFFER), roomy, chunk=1024, request_id="roomy-buffer-chunked"),
    "huge_chunked": wire_post(chat_body(3 * BUFFER), roomy, chunk=1024, request_id="roomy-huge-chunked"),
    "one_huge_chunk": wire_post(chat_body(3 * BUFFER), roomy, chunk=3 * BUFFER, request_id="roomy-one-huge-chunk"),
    "huge_length": wire_post(chat_body(3 * BUFFER), roomy, request_id="roomy-huge-length"),
}
# The key is checked before the body is awaited: without a key, an announced megabyte that never comes gets 401 at
# once, and its connection closes once the client has been silent for gateway_timeout_client (the role's 10 s); a
# keyed client gets 408 once gateway_timeout_request_body (3 s here) has passed.
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    slow = {"no_key": pool.submit(wire_post, b"{", None, length=1000000),
            "wrong_key": pool.submit(wire_post, b"{", "not-a-client-key-000", length=1000000),
            "no_key_held": pool.submit(wire_post, b"{", None, length=1000000, until_closed=True),
            "no_key_chunked_held": pool.submit(wire_post, b"{", None, chunk=1, unfinished=True, until_closed=True),
            "keyed": pool.submit(wire_post, b"{", os.environ["FULL_KEY"], length=1000)}
    results["slow_body"] = {case: future.result() for case, future in slow.items()}
results["responses"] = raw("/v1/responses", {"model": "chat-alias", "input": "ping"})
results["malformed"] = wire(b"POST /v1/chat/completions HTTP/1.1\r\nHost gateway\r\n\r\n")
results["full_huge_chunked"] = wire_post(chat_body(3 * BUFFER), os.environ["FULL_KEY"], chunk=1024,
                                         request_id="full-huge-chunked")
results["seen"] = json.load(urllib.request.urlopen(os.environ["CHAT_URL"] + "/seen", timeout=10))
print(json.dumps(results))
'''


def _docker(*args, check=True, timeout=120):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def _ansible_playbook(inventory, book, timeout=180):
    """Runs a playbook with the json callback: (exit status, {task name: result of each host})."""
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_DEPRECATION_WARNINGS="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                           str(book)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    tasks = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            tasks.setdefault(task["task"]["name"], {}).update(task["hosts"])
    return proc.returncode, tasks


def _render(tmp, inventory, render, stand_in, client):
    """Writes the test's inventory, playbook and scripts into tmp and runs the playbook: its tasks' results."""
    (tmp / "hosts.yml").write_text(json.dumps(inventory))
    (tmp / "render.yml").write_text(render)
    (tmp / "stand_in.py").write_text(stand_in)
    (tmp / "client.py").write_text(client)
    rc, tasks = _ansible_playbook(tmp / "hosts.yml", tmp / "render.yml")
    assert rc == 0, _failures(tasks)
    return tasks


def _failures(tasks):
    return {name: {host: result.get("msg") for host, result in hosts.items()
                   if result.get("failed") and not result.get("ignored")}
            for name, hosts in tasks.items()
            if any(r.get("failed") and not r.get("ignored") for r in hosts.values())}


def _gateway_log(container):
    logs = _docker("logs", container, check=False)
    return logs.stdout + logs.stderr


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _self_signed_pem(name):
    """A throwaway certificate for name and its key, as the role writes them to tls.pem."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def _memory_peak_file(container):
    """The container's cgroup file of its peak memory (v1 max_usage_in_bytes, v2 memory.peak), or None."""
    full_id = _docker("inspect", "-f", "{{.Id}}", container).stdout.strip()
    for path in ("/sys/fs/cgroup/memory/docker/%s/memory.max_usage_in_bytes" % full_id,
                 "/sys/fs/cgroup/system.slice/docker-%s.scope/memory.peak" % full_id):
        if os.path.exists(path):
            return path
    return None


def _rss_peak_bytes(container):
    """The resident peak (VmHWM) of a container's main process, read from the host."""
    pid = int(_docker("inspect", "-f", "{{.State.Pid}}", container).stdout)
    with open("/proc/%d/status" % pid) as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def _photo_burst(tmp, prefix, network, count=50):
    """PHOTO_BURST against the gateway: its outcome, and the gateway's memory (HAProxy's container at its peak during
    the burst, the finder's resident peak) against the bodies' total."""
    (tmp / "photo_burst.py").write_text(PHOTO_BURST)
    peak_file = _memory_peak_file(prefix + "-gw")
    before = int(open(peak_file).read()) if peak_file else None
    if peak_file and peak_file.endswith("max_usage_in_bytes"):
        with open(peak_file, "w") as reset:  # v1: the peak from now on
            reset.write("0")
    # From five client addresses, ten requests each: one address may hold PER_SOURCE connections.
    senders = [subprocess.Popen(["docker", "run", "--rm", "--name", "%s-photos%d" % (prefix, n), "--network", network,
                                 "-v", "%s:/test:ro" % tmp, "--entrypoint", "python3", SERVING_IMAGE,
                                 "/test/photo_burst.py", "http://%s-gw:4000" % prefix, FULL_KEY, str(count // 5)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(5)]
    outputs = [sender.communicate(timeout=300) for sender in senders]
    errors = [err[-2000:] for _out, err in outputs]
    assert all(sender.returncode == 0 for sender in senders), (errors, _gateway_log(prefix + "-gw")[-3000:])
    parts = [json.loads(out) for out, _err in outputs]
    result = {"results": [r for part in parts for r in part["results"]], "body_bytes": parts[0]["body_bytes"],
              "seconds": max(part["seconds"] for part in parts)}
    memory = {"haproxy_peak_bytes": int(open(peak_file).read()) if peak_file else None,
              "haproxy_before_bytes": before, "finder_peak_rss_bytes": _rss_peak_bytes(prefix + "-finder"),
              "bodies_bytes": result["body_bytes"] * count, "buffer_bytes": BUFFER}
    print("photo burst: %d requests of %d bytes in %s s; memory %s"
          % (count, result["body_bytes"], result["seconds"], memory))
    return result, memory


def _haproxy_check(config, state):
    """HAProxy's own check of a folder of rendered files, warnings made errors (-dW)."""
    return _docker("run", "--rm", "--network", "none", "-v", "%s:/usr/local/etc/haproxy:ro" % config,
                   "-v", "%s:/var/lib/haproxy-state:ro" % state, GATEWAY_IMAGE,
                   "-dW", "-c", "-f", "/usr/local/etc/haproxy/haproxy.cfg", check=False)


def _admin(runtime, command):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(runtime / "admin.sock"))
        sock.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: sock.recv(65536), b"")).decode()


def _budget_refusal(runtime, port):
    """The usage service's way to refuse a client over its budget: an entry of the ACL file, added and removed on the
    admin socket. The outcome of a chat request of the full client before, during and after."""
    acl = "/var/lib/haproxy-state/over-budget.lst"

    def ask():
        request = urllib.request.Request(
            "http://127.0.0.1:%d/v1/chat/completions" % port, method="POST",
            data=json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "x"}]}).encode(),
            headers={"Authorization": "Bearer " + FULL_KEY, "Content-Type": "application/json",
                     "X-Onprem-Client": "forged"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return {"status": answer.status, "client": json.load(answer)["stand_in"]["client"]}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": json.load(exc)}
    before = ask()
    _admin(runtime, "add acl %s full/tiny-chat" % acl)
    refused = ask()
    _admin(runtime, "del acl %s full/tiny-chat" % acl)
    return {"before": before, "refused": refused, "after": ask()}


def _server_status(runtime, backend, server):
    """A server's status on the gateway's admin socket (UP, DOWN, MAINT, "UP 1/2" ...)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(runtime / "admin.sock"))
        sock.sendall(b"show stat\n")
        data = b"".join(iter(lambda: sock.recv(65536), b""))
    for line in data.decode().splitlines():
        fields = line.split(",")
        if fields[:2] == [backend, server]:
            return fields[17]
    return ""


def _wait_for_status(runtime, backend, server, wanted, timeout=30):
    deadline, status = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        status = _server_status(runtime, backend, server)
        if status == wanted:
            return
        time.sleep(0.2)
    raise AssertionError("%s/%s is %r, not %s, after %d s" % (backend, server, status, wanted, timeout))


def _post(port, path, body, request_id):
    """(status, seconds, the answer's JSON) of a request through the gateway with the full client's key."""
    request = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (port, path), method="POST", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + FULL_KEY, "Content-Type": "application/json",
                 "X-Request-Id": request_id})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, time.monotonic() - started, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, time.monotonic() - started, json.load(error)


def _shutdown_and_fault(tmp, runtime, prefix, port):
    """embed1, tiny-embed's only server, drains for a shutdown (its checks fail, its drain status says so), then its
    host powers off and boots: an embedding sent meanwhile is held at the gateway, with no rollout to start the hold,
    and answered once the server is UP. Then chat1, tiny-chat's only server, is taken out by a GPU fault: a chat
    request gets the gateway's 503 at once."""
    outcomes = {}
    (tmp / "embed.state").write_text("shutdown")
    _wait_for_status(runtime, "vllm-embed", "embed1", "DOWN")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_post, port, "/v1/embeddings", {"model": "tiny-embed", "input": "hi"}, "held-by-shutdown")
        time.sleep(2)
        _docker("stop", "-t", "1", prefix + "-embed")
        time.sleep(2)
        (tmp / "embed.state").unlink()
        _docker("start", prefix + "-embed")
        outcomes["shutdown"] = held.result(timeout=120)
    (tmp / "chat.state").write_text("fault")
    _wait_for_status(runtime, "vllm-chat", "chat1", "DOWN")
    outcomes["fault"] = _post(port, "/v1/chat/completions",
                              {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]}, "not-held-fault")
    (tmp / "chat.state").unlink()
    _wait_for_status(runtime, "vllm-chat", "chat1", "UP")
    return outcomes


def canary_token(backend, server):
    """The undrain's canary token for a server of a backend (what haproxy.cfg.j2 derives)."""
    return hashlib.sha256(("%s:canary:%s/%s" % (SERVER_KEY, backend, server)).encode()).hexdigest()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """The rendered files, the running gateway and stand-ins on their own Docker network, and the client's outcomes."""
    missing = [image for image in (GATEWAY_IMAGE, SERVING_IMAGE)
               if _docker("image", "inspect", image, check=False).returncode]
    if missing:
        pytest.fail("the lab's images %s are missing: run make lab-artifacts" % ", ".join(missing))
    tmp = tmp_path_factory.mktemp("gateway-routing")
    prefix = "onprem-gwtest-" + uuid.uuid4().hex[:8]
    config, runtime, state, other = tmp / "config", tmp / "runtime", tmp / "state", tmp / "config-other"
    for folder in (config, runtime, state, other):
        folder.mkdir()
    runtime.chmod(0o777)  # HAProxy (uid 99 in the image) makes its admin socket there
    port = _free_port()
    tls_cert, tls_key = _self_signed_pem("gw-other")
    common = {"ansible_connection": "local", "ansible_python_interpreter": os.path.abspath(sys.executable)}
    inventory = {"all": {
        "vars": {"onprem_vllm_deployments": DEPLOYMENTS, "onprem_vllm_served_model_name": "unused",
                 "onprem_vllm_api_key": SERVER_KEY, **common},
        "children": {
            "vllm_servers": {"children": {
                "vllm_chat": {"hosts": {"chat1": {"onprem_vllm_advertise_host": prefix + "-chat"}}},
                "vllm_embed": {"hosts": {"embed1": {"onprem_vllm_advertise_host": prefix + "-embed"}}}}},
            "vllm_gateways": {"hosts": {"gw": {
                "out": str(config), "templates": os.path.join(ROOT, "roles", "gateway", "templates"),
                "gateway_image_tag": GATEWAY_IMAGE.split(":", 1)[1],
                "gateway_request_buffer_size": BUFFER, "gateway_port": port,
                "gateway_runtime_dir": str(runtime), "gateway_state_dir": str(state),
                "gateway_health_check_interval": "500ms", "gateway_health_check_fast_interval": "200ms",
                "gateway_drain_timeout": 30, "gateway_undrain_timeout": 30, "gateway_canary_timeout": 15,
                "gateway_timeout_request_body": "3s", "gateway_max_connections_per_source": PER_SOURCE,
                "gateway_client_keys": [{"name": "full", "key": FULL_KEY},
                                        {"name": "limited", "key": LIMITED_KEY, "models": ["tiny-chat"]},
                                        {"name": "noisy", "key": NOISY_KEY, **NOISY_LIMITS},
                                        {"name": "sized", "key": SIZED_KEY, "max_body_bytes": 4096},
                                        {"name": "roomy", "key": ROOMY_KEY, "max_body_bytes": 2 * BUFFER}]}}},
            # Only rendered and checked: the template's other branches (TLS, no metrics frontend, no bound per
            # source, no client limits).
            "gateway_variants": {"hosts": {"gw_other": {
                "out": str(other), "templates": os.path.join(ROOT, "roles", "gateway", "templates"),
                "gateway_image_tag": GATEWAY_IMAGE.split(":", 1)[1], "gateway_tls_certificate": tls_cert,
                "gateway_tls_key": tls_key, "gateway_metrics_port": 0, "gateway_max_connections_per_source": 0,
                "gateway_model_finder": False,
                "gateway_client_keys": [{"name": "full", "key": FULL_KEY}]}}}}}}
    _render(tmp, inventory, RENDER, STAND_IN, CLIENT)
    (other / "tls.pem").write_text(tls_cert + tls_key)
    for folder in (config, other):
        folder.chmod(0o755)
    (state / "over-budget.lst").write_text("")  # the gateway role creates it empty; the usage service fills it
    config_checks = {"routing": _haproxy_check(config, state), "other branches": _haproxy_check(other, state)}

    network = prefix + "-net"
    containers = [prefix + "-" + name for name in ("chat", "embed", "gw", "client", "flood", "finder")] + [
        "%s-photos%d" % (prefix, n) for n in range(5)]
    # The model finder as the role runs it on the gateway host: under HAProxy's user (99), its socket beside HAProxy's
    # in the runtime folder, its spool its own (here in a container of the serving image, for its Python).
    finder_dir = tmp / "finder"
    finder_dir.mkdir()
    shutil.copyfile(os.path.join(ROOT, "roles", "gateway", "files", "onprem_model_finder.py"),
                    finder_dir / "onprem_model_finder.py")
    (finder_dir / "config.json").write_text(json.dumps({
        "listen": "/run/haproxy-admin/model-finder.sock", "routed_socket": "/run/haproxy-admin/routed.sock",
        "spool_dir": "/spool", "max_body_bytes": 64 * 1024 * 1024}))
    finder_dir.chmod(0o755)
    (tmp / "spool").mkdir(mode=0o700)
    os.chown(tmp / "spool", 99, 99)
    try:
        _docker("run", "-d", "--name", prefix + "-finder", "--network", "none", "--user", "99:99",
                "-v", "%s:/spool" % (tmp / "spool"), "-v", "%s:/run/haproxy-admin" % runtime,
                "-v", "%s:/finder:ro" % finder_dir, "--entrypoint", "python3", SERVING_IMAGE,
                "/finder/onprem_model_finder.py", "--config", "/finder/config.json")
        _docker("network", "create", network)
        for name, deployment in zip(("chat", "embed"), DEPLOYMENTS):
            _docker("run", "-d", "--name", "%s-%s" % (prefix, name), "--network", network,
                    "-v", "%s:/test:ro" % tmp, "--entrypoint", "python3", SERVING_IMAGE,
                    "/test/stand_in.py", name, deployment.get("runner", "generate"), str(deployment["port"]),
                    SERVER_KEY)
        _docker("run", "-d", "--name", prefix + "-gw", "--network", network,
                "-p", "127.0.0.1:%d:4000" % port,
                "-v", "%s:/usr/local/etc/haproxy:ro" % config, "-v", "%s:/run/haproxy-admin" % runtime,
                "-v", "%s:/var/lib/haproxy-state:ro" % state, GATEWAY_IMAGE)
        client = _docker("run", "--rm", "--name", prefix + "-client", "--network", network,
                         "-v", "%s:/test:ro" % tmp, "-e", "GW_URL=http://%s-gw:4000" % prefix,
                         "-e", "FULL_KEY=" + FULL_KEY, "-e", "LIMITED_KEY=" + LIMITED_KEY, "-e", "NOISY_KEY=" + NOISY_KEY,
                         "-e", "SIZED_KEY=" + SIZED_KEY, "-e", "ROOMY_KEY=" + ROOMY_KEY, "-e", "BUFFER=%d" % BUFFER,
                         "-e", "CHAT_URL=http://%s-chat:%d" % (prefix, DEPLOYMENTS[0]["port"]),
                         "-e", "CANARY_TOKEN=" + canary_token("vllm-chat", "chat1"), "-e", "UNKNOWN_MODEL=" + UNKNOWN,
                         "--entrypoint", "python3", SERVING_IMAGE, "/test/client.py", check=False)
        assert client.returncode == 0, (client.stderr[-3000:], _gateway_log(prefix + "-gw")[-6000:])
        outcomes = json.loads(client.stdout)
        (tmp / "drain.yml").write_text(DRAIN_UNDRAIN)
        drain_rc, drain_tasks = _ansible_playbook(tmp / "hosts.yml", tmp / "drain.yml")
        request = urllib.request.Request(
            "http://127.0.0.1:%d/v1/chat/completions" % port, method="POST",
            data=json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "x"}]}).encode(),
            headers={"Authorization": "Bearer " + FULL_KEY, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            after_undrain = json.load(answer)["stand_in"]
        # The flood from the client's address; meanwhile a keyed client from another (this machine) is served.
        (tmp / "flood.py").write_text(FLOOD_SCRIPT.read_text())
        with subprocess.Popen(["docker", "run", "--rm", "--name", prefix + "-flood", "--network", network,
                               "-v", "%s:/test:ro" % tmp, "--entrypoint", "python3", SERVING_IMAGE, "/test/flood.py",
                               prefix + "-gw", "4000", str(FLOOD_CONNECTIONS)], stdout=subprocess.PIPE, text=True) as flood:
            assert flood.stdout.readline().strip() == "holding"
            started = time.monotonic()
            with urllib.request.urlopen(request, timeout=30) as answer:
                during_flood = {"status": answer.status, "seconds": time.monotonic() - started}
            flooded = json.loads(flood.stdout.read())
        photo_burst, memory = _photo_burst(tmp, prefix, network)
        spool_left = os.listdir(tmp / "spool")
        budget = _budget_refusal(runtime, port)
        shutdown_and_fault = _shutdown_and_fault(tmp, runtime, prefix, port)
        yield {"photo_burst": photo_burst, "memory": memory, "spool_left": spool_left, "budget": budget,
               "shutdown_and_fault": shutdown_and_fault, "config": config, "config_checks": config_checks,
               "outcomes": outcomes, "drain_rc": drain_rc,
               "drain_tasks": drain_tasks, "flooded": flooded, "during_flood": during_flood,
               "state_file": (state / "servers.state").read_text(), "after_undrain": after_undrain,
               "log": _gateway_log(prefix + "-gw")}
    finally:
        for container in containers:
            _docker("rm", "-f", container, check=False)
        _docker("network", "rm", network, check=False)


@pytest.mark.parametrize("case, backend", [
    ("chat", "chat"), ("chat_stream", "chat"), ("alias", "chat"), ("alias_stream", "chat"), ("embed", "embed"),
    ("limited_chat", "chat"), ("limited_alias", "chat")])
def test_the_openai_client_reaches_the_backend_of_the_model_it_names(gateway, case, backend):
    result = gateway["outcomes"][case]
    assert result["ok"], result
    assert result["value"]["backend"] == backend
    assert result["value"]["auth_ok"]  # the gateway's key replaced the client's
    if case != "embed":
        assert result["value"]["content"] == "pong"
    if case.endswith("_stream"):
        assert result["value"]["chunks"] == 3


def test_a_long_chat_with_messages_before_model_routes_within_the_buffer(gateway):
    result = gateway["outcomes"]["long_messages_first"]
    assert result["ok"], result
    assert result["value"]["backend"] == "chat"
    assert 65536 < result["value"]["model_offset"] < result["value"]["body_length"] < BUFFER


def test_a_body_with_model_first_routes_at_any_size(gateway):
    result = gateway["outcomes"]["too_long_own_order"]  # the image's client writes model first
    assert result["ok"], result
    assert result["value"]["backend"] == "chat"
    assert result["value"]["body_length"] > BUFFER and result["value"]["model_offset"] < 16


def test_a_body_whose_model_is_beyond_the_buffer_routes_through_the_model_finder(gateway):
    result = gateway["outcomes"]["too_long_messages_first"]
    assert result["ok"], result
    assert result["value"]["backend"] == "chat" and result["value"]["auth_ok"]
    assert result["value"]["model_offset"] > BUFFER and result["value"]["client"] == "full"


@pytest.mark.parametrize("megabytes", [2, 8])
@pytest.mark.parametrize("stream", [False, True])
def test_photo_chats_with_messages_before_model_are_answered_by_the_deployment_they_name(gateway, megabytes, stream):
    """Base64 photos of 2 and 8 MB (2.7 and 10.7 MB of body), model last: routed whole through the model finder, the
    key replaced by the servers', the request id and client name passed on, a stream relayed as one."""
    result = gateway["outcomes"]["photo_%dmb_messages_first%s" % (megabytes, "_stream" if stream else "")]
    assert result["ok"], result
    value = result["value"]
    assert value["backend"] == "chat" and value["auth_ok"] and value["content"] == "pong"
    assert value["body_length"] > megabytes * 1024 * 1024 * 4 // 3 and value["model_offset"] > value["body_length"] - 64
    assert value["client"] == "full" and value["request_id"]
    if stream:
        assert value["chunks"] == 3


def test_a_photo_chat_is_judged_by_the_clients_grants_and_a_body_without_model_is_refused(gateway):
    refused = gateway["outcomes"]["photo_2mb_messages_first_limited_embed"]
    assert (refused["error"], refused["status"]) == ("PermissionDeniedError", 403), refused
    no_model = gateway["outcomes"]["photo_2mb_no_model"]
    assert no_model["status"] == 400 and "no model in the request" in no_model["body"], no_model


def test_a_photo_over_the_clients_body_limit_gets_413_before_the_model_finder(gateway):
    result = gateway["outcomes"]["photo_2mb_over_client_limit"]
    assert result["status"] == 413 and "larger than this API key may send" in result["body"], result


def test_a_forged_model_finder_header_chooses_nothing(gateway):
    """A client that sends X-Onprem-Routed-Model itself (the limited client, granted tiny-chat only, naming tiny-chat
    there and tiny-embed in the body) is judged on its body's model: 403, with a small body and with a 2 MB photo that
    goes through the finder, which replaces the header with the model it read."""
    for case in ("forged_routed_model", "forged_routed_model_photo"):
        result = gateway["outcomes"][case]
        assert result["status"] == 403 and "may not use this model" in result["body"], (case, result)


def test_fifty_photo_chats_at_once_keep_the_gateways_memory_bounded(gateway):
    """50 chats with an 8 MB photo (10.7 MB of body each, 0.5 GB in all), model last, at once: every one answered by
    its deployment; HAProxy's peak holds buffers, not bodies (far below one body per request), the finder's resident
    peak a few chunks per request, and its spool is empty afterwards."""
    burst, memory = gateway["photo_burst"], gateway["memory"]
    assert burst["results"] == [[200, "chat"]] * 50, burst
    assert memory["finder_peak_rss_bytes"] < 64 * 1024 * 1024, memory
    if memory["haproxy_peak_bytes"] is not None:
        assert memory["haproxy_peak_bytes"] < memory["bodies_bytes"] // 4, memory
    assert gateway["spool_left"] == []


def test_an_unknown_model_is_the_clients_not_found_error_naming_it(gateway):
    result = gateway["outcomes"]["unknown"]
    assert (result["error"], result["status"]) == ("NotFoundError", 404), result
    assert result["body"] == {"message": "The model `%s` does not exist." % UNKNOWN, "type": "NotFoundError",
                              "code": 404}


def test_a_client_asking_a_model_not_granted_gets_permission_denied(gateway):
    result = gateway["outcomes"]["limited_embed"]
    assert (result["error"], result["status"]) == ("PermissionDeniedError", 403), result


def test_the_gateway_lists_each_client_the_models_it_may_use(gateway):
    full, limited = gateway["outcomes"]["models_full"], gateway["outcomes"]["models_limited"]
    assert full["ok"] and limited["ok"], (full, limited)
    assert full["value"] == [{"id": name, "object": "model", "owned_by": "onprem-vllm"}
                             for name in ("tiny-chat", "tiny-embed")]
    assert [model["id"] for model in limited["value"]] == ["tiny-chat"]


@pytest.mark.parametrize("case, status, message", [
    ("no_model", 400, "no model in the request"), ("no_key", 401, "missing or unknown API key")])
def test_the_gateway_answers_a_request_it_cannot_route_itself(gateway, case, status, message):
    result = gateway["outcomes"][case]
    assert result["status"] == status and json.loads(result["body"])["error"]["message"] == message, result


@pytest.mark.parametrize("path", ["/tokenize", "/pooling", "/classify", "/v1/models/tiny-embed"])
def test_paths_of_no_runner_are_closed_at_the_gateway(gateway, path):
    result = gateway["outcomes"]["path " + path]
    assert result["status"] == 404 and json.loads(result["body"])["error"]["message"] == "not found", result


@pytest.mark.parametrize("path", ["/v1/rerank", "/score"])
def test_a_pooling_deployments_paths_are_open_while_it_exists(gateway, path):
    result = gateway["outcomes"]["path " + path]
    assert json.loads(result["body"]).get("backend") == "embed", result  # the stand-in answered, not the gateway


def test_the_responses_api_is_routed_by_its_model(gateway):
    result = gateway["outcomes"]["path /v1/responses"]  # the embed model: routed to its backend, which has no route
    assert json.loads(result["body"]).get("backend") == "embed", result
    result = gateway["outcomes"]["responses"]
    assert result["status"] == 200 and json.loads(result["body"])["stand_in"]["backend"] == "chat", result


def test_a_drain_of_a_deployments_only_server_holds_its_requests_for_the_new_one(gateway):
    """embed1 is tiny-embed's only server: its drain put the backend on hold, an embedding sent meanwhile waited at the
    gateway and was answered by embed1 once the undrain brought it UP; the undrain returned what was held, and the
    gateway's log line says how long. chat1 was drained without a hold (its request got the JSON 503)."""
    tasks = gateway["drain_tasks"]
    assert gateway["drain_rc"] == 0, _failures(tasks)
    drained = tasks["gateway : Drain the host at the gateway and wait for its requests in flight"]
    assert drained["embed1"]["results"][0]["hold"]["backend"] == "vllm-embed", drained["embed1"]
    assert drained["chat1"]["results"][0]["hold"] is None, drained["chat1"]
    answer = tasks["Collect the held request's answer"]["chat1"]
    assert answer["status"] == 200 and answer["json"]["stand_in"]["backend"] == "embed", answer
    holds = tasks["Report the holds the undrain ended"]["embed1"]["gateway_holds"]
    assert holds["embed"]["held"] == 1 and 1.5 < holds["embed"]["longest_s"] < 60, holds
    held_lines = [line for line in gateway["log"].splitlines() if 'request_id="held-embedding"' in line]
    assert len(held_lines) == 1 and " 200 " in held_lines[0], held_lines
    assert int(re.search(r"held_ms=(\d+)", held_lines[0]).group(1)) >= 1500, held_lines


def test_a_planned_shutdown_of_a_deployments_only_host_holds_its_requests_until_it_serves_again(gateway):
    """No rollout started this hold: the server's drain status said it drains for a shutdown, so its request waited
    through the power-off and the boot, and was answered by it."""
    status, seconds, answer = gateway["shutdown_and_fault"]["shutdown"]
    assert status == 200 and answer["stand_in"]["backend"] == "embed", (status, answer)
    assert seconds > 4, seconds
    held_lines = [line for line in gateway["log"].splitlines() if 'request_id="held-by-shutdown"' in line]
    assert len(held_lines) == 1 and " 200 " in held_lines[0], held_lines
    assert int(re.search(r"held_ms=(\d+)", held_lines[0]).group(1)) >= 4000, held_lines


def test_a_gpu_fault_of_a_deployments_only_host_is_never_held(gateway):
    status, seconds, answer = gateway["shutdown_and_fault"]["fault"]
    assert status == 503 and answer["error"]["code"] == 503, (status, answer)
    assert seconds < 5, seconds  # one drain-status read of the faulty server, then the 503
    fault_lines = [line for line in gateway["log"].splitlines() if 'request_id="not-held-fault"' in line]
    assert len(fault_lines) == 1 and not re.search(r"held_ms=\d", fault_lines[0]), fault_lines


def test_the_canary_token_pins_a_request_to_its_server_and_says_so(gateway):
    canary, plain = gateway["outcomes"]["canary"], gateway["outcomes"]["plain"]
    assert canary["status"] == 200 and canary["headers"].get("x-onprem-canary-server") == "chat1", canary
    assert plain["status"] == 200 and "x-onprem-canary-server" not in plain["headers"], plain


def test_drain_and_undrain_act_on_each_hosts_deployment_backend(gateway):
    tasks = gateway["drain_tasks"]
    assert gateway["drain_rc"] == 0, _failures(tasks)
    assert tasks["Ask for the chat model while its only host is drained"]["chat1"]["status"] == 503
    # Undrained, each host answered its runner's canary (the pooling stand-in has no completions route).
    failed = tasks["gateway : Fail the host that did not answer its canary through the gateway"]
    assert failed["chat1"].get("skipped") and failed["embed1"].get("skipped"), failed
    rows = [line.split() for line in gateway["state_file"].splitlines() if line and not line.startswith("#")][1:]
    admin_states = sorted((row[1], row[3], row[6]) for row in rows)  # backend, server, srv_admin_state
    assert admin_states == [("onprem-model-finder", "finder", "0"), ("vllm-chat", "chat1", "0"),
                            ("vllm-embed", "embed1", "0")]
    assert gateway["after_undrain"]["backend"] == "chat"


UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-4[0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _request_ids(result):
    """The id the client got back, and the one the server received (None where the gateway answered itself)."""
    headers = {name.lower(): value for name, value in result["headers"].items()}
    try:
        received = json.loads(result["body"])["stand_in"]["request_id"]
    except (ValueError, KeyError):
        received = None
    return headers.get("x-request-id"), received


def test_every_request_gets_an_id_the_client_and_the_server_see(gateway):
    returned, received = _request_ids(gateway["outcomes"]["plain"])
    assert UUID.match(returned) and received == returned
    returned, received = _request_ids(gateway["outcomes"]["own_request_id"])
    assert returned == received == "ide-7f3a:0001"  # the client's own, kept
    returned, received = _request_ids(gateway["outcomes"]["bad_request_id"])
    assert UUID.match(returned) and received == returned  # not a plain token: replaced
    returned, received = _request_ids(gateway["outcomes"]["no_key"])
    assert UUID.match(returned) and received is None  # the gateway's own answer carries one too


def test_the_log_names_the_client_and_the_request_never_a_key(gateway):
    lines = [line for line in gateway["log"].splitlines() if 'request_id="ide-7f3a:0001"' in line]
    assert len(lines) == 1 and 'client="full"' in lines[0] and " 200 " in lines[0], gateway["log"][-3000:]
    assert 'client="limited"' in gateway["log"]
    for key in (FULL_KEY, LIMITED_KEY, SERVER_KEY):
        assert key not in gateway["log"]


def _statuses(results):
    return sorted(result["status"] for result in results)


def test_a_client_over_its_concurrency_gets_429_and_the_others_are_served(gateway):
    outcomes = gateway["outcomes"]
    burst = outcomes["noisy_concurrent"]
    assert _statuses(burst) == [200, 200, 429, 429], burst
    for refused in (result for result in burst if result["status"] == 429):
        assert refused["headers"].get("retry-after") == "1"
        error = json.loads(refused["body"])["error"]
        assert error["code"] == "rate_limit_exceeded" and "at most 2" in error["message"]
    assert outcomes["quiet_during_burst"]["status"] == 200  # another client, meanwhile


def test_a_client_over_its_rate_gets_429_and_the_others_are_served(gateway):
    outcomes = gateway["outcomes"]
    statuses = [result["status"] for result in outcomes["noisy_rate"]]
    # Ten requests back to back: the first three pass; the rest are refused while they come within a second of them
    # (all of them on an idle machine; "at least one" keeps a slow machine from failing the test).
    assert statuses[:3] == [200] * 3 and 429 in statuses[3:] and set(statuses) == {200, 429}, statuses
    for refused in (result for result in outcomes["noisy_rate"] if result["status"] == 429):
        assert refused["headers"].get("retry-after") == "1" and "3 requests per second" in refused["body"]
    assert outcomes["quiet_after_rate"]["status"] == 200


def test_a_client_over_its_token_budget_gets_insufficient_quota_and_the_server_learns_only_its_name(gateway):
    budget = gateway["budget"]
    # The client's own X-Onprem-Client is replaced by the name its key maps to.
    assert budget["before"] == {"status": 200, "client": "full"} == budget["after"], budget
    assert budget["refused"]["status"] == 429, budget
    assert budget["refused"]["body"]["error"]["type"] == "insufficient_quota" == budget["refused"]["body"]["error"]["code"]


def test_a_client_over_its_body_size_gets_413(gateway):
    outcomes = gateway["outcomes"]
    assert outcomes["noisy_big_body"]["status"] == 413 and "4096 bytes" in outcomes["noisy_big_body"]["body"]
    assert outcomes["noisy_small_body"]["status"] == 200


@pytest.mark.parametrize("config", ["routing", "other branches"])
def test_each_rendered_configuration_passes_haproxys_check_without_a_warning(gateway, config):
    check = gateway["config_checks"][config]
    assert check.returncode == 0 and "[WARNING]" not in check.stderr, check.stdout + check.stderr


def test_the_gateways_files_hold_no_client_key(gateway):
    """The clients map holds each key's SHA-256; every request above was authorized through it."""
    for name in ("clients.map", "haproxy.cfg"):
        text = (gateway["config"] / name).read_text()
        for key in (FULL_KEY, LIMITED_KEY, NOISY_KEY, SIZED_KEY, ROOMY_KEY):
            assert key not in text
    assert hashlib.sha256(FULL_KEY.encode()).hexdigest().upper() in (gateway["config"] / "clients.map").read_text()


@pytest.mark.parametrize("client, case", [("sized", "small_chunked"), ("sized", "small_http10"),
                                          ("roomy", "quarter_buffer_chunked")])
def test_a_body_within_the_limit_is_served_chunked_or_over_http_1_0(gateway, client, case):
    result = gateway["outcomes"][client][case]
    assert result["status"] == 200 and json.loads(result["body"])["stand_in"]["backend"] == "chat", result
    assert "%s-%s" % (client, case.replace("_", "-")) in gateway["outcomes"]["seen"]


@pytest.mark.parametrize("client, case, message", [
    ("sized", "big_length", "4096 bytes"), ("sized", "big_chunked", "4096 bytes"),
    ("sized", "big_http10", "4096 bytes"), ("sized", "big_http10_chunked", "4096 bytes"),
    ("roomy", "huge_length", "%d bytes" % (2 * BUFFER)),
    # Beyond what the gateway can measure without Content-Length (within the limit or not): the message says what to do.
    ("roomy", "buffer_chunked", "send a larger body with Content-Length"),
    ("roomy", "huge_chunked", "send a larger body with Content-Length"),
    # One chunk announces its size in its first line: where that line came with the headers, the key's own limit is
    # known to be passed before the body is awaited (req.body_size counts the announced rest); else it is measured.
    ("roomy", "one_huge_chunk", ("%d bytes" % (2 * BUFFER), "send a larger body with Content-Length"))])
def test_a_body_over_the_limit_gets_413_however_it_is_sent_and_never_reaches_a_server(gateway, client, case, message):
    result = gateway["outcomes"][client][case]
    assert result["status"] == 413, result
    error = json.loads(result["body"])["error"]
    messages = message if isinstance(message, tuple) else (message,)
    assert error["type"] == "RequestTooLargeError" and error["code"] == 413, error
    assert any(expected in error["message"] for expected in messages), error
    assert "%s-%s" % (client, case.replace("_", "-")) not in gateway["outcomes"]["seen"]


def test_a_client_without_a_body_limit_may_send_a_long_chunked_body(gateway):
    result = gateway["outcomes"]["full_huge_chunked"]
    assert result["status"] == 200 and json.loads(result["body"])["stand_in"]["body_length"] == 3 * BUFFER, result


@pytest.mark.parametrize("case", ["no_key", "wrong_key"])
def test_a_request_without_a_valid_key_gets_401_before_its_body_is_awaited(gateway, case):
    result = gateway["outcomes"]["slow_body"][case]  # announced a megabyte, sent one byte
    assert result["status"] == 401 and result["seconds"] < 2, result


@pytest.mark.parametrize("case", ["no_key_held", "no_key_chunked_held"])
def test_a_refused_request_whose_body_never_comes_loses_its_connection_after_the_client_timeout(gateway, case):
    # HAProxy 3.0 reads the rest of a refused request's body before it closes: the role's timeout client (10 s)
    # bounds that, where it was 600 s.
    result = gateway["outcomes"]["slow_body"][case]
    assert result["status"] == 401 and 9 < result["seconds"] < 13, result


def test_a_keyed_client_whose_body_does_not_come_gets_408_after_the_body_timeout(gateway):
    result = gateway["outcomes"]["slow_body"]["keyed"]
    assert result["status"] == 408 and 2.5 < result["seconds"] < 6, result
    assert json.loads(result["body"])["error"]["code"] == 408  # OpenAI's error shape, as every answer of the gateway


def test_the_gateways_own_errors_are_openai_error_objects(gateway):
    # HAProxy 3.4's HTTP parser answers a malformed request from the errorfile; the lab's image (3.0) still sends its
    # own page. Each file is a well-formed answer, and HAProxy answers a drained backend's request from its own.
    assert gateway["outcomes"]["malformed"]["status"] == 400
    for status in (400, 408, 502, 503, 504):
        head, body = (gateway["config"] / ("error-%d.http" % status)).read_bytes().decode().split("\r\n\r\n")
        assert "Content-Length: %d" % len(body) in head and json.loads(body)["error"]["code"] == status
        assert ("Retry-After: 5" in head) == (status in (503, 504))
    drained = gateway["drain_tasks"]["Ask for the chat model while its only host is drained"]["chat1"]
    assert drained["json"]["error"]["type"] == "ServiceUnavailableError" and drained["retry_after"] == "5", drained
    # It waited out most of the 5 s hold put on by hand first: a hold ends in the same JSON 503, never in a longer wait.
    held = gateway["drain_tasks"]["Put chat on a hold of 5 s by hand (it has no server UP, so its request waits, then gets the 503)"]
    assert '"backend":"vllm-chat"' in held["chat1"]["stdout"], held
    assert 2 <= drained["elapsed"] < 10, drained


def test_one_address_holds_a_bounded_number_of_connections_each_for_seconds(gateway):
    """One address opens 5,000 connections, each a request head that never ends, and no key: the gateway holds at
    most PER_SOURCE of them at a time, each for gateway_timeout_http_request, and refuses the rest at accept; a keyed
    client elsewhere is answered at once meanwhile. (Where opening them all takes longer than the timeout, a slot the
    timeout freed takes a later connection.)"""
    flooded = gateway["flooded"]
    assert len(flooded) == FLOOD_CONNECTIONS, len(flooded)  # every connection ended
    refused = [one for one in flooded if one["status"] is None]
    held = [one for one in flooded if one["status"] == "408"]
    assert len(held) + len(refused) == FLOOD_CONNECTIONS, flooded
    # Held at once: the most whose span covers one's start (the flood notes a close before its next connection, so a
    # slot freed between the two may count one more).
    at_once = max(sum(1 for other in held if other["started"] <= one["started"] < other["seconds"]) for one in held)
    assert PER_SOURCE <= at_once <= PER_SOURCE + 1 and len(refused) > FLOOD_CONNECTIONS / 2, (at_once, len(held))
    assert max(one["seconds"] - one["started"] for one in held) < 5 + 2, held  # gateway_timeout_http_request, 5 s
    during = gateway["during_flood"]
    assert during["status"] == 200 and during["seconds"] < 2, during  # a keyed client elsewhere meanwhile

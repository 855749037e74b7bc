"""A webhook receiver for geogate's tests: a real HTTP server on loopback
that checks each request's signature as a user's receiver would, written
apart from geogate's own code, and answers as the test tells it.

    webhook_receiver.py PORT SECRET LOG CONTROL

Every request is appended to LOG as one JSON line: the status answered,
whether the signature verified (HMAC-SHA256 of "<timestamp>.<body>" with
SECRET, compared in constant time, the timestamp within 300 s), the ids and
seqs of the transitions in the body, and the time. CONTROL is a JSON file
read at each request:
    {"status": 200, "delay_ms": 0, "fail_first": 0, "fail_status": 500,
     "max_batch": 0}
the first `fail_first` requests get `fail_status`, the rest `status`, each
after `delay_ms`; a body of more than `max_batch` transitions (when set)
gets 413. A request whose signature does not verify gets 401.
"""

import hashlib
import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, SECRET, LOG, CONTROL = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3], sys.argv[4]
TOLERANCE_S = 300
lock = threading.Lock()
seen = {"requests": 0}


def control():
    try:
        with open(CONTROL) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def verified(headers, body):
    timestamp = headers.get("X-Geogate-Timestamp", "")
    signature = headers.get("X-Geogate-Signature", "")
    if not timestamp.isdigit() or not signature.startswith("sha256="):
        return False
    expected = hmac.new(SECRET, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(timestamp)) <= TOLERANCE_S
    return hmac.compare_digest(expected, signature[len("sha256="):]) and fresh


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        c = control()
        with lock:
            seen["requests"] += 1
            n = seen["requests"]
        time.sleep(c.get("delay_ms", 0) / 1000)
        ok = verified(self.headers, body)
        try:
            transitions = json.loads(body)
        except ValueError:
            transitions = []
        if not ok:
            status = 401
        elif c.get("max_batch") and len(transitions) > c["max_batch"]:
            status = 413
        elif n <= c.get("fail_first", 0):
            status = c.get("fail_status", 500)
        else:
            status = c.get("status", 200)
        record = {
            "at": time.time(),
            "status": status,
            "signature_ok": ok,
            "ids": [t.get("id") for t in transitions],
            "seqs": [t.get("seq") for t in transitions],
            "vehicles": [t.get("vehicle") for t in transitions],
        }
        with lock, open(LOG, "a") as log:
            log.write(json.dumps(record) + "\n")
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()

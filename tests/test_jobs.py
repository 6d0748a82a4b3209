#!/usr/bin/env python3
"""
test_jobs.py - training jobs over HTTP (`spanserve serve --jobs-listen`), as
docs/API.md "Training jobs" promises them.

Starts the real server with the jobs listener and an admin key, uploads a
small text, trains tiny models of both families on the CPU (a few hundred
steps, well under a second each), follows their events as JSON and as
server-sent events, sees them succeed, generates with the deployed model on
the main listener, and checks the webhook's call on a loopback receiver
(whose first answer is a 500, so the retry is seen too). Then: cancelling
(queued and running; the checkpoint kept; resumed), a job whose process is
killed (failed, then resumed from its checkpoint), a restart of the server
mid-job (the running job found again and finished, a queued one kept, one
that died meanwhile marked failed), a duplicate submission with the same id,
every invalid input (with its status and the one error shape), paths that
try to leave the data directory, authentication, `spanctl jobs`, and every
answer against server/openapi_jobs.json. The server runs with --fetch-allow
127.0.0.1 (its texts and webhooks come from loopback servers of this test);
a text's URL and a webhook at `localhost`, which it does not allow, are
refused: nothing fetched, nothing delivered.

Names on the command line run only those tests (`files` first when they
need a text: python3 tests/test_jobs.py files ssrf ssrf_final); the
retention and restart servers run only without names or when named.

Prints `FAIL test/check: reason` per failed check and ends with
`test_jobs.py: N passed, N failed`; exit status 1 on any failure. Only
loopback addresses are contacted.
"""
import http.server
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api import call, sse_events, free_port, has_error_shape, ROOT, BIN, A_PATH, TEXT_PATH, FETCH_FAILED, INSTALL  # noqa: E402

CTL = os.path.join(os.path.dirname(BIN), "spanctl")
ADMIN = "admin-key-1"
ENV_ADMIN = "admin-key-from-env"
APIKEY = "api-key-1"

try:
    import jsonschema
except ImportError:   # the schema checks say SKIP; never installed at run time
    jsonschema = None

PASS = FAIL = 0
CURRENT = "setup"
_lock = threading.Lock()


def check(label, cond, reason=""):
    global PASS, FAIL
    with _lock:
        if cond:
            PASS += 1
        else:
            FAIL += 1
            print(f"FAIL {CURRENT}/{label}: {reason}", flush=True)
    return bool(cond)


def wait_for(fn, timeout=30, every=0.05):
    """fn() until it is truthy (returned) or the time is up (None)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    return None


# ---------------------------------------------------------------- the document

DOC = json.load(open(os.path.join(ROOT, "server", "openapi_jobs.json")))


_schema_skip_said = False


def conforms(label, r, schema_name):
    """The body of r validates against components/schemas/NAME of the jobs
    document (without jsonschema: one SKIP line for all of them)."""
    global _schema_skip_said
    if jsonschema is None:
        if not _schema_skip_said:
            print(f"SKIP test_jobs.py schemas: no jsonschema package ({INSTALL})")
            _schema_skip_said = True
        return True
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": DOC["components"]}
    try:
        jsonschema.Draft4Validator(schema).validate(r.json)
        return check(label + " (schema)", True)
    except jsonschema.ValidationError as e:
        return check(label + " (schema)", False, f"{schema_name}: {e.message} at {list(e.absolute_path)}")


def expect_error(label, r, status, msg_re=None):
    ok = r.status == status and has_error_shape(r, status)
    reason = f"expected {status} in the error shape, got {r}"
    if ok and msg_re and not re.search(msg_re, r.json["error"]["message"], re.I):
        ok, reason = False, f"message {r.json['error']['message']!r} does not match /{msg_re}/"
    check(label, ok, reason)
    if ok:
        conforms(label, r, "Error")


# ---------------------------------------------------------------- the webhook receiver


class Receiver:
    """An HTTP server on loopback that keeps every POST; the first `fail_first` get a 500."""

    def __init__(self, fail_first=1):
        self.calls, self.fail_first, self.seen = [], fail_first, 0
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n)
                with _lock:
                    rec.seen += 1
                    fail = rec.seen <= rec.fail_first
                    if not fail:
                        rec.calls.append((self.path, self.headers.get("Content-Type"), body))
                self.send_response(500 if fail else 204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def bodies(self, path):
        with _lock:
            return [json.loads(b) for p, _, b in self.calls if p == path]


class HttpsFiles:
    """An https server on loopback with a certificate of its own (openssl,
    for 127.0.0.1): the server under test trusts it through --ca-file."""

    def __init__(self, tmp, files):
        self.cert, key = os.path.join(tmp, "ca.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", self.cert],
                       check=True, capture_output=True)

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                try:
                    self.wfile.write(body or b"")
                except (ConnectionError, OSError):   # the server under test hung up past --max-upload
                    pass

            def log_message(self, *a):
                pass

        import ssl
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


# ---------------------------------------------------------------- the server


class Server:
    def __init__(self, tmp, max_jobs=1, model_dir=True, extra=()):
        self.tmp = tmp
        self.model_dir, self.extra = model_dir, list(extra)
        self.state, self.models, self.data = (os.path.join(tmp, d) for d in ("state", "models", "data"))
        for d in (self.state, self.models, self.data):
            os.makedirs(d, exist_ok=True)
        self.max_jobs = max_jobs
        self.proc = None
        self.logs = []
        self.ca_file = None

    def start(self, same_ports=False):
        for attempt in range(3):
            if not (same_ports and attempt == 0):
                self.port, self.jport = free_port(), free_port()
            log = os.path.join(self.tmp, f"server.{len(self.logs)}.log")
            self.logs.append(log)
            env = dict(os.environ)
            env.pop("SPANSERVE_API_KEY", None)
            env["SPANSERVE_ADMIN_KEY"] = ENV_ADMIN   # a second admin key, from the environment
            self.proc = subprocess.Popen(
                [BIN, "serve", "--listen", f"127.0.0.1:{self.port}", "--jobs-listen", f"127.0.0.1:{self.jport}",
                 "--admin-key", ADMIN, "--api-key", APIKEY, "--state-dir", self.state, "--data-dir", self.data,
                 "--max-jobs", str(self.max_jobs), "--max-upload", "300000", "--cancel-grace", "2",
                 "--fetch-allow", "127.0.0.1", "--model", f"aspan={A_PATH}"] + (["--model-dir", self.models] if self.model_dir else [])
                + (["--ca-file", self.ca_file] if self.ca_file else []) + self.extra,
                stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
            if wait_for(lambda: self.proc.poll() is not None or call(self.jport, "GET", "/healthz", timeout=2).status == 200
                        and call(self.port, "GET", "/readyz", timeout=2).status == 200, 60):
                if self.proc.poll() is None:
                    return None
            if "address already in use" not in self.tail().lower():
                return f"did not start: {self.tail()}"
        return "could not bind"

    def tail(self, n=1500):
        try:
            return open(self.logs[-1], "rb").read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def j(self, method, path, body=None, key=ADMIN, **kw):
        return call(self.jport, method, path, body, key=key, **kw)

    def api(self, method, path, body=None, **kw):
        return call(self.port, method, path, body, key=APIKEY, **kw)

    def job(self, jid):
        return self.j("GET", f"/v1/jobs/{jid}").json or {}

    def wait_status(self, jid, statuses, timeout=60):
        return wait_for(lambda: self.job(jid).get("status") in statuses and self.job(jid), timeout)

    def sanitizer_reports(self):
        out = []
        for log in self.logs:
            t = open(log, "rb").read().decode("utf-8", "replace")
            out += re.findall(r"ERROR: \w+Sanitizer.*|.*runtime error.*", t)
        return out


TINY_ASPAN = {"hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "nb_layers": 2, "attn_span": 32,
              "block_size": 16, "batch_size": 4, "steps": 200, "log_every": 20, "eval_every": 100,
              "checkpoint_every": 100, "eval_tokens": 500}
TINY_PAR = {"n_blocks": 4, "n_head": 2, "d_model": 16, "d_head": 8, "d_inner": 32, "mem_len": 16, "tgt_len": 16,
            "batch_size": 4, "steps": 200, "search_steps": 100, "log_every": 20, "eval_every": 100,
            "checkpoint_every": 100, "eval_tokens": 500}


def long_config(steps=1000000):
    """A tiny model that trains for minutes unless stopped: checkpoints every 100 steps."""
    return dict(TINY_ASPAN, steps=steps, log_every=25, eval_every=0, checkpoint_every=100)


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:   # a zombie is not alive
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def upload(S, text, name=None, **kw):
    path = "/v1/files" + (f"?name={name}" if name else "")
    return S.j("POST", path, text if isinstance(text, bytes) else text.encode(), ctype="text/plain", **kw)


def log_events(S, jid):
    return S.j("GET", f"/v1/jobs/{jid}/events?limit=10000").json["events"]


# ---------------------------------------------------------------- tests

TEXT = open(TEXT_PATH, encoding="utf-8").read()[:20000]


def t_auth(S):
    for method, path in [("GET", "/v1/jobs"), ("GET", "/v1/files"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/x"),
                         ("POST", "/v1/jobs/x/cancel"), ("GET", "/openapi.json")]:
        expect_error(f"{method} {path} without a key", S.j(method, path, {} if method == "POST" else None, key=None), 401,
                     "admin key")
        expect_error(f"{method} {path} with the API key", S.j(method, path, {} if method == "POST" else None, key=APIKEY),
                     401)
    r = upload(S, TEXT, key=None)
    expect_error("upload without a key: 401 before the body is stored", r, 401)
    check("no file stored by an unauthorised upload", S.j("GET", "/v1/files").json["files"] == [], f"{S.j('GET', '/v1/files')}")
    check("www-authenticate", S.j("GET", "/v1/jobs", key="wrong").headers.get("www-authenticate") == "Bearer")
    r = S.j("GET", "/v1/jobs", key=ENV_ADMIN)
    check("SPANSERVE_ADMIN_KEY is an admin key", r.status == 200 and r.json == {"jobs": []}, f"{r}")
    r = S.j("GET", "/healthz", key=None)
    check("healthz is open", r.status == 200 and r.json == {"status": "ok"}, f"{r}")
    r = S.j("GET", "/openapi.json")
    check("openapi.json is the jobs document", r.status == 200 and r.json == DOC, f"{r.status}")
    expect_error("the admin key is not an API key", call(S.port, "GET", "/v1/models", key=ADMIN), 401)
    expect_error("no jobs on the main listener", S.api("GET", "/v1/jobs"), 404)
    expect_error("unknown route", S.j("GET", "/v1/nothing"), 404)
    r = S.j("PUT", "/v1/jobs")
    expect_error("wrong method", r, 405)
    check("allow header", r.headers.get("allow") == "POST, GET, HEAD", f"{r.headers}")


FILES = {}


def t_files(S):
    r = upload(S, TEXT, name="shakespeare.txt")
    check("upload 201", r.status == 201, f"{r}")
    f = r.json or {}
    conforms("upload", r, "File")
    check("file fields", f.get("name") == "shakespeare.txt" and f.get("bytes") == len(TEXT.encode())
          and f.get("characters") == len(TEXT) and f.get("distinct_characters") == len(set(TEXT))
          and re.fullmatch(r"file-[0-9a-f]{16}", f.get("id", "")), f"{f}")
    check("stored under the data directory", open(os.path.join(S.data, "files", f["id"])).read() == TEXT)
    FILES["text"] = f["id"]
    r = upload(S, "héllo wörld €, ünïcode " * 40)
    check("unicode upload", r.status == 201 and r.json["characters"] == len("héllo wörld €, ünïcode ") * 40, f"{r}")
    FILES["unicode"] = r.json["id"]
    r = S.j("GET", "/v1/files")
    conforms("list", r, "FileList")
    ids = [x["id"] for x in r.json["files"]]
    check("list", set(ids) == {FILES["text"], FILES["unicode"]}, f"{ids}")
    r = S.j("GET", f"/v1/files/{FILES['text']}")
    check("get", r.status == 200 and r.json == f, f"{r}")
    conforms("get", r, "File")
    expect_error("not UTF-8", upload(S, b"abc\xff\xfe def"), 400, "UTF-8")
    expect_error("empty", upload(S, b""), 400, "empty")
    expect_error("bad name", upload(S, "abc", name="../x"), 400, "name")
    expect_error("over --max-upload (declared)", upload(S, b"a" * 300001), 413, "max-upload")
    # a chunked upload declares no length: stopped while it is read
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", S.jport, timeout=30)
    c.putrequest("POST", "/v1/files")
    c.putheader("Authorization", f"Bearer {ADMIN}")
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    for _ in range(40):
        chunk = b"b" * 10000
        c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    c.send(b"0\r\n\r\n")
    resp = c.getresponse()
    body = resp.read()
    check("over --max-upload (chunked): 413", resp.status == 413 and b"max-upload" in body, f"{resp.status} {body[:200]}")
    left = [n for n in os.listdir(os.path.join(S.data, "files")) if n.startswith(".upload")]
    check("no partial upload left", left == [], f"{left}")
    expect_error("delete unknown", S.j("DELETE", "/v1/files/file-0000"), 404)
    expect_error("get unknown", S.j("GET", "/v1/files/nope"), 404)
    r = S.j("DELETE", f"/v1/files/{FILES['unicode']}")
    check("delete", r.status == 200 and r.json == {"deleted": FILES["unicode"]}, f"{r}")
    check("deleted from disk", not os.path.exists(os.path.join(S.data, "files", FILES["unicode"])))


def follow_sse(S, jid, timeout=60, after=None):
    q = "?stream=true" + (f"&after={after}" if after is not None else "")
    r = S.j("GET", f"/v1/jobs/{jid}/events{q}", timeout=timeout)
    return r, sse_events(r.body)


def t_train_aspan(S, hook):
    body = {"id": "aspan-1", "family": "adaptive-span", "file": FILES["text"], "config": TINY_ASPAN, "name": "tiny-aspan",
            "deploy": True, "webhook": hook.url + "/hook/aspan"}
    r = S.j("POST", "/v1/jobs", body)
    check("submit 201", r.status == 201 and r.json["id"] == "aspan-1" and r.json["status"] in ("queued", "running"), f"{r}")
    conforms("submit", r, "Job")
    # the SSE stream follows the job from its start to its end
    r, evs = follow_sse(S, "aspan-1")
    check("sse content type", r.headers.get("content-type", "").startswith("text/event-stream"), f"{r.headers}")
    names = [e for e, _ in evs]
    check("sse starts and ends with the job", names[:1] == ["job"] and names[-1:] == ["job"], f"{names}")
    final = json.loads(evs[-1][1]) if evs else {}
    check("sse final job succeeded", final.get("status") == "succeeded", f"{final}")
    lines = [json.loads(d) for e, d in evs[1:-1]]
    check("sse lines named by event", all(e == l.get("event") for (e, _), l in zip(evs[1:-1], lines)), f"{names}")
    check("sse has the trainer's lines", names[1] == "start" and "train" in names and "checkpoint" in names
          and names[-2] == "done", f"{names}")
    steps = [l["step"] for l in lines if l["event"] == "train"]
    check("train steps", steps == list(range(20, 201, 20)), f"{steps}")
    # JSON events: the same lines
    r = S.j("GET", "/v1/jobs/aspan-1/events")
    conforms("events", r, "Events")
    check("json events = sse lines", r.status == 200 and r.json["events"] == lines and r.json["next"] == len(lines)
          and r.json["more"] is False, f"{r}")
    r = S.j("GET", "/v1/jobs/aspan-1/events?after=3&limit=2")
    check("events paging", r.json["events"] == lines[3:5] and r.json["next"] == 5 and r.json["more"] is True, f"{r}")
    r, evs2 = follow_sse(S, "aspan-1", after=len(lines) - 1)
    check("sse after", [e for e, _ in evs2] == ["job", "done", "job"], f"{[e for e, _ in evs2]}")
    expect_error("after not a number", S.j("GET", "/v1/jobs/aspan-1/events?after=x"), 400, "after")
    expect_error("limit out of range", S.j("GET", "/v1/jobs/aspan-1/events?limit=0"), 400, "limit")
    expect_error("stream not a bool", S.j("GET", "/v1/jobs/aspan-1/events?stream=maybe"), 400, "stream")
    r = S.j("GET", "/v1/jobs/aspan-1/events", headers={"Accept": "text/event-stream"})
    check("Accept: text/event-stream streams", r.headers.get("content-type", "").startswith("text/event-stream"), f"{r.headers}")
    # each line's event carries its id (lines sent so far); a reconnecting EventSource's Last-Event-ID resumes after it
    blocks = [b for b in r.body.decode().split("\n\n") if b.strip()]
    ids = [b.split("\n")[0][4:] for b in blocks if b.startswith("id: ")]
    check("sse ids: 1, 2, ... on the line events, none on the job events", ids == [str(i) for i in range(1, len(lines) + 1)]
          and blocks[0].startswith("event: job") and blocks[-1].startswith("event: job"), f"{ids[:5]} {blocks[:1]}")
    r = S.j("GET", "/v1/jobs/aspan-1/events?stream=true", headers={"Last-Event-ID": str(len(lines) - 2)})
    evs3 = sse_events(r.body)
    check("Last-Event-ID: the lines after it", [json.loads(d) for e, d in evs3[1:-1]] == lines[-2:]
          and [e for e, _ in evs3][:1] == ["job"], f"{[e for e, _ in evs3]}")
    r = S.j("GET", "/v1/jobs/aspan-1/events?stream=true&after=1", headers={"Last-Event-ID": str(len(lines) - 2)})
    check("after= wins over Last-Event-ID", len(sse_events(r.body)) == len(lines) - 1 + 2, f"{len(sse_events(r.body))}")
    expect_error("Last-Event-ID not a line count", S.j("GET", "/v1/jobs/aspan-1/events?stream=true",
                                                       headers={"Last-Event-ID": "abc"}), 400, "Last-Event-ID")
    # the job object
    r = S.j("GET", "/v1/jobs/aspan-1")
    conforms("get", r, "Job")
    j = r.json
    done = lines[-1]
    last_train = [l for l in lines if l["event"] == "train"][-1]
    check("job numbers", j["status"] == "succeeded" and j["step"] == 200 and j["steps"] == 200
          and abs(j["val_bpc"] - done["val_bpc"]) < 1e-6 and abs(j["loss"] - last_train["loss"]) < 1e-6
          and j["tokens_per_s"] > 0 and j["elapsed_s"] > 0 and "eta_s" not in j and j["exit_code"] == 0
          and j["runs"] == 1 and j["events"] == len(lines), f"{j}")
    check("job spans", [s["layer"] for s in j.get("spans", [])] == [0, 1]
          and all(s["max"] >= s["mean"] >= 0 for s in j["spans"]), f"{j.get('spans')}")
    ck = j.get("checkpoint", {})
    check("checkpoint", ck.get("step") == 200 and os.path.exists(ck.get("path", "")), f"{ck}")
    m = j.get("model", {})
    check("model", m.get("name") == "tiny-aspan" and m.get("deployed") is True
          and m.get("path") == os.path.join(S.models, "tiny-aspan.safetensors") and os.path.exists(m["path"]), f"{m}")
    # deployed: the main listener serves it
    r = S.api("GET", "/v1/models/tiny-aspan")
    check("deployed model", r.status == 200 and r.json["family"] == "adaptive-span"
          and r.json["config"]["hidden_size"] == 16, f"{r}")
    r = S.api("POST", "/v1/generate", {"model": "tiny-aspan", "prompt": "ROMEO:", "max_tokens": 20, "seed": 1})
    check("generate with it", r.status == 200 and r.json["usage"]["completion_tokens"] == 20 and len(r.json["text"]) > 0, f"{r}")
    r = S.api("POST", "/v1/score", {"model": "tiny-aspan", "text": TEXT[-2000:]})
    check("score with it: about the job's val_bpc", r.status == 200 and abs(r.json["bpc"] - j["val_bpc"]) < 0.5, f"{r} {j['val_bpc']}")
    # the webhook: the first attempt answered 500, the second delivered
    got = wait_for(lambda: hook.bodies("/hook/aspan"), 15)
    check("webhook called", got and len(got) == 1, f"{got}")
    if got:
        w = got[0]
        check("webhook body: the final job", w["id"] == "aspan-1" and w["status"] == "succeeded"
              and w["model"]["deployed"] is True and w["val_bpc"] == j["val_bpc"], f"{w}")
        check("webhook content type", hook.calls[0][1] == "application/json", f"{hook.calls[0][1]}")
    j = wait_for(lambda: S.job("aspan-1").get("webhook", {}).get("state") == "delivered" and S.job("aspan-1"), 10) or {}
    check("webhook state: delivered on the 2nd attempt", j.get("webhook", {}).get("attempts") == 2, f"{j.get('webhook')}")
    # the picture
    r = S.j("GET", "/v1/jobs/aspan-1/spans.svg")
    check("svg", r.status == 200 and r.headers.get("content-type") == "image/svg+xml", f"{r.status} {r.headers}")
    try:
        root = ET.fromstring(r.body)
        pl = [e for e in root.iter() if e.tag.endswith("polyline")]
        check("svg: a mean and a max line per layer, a point per progress line", len(pl) == 4
              and all(len(p.get("points").split()) == 10 for p in pl), f"{len(pl)}")
    except ET.ParseError as e:
        check("svg parses", False, str(e))


def t_duplicate(S):
    body = {"id": "aspan-1", "family": "adaptive-span", "file": FILES["text"], "config": TINY_ASPAN, "name": "tiny-aspan",
            "deploy": True, "webhook": S.hook_url + "/hook/aspan"}
    n = len(S.j("GET", "/v1/jobs").json["jobs"])
    r = S.j("POST", "/v1/jobs", body)
    check("the same submission again: 200, the same job", r.status == 200 and r.json["id"] == "aspan-1"
          and r.json["status"] == "succeeded" and r.json["runs"] == 1, f"{r}")
    check("no second job", len(S.j("GET", "/v1/jobs").json["jobs"]) == n)
    expect_error("the same id, another request", S.j("POST", "/v1/jobs", dict(body, config=dict(TINY_ASPAN, steps=100))),
                 409, "another request")


def t_train_par(S):
    os.makedirs(os.path.join(S.data, "texts"), exist_ok=True)
    with open(os.path.join(S.data, "texts", "small.txt"), "w") as f:
        f.write(TEXT)
    r = S.j("POST", "/v1/jobs", {"family": "par-transformer-xl", "path": "texts/small.txt", "config": TINY_PAR,
                                  "name": "tiny-par"})
    check("par submit by path", r.status == 201 and re.fullmatch(r"job-[0-9a-f]{16}", r.json["id"]), f"{r}")
    jid = r.json["id"]
    j = S.wait_status(jid, ("succeeded", "failed"), 60) or {}
    check("par succeeded", j.get("status") == "succeeded" and j.get("data") == {"path": "texts/small.txt"}, f"{j}")
    check("par arch weights", len(j.get("arch_weights", [])) == 4 and all(abs(sum(w) - 1) < 1e-6 for w in j["arch_weights"])
          and len(j.get("arch", [])) == 4 and j.get("searching") is False, f"{j}")
    check("par model not deployed", j.get("model", {}).get("deployed") is False
          and S.api("GET", "/v1/models/tiny-par").status == 404, f"{j.get('model')}")
    r = S.api("POST", "/v1/models", {"name": "tiny-par", "path": "tiny-par.safetensors"})
    check("its file loads from the model directory", r.status == 201 and r.json["family"] == "par-transformer-xl", f"{r}")
    r = S.j("GET", f"/v1/jobs/{jid}/spans.svg")
    root = ET.fromstring(r.body)
    pl = [e for e in root.iter() if e.tag.endswith("polyline")]
    check("par svg: 3 lines per block", len(pl) == 12, f"{len(pl)}")


def t_invalid(S):
    base = {"family": "adaptive-span", "file": FILES["text"], "config": TINY_ASPAN}
    n_before = len(S.j("GET", "/v1/jobs").json["jobs"])
    cases = [
        ("not JSON", "{", 400, "JSON"),
        ("not an object", [1], 400, "object"),
        ("no family", {k: v for k, v in base.items() if k != "family"}, 400, "family is required"),
        ("bad family", dict(base, family="gpt"), 400, "family"),
        ("unknown field", dict(base, steps=5), 400, "unknown field 'steps'"),
        ("config not an object", dict(base, config=[1]), 400, "config must be"),
        ("unknown config key", dict(base, config=dict(TINY_ASPAN, hiden_size=3)), 400, "unknown config key 'hiden_size'"),
        ("key of the other family", dict(base, config=dict(TINY_ASPAN, n_blocks=3)), 400, "belongs to par"),
        ("value out of range", dict(base, config=dict(TINY_ASPAN, nb_heads=0)), 400, "nb_heads"),
        ("wrong type", dict(base, config=dict(TINY_ASPAN, lr="fast")), 400, "'lr'"),
        ("sizes that do not divide", dict(base, config=dict(TINY_ASPAN, nb_heads=3)), 400, "multiple of 'nb_heads'"),
        ("data in config", dict(base, config=dict(TINY_ASPAN, data="/etc/passwd")), 400, "set by the server"),
        ("out in config", dict(base, config=dict(TINY_ASPAN, out="/tmp/x")), 400, "set by the server"),
        ("log in config", dict(base, config=dict(TINY_ASPAN, log="/tmp/x")), 400, "set by the server"),
        ("no text", {"family": "adaptive-span", "config": TINY_ASPAN}, 400, "one of file"),
        ("two texts", dict(base, path="texts/small.txt"), 400, "one of file"),
        ("file not a string", dict(base, file=7), 400, "file must be a string"),
        ("unknown file", dict(base, file="file-0123"), 404, "no file"),
        ("path with ..", {**base, "file": None, "path": "texts/../../state/jobs/aspan-1/job.json"}, 400, r"\.\."),
        ("absolute path", {**base, "file": None, "path": "/etc/passwd"}, 400, "relative"),
        ("path through a link outside", {**base, "file": None, "path": "evil"}, 400, "outside the data directory"),
        ("path through a linked directory", {**base, "file": None, "path": "linkdir/passwd"}, 400, "outside"),
        ("path not a file", {**base, "file": None, "path": "texts"}, 400, "not a regular file"),
        ("path missing", {**base, "file": None, "path": "texts/none.txt"}, 400, "No such file"),
        ("url not https", {**base, "file": None, "url": "http://127.0.0.1/x.txt"}, 400, "https"),
        ("url not fetchable", {**base, "file": None, "url": "https://127.0.0.1:1/x.txt"}, 400, "^" + re.escape(FETCH_FAILED) + "$"),
        ("bad name", dict(base, name="a/b"), 400, "name must be"),
        ("bad id", dict(base, id="../x"), 400, "id must be"),
        ("id too long", dict(base, id="x" * 65), 400, "id must be"),
        ("deploy not a bool", dict(base, deploy="yes"), 400, "deploy"),
        ("webhook not http", dict(base, webhook="ftp://127.0.0.1/x"), 400, "webhook"),
        ("webhook with a space", dict(base, webhook="http://127.0.0.1/a b"), 400, "webhook"),
        ("bad device", dict(base, device="tpu"), 400, "device"),
        ("text too short for the batch", dict(base, config=dict(TINY_ASPAN, batch_size=1000)), 400, "too short"),
        ("name of a loaded model", dict(base, name="aspan", deploy=True), 409, "loaded already"),
        ("name of a model file", dict(base, name="tiny-aspan"), 409, "model directory has"),
    ]
    os.symlink("/etc/passwd", os.path.join(S.data, "evil"))
    os.symlink("/etc", os.path.join(S.data, "linkdir"))
    for label, body, status, msg in cases:
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if v is not None}
        expect_error(label, S.j("POST", "/v1/jobs", body if not isinstance(body, str) else body.encode()), status, msg)
    expect_error("wrong content type", S.j("POST", "/v1/jobs", json.dumps(base), ctype="text/plain"), 415)
    expect_error("body over --max-body", S.j("POST", "/v1/jobs", b"{" + b" " * (9 << 20) + b"}"), 413, "max-body")
    device_default = S.job("aspan-1").get("device")
    r = S.j("POST", "/v1/jobs", dict(base, device="cuda"))
    if device_default == "cpu":
        expect_error("cuda where the build or the machine cannot", r, 400, "cuda")
    else:
        check("cuda accepted where it is the default", r.status == 201, f"{r}")
    r = S.j("POST", "/v1/jobs", {"family": "par-transformer-xl", "file": FILES["text"], "config": dict(TINY_PAR, gpus=2),
                                 "device": "cpu"})
    expect_error("several GPUs on the CPU", r, 400, "several GPUs are the CUDA trainer's")
    r = S.j("POST", "/v1/jobs", {"family": "par-transformer-xl", "file": FILES["text"], "config": TINY_PAR, "device": "cuda"})
    if device_default == "cpu":
        expect_error("cuda for PAR where the build or the machine cannot", r, 400, "cuda")
    else:
        check("cuda accepted for PAR where it is the default", r.status == 201, f"{r}")
    check("nothing started by a bad request", len(S.j("GET", "/v1/jobs").json["jobs"]) == n_before + 2 * (device_default != "cpu"))
    expect_error("unknown job", S.j("GET", "/v1/jobs/nope"), 404)
    expect_error("events of an unknown job", S.j("GET", "/v1/jobs/nope/events"), 404)
    expect_error("cancel an unknown job", S.j("POST", "/v1/jobs/nope/cancel"), 404)
    expect_error("resume an unknown job", S.j("POST", "/v1/jobs/nope/resume"), 404)
    expect_error("svg of an unknown job", S.j("GET", "/v1/jobs/nope/spans.svg"), 404)
    expect_error("list with a bad status", S.j("GET", "/v1/jobs?status=done"), 400, "status")
    expect_error("cancel a succeeded job", S.j("POST", "/v1/jobs/aspan-1/cancel"), 409, "succeeded")
    expect_error("resume a succeeded job", S.j("POST", "/v1/jobs/aspan-1/resume"), 409, "succeeded")
    r = S.j("GET", "/v1/jobs?status=succeeded")
    conforms("list", r, "JobList")
    check("list by status", all(x["status"] == "succeeded" for x in r.json["jobs"]) and len(r.json["jobs"]) >= 2, f"{r}")


def wait_checkpoint(S, jid, timeout=60):
    return wait_for(lambda: S.job(jid).get("checkpoint") and S.job(jid).get("status") == "running" and S.job(jid), timeout)


def t_cancel(S):
    r = S.j("POST", "/v1/jobs", {"id": "long-1", "family": "adaptive-span", "file": FILES["text"], "config": long_config()})
    check("long job", r.status == 201, f"{r}")
    r = S.j("POST", "/v1/jobs", {"id": "queued-1", "family": "adaptive-span", "file": FILES["text"], "config": long_config()})
    live = {}
    follower = threading.Thread(target=lambda: live.update(zip(("r", "evs"), follow_sse(S, "long-1", timeout=120))))
    follower.start()
    j = wait_checkpoint(S, "long-1") or {}
    check("running with a checkpoint; eta", j.get("status") == "running" and j.get("eta_s", 0) > 0 and j.get("pid"), f"{j}")
    try:
        environ = open(f"/proc/{j.get('pid')}/environ", "rb").read()
        check("the trainer's environment holds no key", b"SPANSERVE_ADMIN_KEY" not in environ and ENV_ADMIN.encode()
              not in environ and len(environ) > 0, f"{len(environ)} bytes")
    except OSError as e:
        check("the trainer's environment", False, str(e))
    q = S.job("queued-1")
    check("the second waits (--max-jobs 1)", q.get("status") == "queued", f"{q}")
    expect_error("a file in use is not deleted", S.j("DELETE", f"/v1/files/{FILES['text']}"), 409, "queued or running")
    r = S.j("POST", "/v1/jobs/queued-1/cancel")
    check("cancel queued: at once", r.status == 200 and r.json["status"] == "cancelled" and r.json["runs"] == 0, f"{r}")
    pid = j.get("pid")
    r = S.j("POST", "/v1/jobs/long-1/cancel")
    check("cancel running: 200", r.status == 200 and r.json["status"] in ("running", "cancelled"), f"{r}")
    j = S.wait_status("long-1", ("cancelled", "failed"), 20) or {}
    check("cancelled", j.get("status") == "cancelled" and "checkpoint" in j, f"{j}")
    stop = [e for e in log_events(S, "long-1") if e["event"] == "stopped"]
    check("SIGTERM: the trainer stopped after its step, that step saved", stop
          and stop[-1]["step"] == j.get("checkpoint", {}).get("step"), f"{stop} {j.get('checkpoint')}")
    check("its process is gone", pid and not alive(pid), f"{pid}")
    follower.join(30)
    names = [e for e, _ in live.get("evs", [])]
    check("a stream that followed it live: lines while it ran, the cancelled job at the end",
          names[:2] == ["job", "start"] and "train" in names and "checkpoint" in names and names[-1] == "job"
          and json.loads(live["evs"][-1][1])["status"] == "cancelled", f"{names[:5]} ... {names[-3:]}")
    ck = j.get("checkpoint", {})
    check("the last checkpoint is kept", os.path.exists(ck.get("path", "")) and os.path.exists(ck.get("path", "") + ".state"), f"{ck}")
    r = S.j("POST", "/v1/jobs/long-1/cancel")
    check("cancel again: 200, still cancelled", r.status == 200 and r.json["status"] == "cancelled", f"{r}")
    # resumed: continues from the checkpoint
    r = S.j("POST", "/v1/jobs/long-1/resume")
    check("resume 200", r.status == 200 and r.json["status"] in ("queued", "running"), f"{r}")
    expect_error("resume a queued or running job", S.j("POST", "/v1/jobs/long-1/resume"), 409)
    j = wait_for(lambda: any(e["event"] == "resume" for e in log_events(S, "long-1")) and S.job("long-1"), 30) or {}
    ev = [e for e in log_events(S, "long-1") if e["event"] == "resume"]
    check("resumed from the checkpoint", ev and ev[0]["step"] == ck.get("step") and j.get("runs") == 2, f"{ev} {j.get('runs')}")
    S.j("POST", "/v1/jobs/long-1/cancel")
    check("cancelled again", (S.wait_status("long-1", ("cancelled",), 20) or {}).get("status") == "cancelled")


def t_cancel_kill(S):
    """A trainer that stops gracefully on SIGTERM does so after its step in
    progress; one whose step outlasts --cancel-grace (2 s here: a model whose
    every step takes seconds on the CPU) is killed then."""
    slow = dict(TINY_ASPAN, hidden_size=512, inner_hidden_size=2048, nb_layers=6, nb_heads=8, attn_span=64,
                block_size=48, batch_size=16, steps=1000, log_every=1, eval_every=0, checkpoint_every=0)
    r = S.j("POST", "/v1/jobs", {"id": "slow-1", "family": "adaptive-span", "file": FILES["text"], "config": slow})
    check("slow job", r.status == 201, f"{r}")
    j = wait_for(lambda: any(e["event"] == "start" for e in log_events(S, "slow-1")) and S.job("slow-1"), 60) or {}
    pid = j.get("pid")
    check("running, its trainer started", j.get("status") == "running" and pid, f"{j}")
    if not pid:
        return
    t0 = time.time()
    r = S.j("POST", "/v1/jobs/slow-1/cancel")
    time.sleep(1.0)
    check("SIGTERM: the trainer finishes its step first", r.status == 200 and alive(pid)
          and S.job("slow-1").get("status") == "running", f"{r} {S.job('slow-1')}")
    j = S.wait_status("slow-1", ("cancelled", "failed"), 30) or {}
    dt = time.time() - t0
    check("past --cancel-grace: SIGKILL, the job cancelled", j.get("status") == "cancelled" and dt >= 1.9
          and not alive(pid), f"{dt:.1f} s {j}")
    ev = [e["event"] for e in log_events(S, "slow-1")]
    check("no step finished: nothing saved, no stopped line", "stopped" not in ev and "checkpoint" not in ev
          and not j.get("checkpoint"), f"{ev} {j.get('checkpoint')}")


def t_https(S, web):
    """A training text fetched from an https URL (its server's certificate
    trusted through --ca-file), and one over --max-upload."""
    r = S.j("POST", "/v1/jobs", {"id": "url-1", "family": "adaptive-span", "url": web.url + "/text.txt",
                                  "config": dict(TINY_ASPAN, steps=40)})
    check("https URL: accepted", r.status == 201, f"{r}")
    j = S.wait_status("url-1", ("succeeded", "failed", "cancelled"), 90) or {}
    check("https URL: fetched and trained", j.get("status") == "succeeded" and j.get("data", {}).get("url") == web.url
          + "/text.txt", f"{j}")
    expect_error("https URL over --max-upload", S.j("POST", "/v1/jobs", {"family": "adaptive-span", "url": web.url
                 + "/big.txt", "config": TINY_ASPAN}), 413, "")
    expect_error("https URL not found", S.j("POST", "/v1/jobs", {"family": "adaptive-span", "url": web.url
                 + "/missing.txt", "config": TINY_ASPAN}), 400, "^cannot fetch the URL: the host answered HTTP 404$")


def t_ssrf(S, web, hook):
    """The destination policy (--fetch-allow 127.0.0.1 only): a text's URL
    and a webhook at localhost, which resolves to loopback, are refused after
    DNS: the one message, nothing fetched or stored, nothing delivered."""
    files = S.j("GET", "/v1/files").json["files"]
    for label, url in (("localhost (loopback, not allowed)", web.url.replace("127.0.0.1", "localhost") + "/text.txt"),
                       ("169.254.169.254 (link-local)", "https://169.254.169.254/latest/user-data")):
        r = S.j("POST", "/v1/jobs", {"family": "adaptive-span", "url": url, "config": TINY_ASPAN})
        expect_error(f"a text's URL at {label}: 400, the one message", r, 400, "^" + re.escape(FETCH_FAILED) + "$")
    check("no file stored, nothing left", S.j("GET", "/v1/files").json["files"] == files
          and not [f for f in os.listdir(os.path.join(S.data, "files")) if f.startswith(".")], f"{os.listdir(os.path.join(S.data, 'files'))}")
    check("the log says why", re.search(r"fetch from localhost: .*is a loopback address", S.tail(20000)), S.tail(600))
    r = S.j("POST", "/v1/jobs", {"id": "hook-forbidden", "family": "adaptive-span", "file": FILES["text"],
                                  "config": dict(TINY_ASPAN, steps=20), "webhook": hook.url.replace("127.0.0.1", "localhost")
                                  + "/hook/forbidden"})
    check("a job whose webhook is at localhost: 201 (the address is checked when it is sent)", r.status == 201, f"{r}")
    j = wait_for(lambda: S.job("hook-forbidden").get("webhook", {}).get("attempts", 0) >= 2 and S.job("hook-forbidden"), 60) or {}
    w = j.get("webhook", {})
    check("the job succeeds; its webhook is retried with the one message", j.get("status") == "succeeded"
          and w.get("state") == "pending" and w.get("error") == FETCH_FAILED, f"{j}")
    check("nothing delivered", hook.bodies("/hook/forbidden") == [], f"{hook.bodies('/hook/forbidden')}")


def t_ssrf_final(S, hook):
    """hook-forbidden's webhook, given up after its 6 attempts (1+2+4+8+16 s
    after the first: other tests ran meanwhile)."""
    j = wait_for(lambda: S.job("hook-forbidden").get("webhook", {}).get("state") == "failed" and S.job("hook-forbidden"), 60) or {}
    w = j.get("webhook", {})
    check("a webhook at a refused address: failed after 6 attempts, the one message", w.get("attempts") == 6
          and w.get("error") == FETCH_FAILED, f"{j}")
    check("nothing delivered", hook.bodies("/hook/forbidden") == [], f"{hook.bodies('/hook/forbidden')}")


def t_killed(S):
    r = S.j("POST", "/v1/jobs", {"id": "killed-1", "family": "adaptive-span", "file": FILES["text"], "config": long_config(),
                                  "webhook": S.hook_url + "/hook/killed"})
    j = wait_checkpoint(S, "killed-1") or {}
    pid = j.get("pid")
    check("running", pid, f"{j}")
    if not pid:
        return
    os.kill(pid, signal.SIGKILL)
    j = S.wait_status("killed-1", ("failed", "succeeded", "cancelled"), 20) or {}
    check("killed: failed, saying so", j.get("status") == "failed" and "signal 9" in j.get("error", ""), f"{j}")
    got = wait_for(lambda: S.hook_bodies("/hook/killed"), 15)
    check("webhook of a failure", got and got[0]["status"] == "failed", f"{got}")
    ck = j.get("checkpoint", {}).get("step")
    try:   # the state sidecar's step: what a resume starts from, even when the log's line never came
        with open(j["checkpoint"]["path"] + ".state", "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            on_disk = int(json.loads(f.read(n))["__metadata__"]["step"])
    except (OSError, KeyError, ValueError) as e:
        on_disk = str(e)
    check("killed: the job's checkpoint step is the one on disk", ck == on_disk, f"{ck} {on_disk}")
    r = S.j("POST", "/v1/jobs/killed-1/resume")
    check("resume a failed job", r.status == 200, f"{r}")
    ev = wait_for(lambda: [e for e in log_events(S, "killed-1") if e["event"] == "resume"], 30)
    check("it resumed from its checkpoint", ev and ev[0]["step"] == ck, f"{ev} {ck}")
    S.j("POST", "/v1/jobs/killed-1/cancel")
    S.wait_status("killed-1", ("cancelled",), 20)


def t_delete(S):
    """DELETE /v1/jobs/ID: a finished job and its directory; never a queued
    or running one; the model it put in --model-dir stays."""
    r = S.j("POST", "/v1/jobs", {"id": "del-1", "family": "adaptive-span", "file": FILES["text"], "name": "del-model",
                                  "config": dict(TINY_ASPAN, steps=40)})
    check("del-1 submitted", r.status == 201, f"{r}")
    j = S.wait_status("del-1", ("succeeded", "failed", "cancelled"), 90) or {}
    check("del-1 succeeded", j.get("status") == "succeeded", f"{j}")
    d = os.path.join(S.state, "jobs", "del-1")
    check("its directory", os.path.isdir(d), d)
    r = S.j("DELETE", "/v1/jobs/del-1")
    check("DELETE a finished job: 200", r.status == 200 and r.json == {"deleted": "del-1"}, f"{r}")
    conforms("delete job", r, "Deleted")
    check("its directory is gone, nothing left beside it", not os.path.exists(d)
          and not [n for n in os.listdir(os.path.join(S.state, "jobs")) if "~" in n], f"{os.listdir(os.path.join(S.state, 'jobs'))}")
    expect_error("GET a deleted job", S.j("GET", "/v1/jobs/del-1"), 404, "no job")
    expect_error("its events", S.j("GET", "/v1/jobs/del-1/events"), 404, "no job")
    expect_error("DELETE again", S.j("DELETE", "/v1/jobs/del-1"), 404, "no job")
    check("not listed", "del-1" not in [x["id"] for x in S.j("GET", "/v1/jobs").json["jobs"]])
    check("the model it put in --model-dir stays", os.path.exists(os.path.join(S.models, "del-model.safetensors")))
    expect_error("DELETE without the admin key", S.j("DELETE", "/v1/jobs/aspan-1", key=None), 401, "")
    expect_error("DELETE with the inference key", S.j("DELETE", "/v1/jobs/aspan-1", key=APIKEY), 401, "")
    expect_error("DELETE a bad id", S.j("DELETE", "/v1/jobs/..%2f..%2fetc"), 404, "")
    # the id is free again
    r = S.j("POST", "/v1/jobs", {"id": "del-1", "family": "adaptive-span", "file": FILES["text"], "config": long_config()})
    check("the id can be used again", r.status == 201, f"{r}")
    wait_for(lambda: S.job("del-1").get("status") == "running", 30)
    # a stream that follows it: ends when the job is deleted
    live = {}
    follower = threading.Thread(target=lambda: live.update(zip(("r", "evs"), follow_sse(S, "del-1", timeout=60))))
    follower.start()
    expect_error("DELETE a running job: 409", S.j("DELETE", "/v1/jobs/del-1"), 409, "cancel it first")
    S.j("POST", "/v1/jobs/del-1/cancel")
    S.wait_status("del-1", ("cancelled",), 20)
    r = S.j("DELETE", "/v1/jobs/del-1")
    check("cancel, then DELETE: 200", r.status == 200, f"{r}")
    follower.join(60)
    names = [e for e, _ in live.get("evs", [])]
    check("the stream that followed it ended with the job", names[:1] == ["job"] and names[-1:] == ["job"]
          and json.loads(live["evs"][-1][1])["status"] == "cancelled", f"{names}")
    p = subprocess.run([CTL, "--url", f"http://127.0.0.1:{S.jport}", "--api-key", ADMIN, "jobs", "delete", "queued-1"],
                       capture_output=True, text=True, timeout=30)
    check("spanctl jobs delete", p.returncode == 0 and "deleted queued-1" in p.stdout, f"{p.returncode} {p.stdout} {p.stderr}")
    p = subprocess.run([CTL, "--url", f"http://127.0.0.1:{S.jport}", "--api-key", ADMIN, "jobs", "delete", "queued-1"],
                       capture_output=True, text=True, timeout=30)
    check("spanctl jobs delete of an unknown job: 1", p.returncode == 1 and "no job" in p.stderr, f"{p.stderr}")


def t_checkpoint(S):
    """GET /v1/jobs/ID/checkpoint: the last checkpoint, whole, as an attachment."""
    r = S.j("GET", "/v1/jobs/aspan-1/checkpoint")
    with open(os.path.join(S.models, "tiny-aspan.safetensors"), "rb") as f:
        want = f.read()
    check("checkpoint: 200, the bytes of the model it became", r.status == 200 and r.body == want, f"{r.status} {len(r.body)}")
    check("checkpoint: octet-stream, an attachment named after the job",
          r.headers.get("content-type") == "application/octet-stream"
          and 'filename="aspan-1.safetensors"' in r.headers.get("content-disposition", ""), f"{r.headers}")
    # it loads on the inference listener and scores as the deployed model
    with open(os.path.join(S.models, "downloaded.safetensors"), "wb") as f:
        f.write(r.body)
    r = S.api("POST", "/v1/models", {"name": "downloaded", "path": "downloaded.safetensors"})
    check("the downloaded checkpoint loads", r.status == 201, f"{r}")
    a = S.api("POST", "/v1/score", {"model": "downloaded", "text": TEXT[:300]}).json or {}
    b = S.api("POST", "/v1/score", {"model": "tiny-aspan", "text": TEXT[:300]}).json or {}
    check("and scores as the deployed model", a.get("bpc") is not None and a.get("bpc") == b.get("bpc"), f"{a} {b}")
    S.api("DELETE", "/v1/models/downloaded")
    expect_error("checkpoint of a job that has none", S.j("GET", "/v1/jobs/queued-1/checkpoint"), 404, "no checkpoint yet")
    expect_error("checkpoint of no job", S.j("GET", "/v1/jobs/nope/checkpoint"), 404, "no job")
    expect_error("checkpoint without the admin key", S.j("GET", "/v1/jobs/aspan-1/checkpoint", key=None), 401, "")
    # while a job trains: a whole file, every time
    r = S.j("POST", "/v1/jobs", {"id": "ck-live", "family": "adaptive-span", "file": FILES["text"],
                                 "config": dict(long_config(), checkpoint_every=5)})
    wait_checkpoint(S, "ck-live")
    sizes = set()
    for _ in range(20):
        r = S.j("GET", "/v1/jobs/ck-live/checkpoint")
        n = struct.unpack("<Q", r.body[:8])[0] if len(r.body) >= 8 else -1
        ok = r.status == 200 and 0 < n < len(r.body) and json.loads(r.body[8:8 + n]).get("__metadata__")
        sizes.add(len(r.body) if ok else -1)
    check("downloads during training: whole checkpoints", -1 not in sizes and len(sizes) == 1, f"{sizes}")
    S.j("POST", "/v1/jobs/ck-live/cancel")
    S.wait_status("ck-live", ("cancelled",), 20)


def t_metrics(S):
    """The jobs' lines of /metrics on the main listener."""
    r = S.api("GET", "/metrics")
    text = r.body.decode()
    m = dict((k, float(v)) for k, v in re.findall(r"^(spanserve_job[a-z_]*\{[^}]*\}) ([0-9.e+]+)$", text, re.M))
    jobs = S.j("GET", "/v1/jobs").json["jobs"]
    by = {st: sum(1 for j in jobs if j["status"] == st) for st in ("queued", "running", "succeeded", "failed", "cancelled")}
    check("spanserve_jobs{status} counts the jobs", all(m.get(f'spanserve_jobs{{status="{st}"}}') == n for st, n in by.items()),
          f"{by} {m}")
    check("runs ended: succeeded, failed (the killed one), cancelled",
          m.get('spanserve_job_runs_ended_total{outcome="succeeded"}', 0) >= 4
          and m.get('spanserve_job_runs_ended_total{outcome="failed"}', 0) >= 1
          and m.get('spanserve_job_runs_ended_total{outcome="cancelled"}', 0) >= 3, f"{m}")
    check("webhooks delivered after a retry, one given up (at a refused address)",
          m.get('spanserve_job_webhooks_total{result="delivered"}', 0) >= 2
          and m.get('spanserve_job_webhooks_total{result="failed"}') == 1, f"{m}")
    check("metrics: HELP and TYPE for each", all(f"# TYPE {n} " in text for n in ("spanserve_jobs", "spanserve_job_runs_ended_total",
                                                                                    "spanserve_job_webhooks_total")))


def t_retention(tmp):
    """No --model-dir (a deployed model is served from its job's directory),
    --job-retention 3 s, --sse-keepalive 0.5 s."""
    global CURRENT
    CURRENT = "retention"
    S = Server(tmp, model_dir=False, extra=["--job-retention", "3s", "--sse-keepalive", "0.5"])
    err = S.start()
    if not check("server", err is None, f"{err}"):
        return S
    fid = upload(S, TEXT).json["id"]
    S.j("POST", "/v1/jobs", {"id": "served", "family": "adaptive-span", "file": fid, "name": "served-model", "deploy": True,
                             "config": dict(TINY_ASPAN, steps=40)})
    j = S.wait_status("served", ("succeeded", "failed", "cancelled"), 90) or {}
    check("deployed from its own directory", j.get("status") == "succeeded" and j.get("model", {}).get("deployed")
          and j["model"]["path"].startswith(os.path.realpath(S.state)), f"{j}")
    # keep-alive comments on a quiet stream: a job waiting behind a long one
    S.j("POST", "/v1/jobs", {"id": "long", "family": "adaptive-span", "file": fid, "config": long_config()})
    S.j("POST", "/v1/jobs", {"id": "waiting", "family": "adaptive-span", "file": fid, "config": long_config()})
    wait_for(lambda: S.job("long").get("status") == "running", 30)
    import socket
    sock = socket.create_connection(("127.0.0.1", S.jport), timeout=10)
    sock.sendall(f"GET /v1/jobs/waiting/events?stream=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode())
    got, t0 = b"", time.time()
    while time.time() - t0 < 2.4:
        sock.settimeout(max(0.05, 2.4 - (time.time() - t0)))
        try:
            b = sock.recv(65536)
        except socket.timeout:
            break
        if not b:
            break
        got += b
    sock.close()
    n = got.count(b": keep-alive")
    check("a quiet stream: a keep-alive comment every --sse-keepalive", 2 <= n <= 7 and b"event: job" in got, f"{n} {got[-300:]!r}")
    check("the job still waits", S.job("waiting").get("status") == "queued", f"{S.job('waiting')}")
    S.j("POST", "/v1/jobs/waiting/cancel")
    S.j("POST", "/v1/jobs/long/cancel")
    S.wait_status("long", ("cancelled",), 20)
    # --job-retention: the finished jobs go, save the one whose model is served from its directory
    gone = wait_for(lambda: S.j("GET", "/v1/jobs/waiting").status == 404 and S.j("GET", "/v1/jobs/long").status == 404, 15)
    check("--job-retention: finished jobs deleted", gone and not os.path.exists(os.path.join(S.state, "jobs", "long")),
          f"{[x['id'] for x in S.j('GET', '/v1/jobs').json['jobs']]}")
    check("... but not the one whose model is served from its directory", S.job("served").get("status") == "succeeded")
    expect_error("DELETE a job whose model is served from its directory: 409",
                 S.j("DELETE", "/v1/jobs/served"), 409, "DELETE /v1/models/served-model")
    check("the model still generates", S.api("POST", "/v1/generate", {"model": "served-model", "prompt": "ROMEO:",
                                                                        "max_tokens": 5}).status == 200)
    r = S.api("DELETE", "/v1/models/served-model")
    check("the model deleted", r.status == 200, f"{r}")
    gone = wait_for(lambda: S.j("GET", "/v1/jobs/served").status == 404, 15)
    check("then --job-retention takes the job", gone and not os.path.exists(os.path.join(S.state, "jobs", "served")))
    return S


def t_restart(tmp, hook):
    """--max-jobs 2: R runs to its end across the restart, D dies while the server is down, Q waits queued."""
    global CURRENT
    CURRENT = "restart"
    S = Server(tmp, max_jobs=2)
    S.hook_url = hook.url
    err = S.start()
    if not check("server", err is None, f"{err}"):
        return S
    r = upload(S, TEXT)
    fid = r.json["id"]
    medium = dict(TINY_ASPAN, steps=10000, log_every=50, eval_every=0, checkpoint_every=500)
    S.j("POST", "/v1/jobs", {"id": "R", "family": "adaptive-span", "file": fid, "config": medium, "name": "after-restart",
                              "deploy": True, "webhook": hook.url + "/hook/R"})
    S.j("POST", "/v1/jobs", {"id": "D", "family": "adaptive-span", "file": fid, "config": long_config()})
    S.j("POST", "/v1/jobs", {"id": "Q", "family": "par-transformer-xl", "file": fid, "config": TINY_PAR})
    jr = wait_for(lambda: S.job("R").get("step", 0) > 0 and S.job("R"), 30) or {}
    jd = wait_checkpoint(S, "D") or {}
    check("R and D running, Q queued", jr.get("status") == "running" and jd.get("status") == "running"
          and S.job("Q").get("status") == "queued", f"{jr.get('status')} {jd.get('status')} {S.job('Q')}")
    # spanctl follows R's events across the restart (the server comes back on the same ports)
    follower = subprocess.Popen([CTL, "--url", f"http://127.0.0.1:{S.jport}", "--api-key", ADMIN, "jobs", "events", "R",
                                 "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(os.path.join(S.state, "jobs", "R", "train.log")), 10)
    time.sleep(0.5)
    rc = S.stop()
    check("the server exits 0 on SIGTERM with jobs running", rc == 0, f"{rc}: {S.tail()}")
    check("its training processes go on", alive(jd.get("pid", 0)) and (alive(jr.get("pid", 0)) or any(
        e["event"] == "done" for e in map(json.loads, open(os.path.join(S.state, "jobs", "R", "train.log"))))))
    os.kill(jd["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(jd["pid"]), 5)
    time.sleep(1.5)   # the follower finds nobody there, and tries again
    err = S.start(same_ports=True)
    if not check("server again", err is None, f"{err}"):
        return S
    j = S.job("R")
    check("R found again (or finished meanwhile)", j.get("status") in ("running", "succeeded") and j.get("runs") == 1, f"{j}")
    j = S.wait_status("R", ("succeeded", "failed"), 60) or {}
    check("R succeeded after the restart", j.get("status") == "succeeded" and j.get("step") == 10000
          and j.get("model", {}).get("deployed") is True, f"{j}")
    check("R deployed on the new server", S.api("GET", "/v1/models/after-restart").status == 200)
    got = wait_for(lambda: hook.bodies("/hook/R"), 15)
    check("R's webhook", got and got[0]["status"] == "succeeded", f"{got}")
    try:
        out, errs = follower.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        follower.kill()
        out, errs = follower.communicate()
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    check("spanctl jobs events --follow across the restart: every line once, to the end, exit 0",
          follower.returncode == 0 and lines == log_events(S, "R") and "following it again" in errs
          and "succeeded" in errs, f"{follower.returncode} {len(lines)} lines vs {len(log_events(S, 'R'))}: {errs[-400:]}")
    j = S.job("D")
    check("D died while the server was down: failed", j.get("status") == "failed" and "ended without finishing" in j.get("error", ""), f"{j}")
    j = S.wait_status("Q", ("succeeded", "failed"), 60) or {}
    check("Q kept its place and ran", j.get("status") == "succeeded", f"{j}")
    r = S.j("POST", "/v1/jobs/D/resume")
    ev = wait_for(lambda: [e for e in log_events(S, "D") if e["event"] == "resume"], 30)
    check("D resumed from its checkpoint", r.status == 200 and ev and ev[0]["step"] >= 100, f"{r} {ev}")
    S.j("POST", "/v1/jobs/D/cancel")
    check("D cancelled", (S.wait_status("D", ("cancelled",), 20) or {}).get("status") == "cancelled")
    return S


def t_spanctl(S):
    env = dict(os.environ, SPANSERVE_JOBS_URL=f"http://127.0.0.1:{S.jport}", SPANSERVE_ADMIN_KEY=ADMIN)
    env.pop("SPANSERVE_URL", None)

    def ctl(*args, timeout=60):
        return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout, env=env)

    cfg = os.path.join(S.tmp, "ctl.json")
    with open(cfg, "w") as f:
        json.dump(dict(TINY_ASPAN, family="adaptive-span"), f)
    txt = os.path.join(S.tmp, "ctl.txt")
    with open(txt, "w") as f:
        f.write(TEXT)
    p = ctl("jobs", "submit", cfg, "--text", txt, "--id", "ctl-1", "--name", "ctl-model", "--deploy")
    check("spanctl jobs submit", p.returncode == 0 and p.stdout.strip() == "ctl-1", f"{p.returncode} {p.stdout} {p.stderr}")
    p = ctl("jobs", "events", "ctl-1", "--follow")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    check("spanctl jobs events --follow: the lines to the end", p.returncode == 0 and lines and lines[0]["event"] == "start"
          and lines[-1]["event"] == "done" and "succeeded" in p.stderr, f"{p.returncode} {p.stdout[-300:]} {p.stderr}")
    p = ctl("jobs", "events", "ctl-1")
    check("spanctl jobs events: the same lines", p.returncode == 0
          and [json.loads(l) for l in p.stdout.splitlines() if l.strip()] == lines, f"{p.stdout[-300:]}")
    p = ctl("jobs", "get", "ctl-1")
    j = json.loads(p.stdout) if p.returncode == 0 else {}
    check("spanctl jobs get", j.get("status") == "succeeded" and j.get("model", {}).get("deployed") is True, f"{p.stdout} {p.stderr}")
    p = ctl("jobs", "list")
    check("spanctl jobs list: a table", p.returncode == 0 and re.search(r"^ctl-1\s+succeeded\s+adaptive-span\s+200/200", p.stdout, re.M),
          f"{p.stdout}")
    p = ctl("jobs", "list", "--json")
    check("spanctl jobs list --json", p.returncode == 0 and any(x["id"] == "ctl-1" for x in json.loads(p.stdout)["jobs"]))
    fid = j.get("data", {}).get("file", "")
    p = ctl("jobs", "submit", cfg, "--file", fid, "--id", "ctl-1", "--name", "ctl-model", "--deploy")
    check("spanctl jobs submit, the same submission again: the job", p.returncode == 0 and p.stdout.strip() == "ctl-1",
          f"{p.stderr}")
    files = sorted(f["id"] for f in S.j("GET", "/v1/files").json["files"])
    p = ctl("jobs", "submit", cfg, "--text", txt, "--id", "ctl-1", "--name", "ctl-model", "--deploy")
    check("spanctl jobs submit, the same id on another text: 1, 409", p.returncode == 1 and "409" in p.stderr, f"{p.stderr}")
    after = sorted(f["id"] for f in S.j("GET", "/v1/files").json["files"])
    check("... the text it uploaded for it deleted again", after == files and "deleted again" in p.stderr,
          f"{files} -> {after} {p.stderr}")
    # a `spanserve train` config as it is (README, "Training jobs"): its
    # data, out and log left out and said so, its device the job's
    with open(cfg, "w") as f:
        json.dump(dict(TINY_ASPAN, family="adaptive-span", data="text.txt", out="m.safetensors", log="m.log",
                       device="cpu"), f)
    p = ctl("jobs", "submit", cfg, "--file", fid, "--id", "ctl-3")
    j3 = S.job("ctl-3")
    check("spanctl jobs submit of a trainer's config: accepted", p.returncode == 0 and p.stdout.strip() == "ctl-3"
          and j3.get("device") == "cpu" and not {"data", "out", "log", "device", "family"} & set(j3.get("config", {})),
          f"{p.returncode} {p.stderr} {j3}")
    check("... the keys left out named", all(f'"{k}" is left out' in p.stderr for k in ("data", "out", "log")), p.stderr)
    S.j("POST", "/v1/jobs/ctl-3/cancel")
    check("ctl-3 cancelled", (S.wait_status("ctl-3", ("cancelled",), 20) or {}).get("status") == "cancelled")
    with open(cfg, "w") as f:
        json.dump(long_config(), f)
    p = ctl("jobs", "submit", cfg, "--family", "adaptive-span", "--file", FILES["text"], "--id", "ctl-2")
    check("spanctl jobs submit --family --file", p.returncode == 0 and p.stdout.strip() == "ctl-2", f"{p.stderr}")
    wait_checkpoint(S, "ctl-2")
    p = ctl("jobs", "cancel", "ctl-2")
    check("spanctl jobs cancel", p.returncode == 0, f"{p.stderr}")
    check("cancelled", (S.wait_status("ctl-2", ("cancelled",), 20) or {}).get("status") == "cancelled")
    p = ctl("jobs", "cancel", "ctl-1")
    check("spanctl jobs cancel of a succeeded job: 1 and the message", p.returncode == 1 and "succeeded" in p.stderr
          and "409" in p.stderr, f"{p.returncode} {p.stderr}")
    p = ctl("jobs", "get", "nope")
    check("spanctl jobs get unknown: 1", p.returncode == 1 and "no job" in p.stderr, f"{p.stderr}")
    p = ctl("jobs", "submit", cfg)
    check("spanctl jobs submit without a text: 2", p.returncode == 2, f"{p.returncode} {p.stderr}")
    p = ctl("jobs", "list", "--api-key", "wrong")
    check("spanctl jobs with a wrong key: 1, 401", p.returncode == 1 and "401" in p.stderr, f"{p.stderr}")


# ---------------------------------------------------------------- main


ONLY = set(sys.argv[1:])


def run(name, fn, *a):
    global CURRENT
    if ONLY and name not in ONLY:
        return
    CURRENT = name
    t0 = time.time()
    try:
        fn(*a)
    except Exception as e:
        check("exception", False, f"{type(e).__name__}: {e} {traceback.format_exc(limit=4)!r}")
    if os.environ.get("TEST_JOBS_VERBOSE"):
        print(f"  {name}: {time.time() - t0:.1f}s", flush=True)


def main():
    global CURRENT
    t_start = time.time()
    if not os.path.exists(A_PATH) or not os.path.exists(TEXT_PATH):
        print("note: no reference fixtures in SPANSERVE_SHARED or tests/")
    tmp = tempfile.mkdtemp(prefix="spanserve-jobs-")
    hook = Receiver(fail_first=1)
    servers = []
    try:
        web = HttpsFiles(tmp, {"/text.txt": TEXT.encode(), "/big.txt": b"x" * 400000})
        S = Server(os.path.join(tmp, "main"))
        S.ca_file = web.cert
        S.hook_url = hook.url
        S.hook_bodies = hook.bodies
        servers.append(S)
        err = S.start()
        if check("server", err is None, f"{err}"):
            run("auth", t_auth, S)
            run("files", t_files, S)
            run("train_aspan", t_train_aspan, S, hook)
            run("duplicate", t_duplicate, S)
            run("train_par", t_train_par, S)
            run("invalid", t_invalid, S)
            run("cancel", t_cancel, S)
            run("cancel_kill", t_cancel_kill, S)
            run("https", t_https, S, web)
            run("ssrf", t_ssrf, S, web, hook)
            run("killed", t_killed, S)
            run("spanctl", t_spanctl, S)
            run("checkpoint", t_checkpoint, S)
            run("delete", t_delete, S)
            run("ssrf_final", t_ssrf_final, S, hook)
            run("metrics", t_metrics, S)
        CURRENT = "main server"
        rc = S.stop()
        check("exit 0 on SIGTERM", rc == 0, f"{rc}: {S.tail()}")
        if not ONLY or "retention" in ONLY:
            servers.append(t_retention(os.path.join(tmp, "retention")))
            CURRENT = "retention server"
            rc = servers[-1].stop()
            check("exit 0 on SIGTERM", rc == 0, f"{rc}")
        if not ONLY or "restart" in ONLY:
            servers.append(t_restart(os.path.join(tmp, "restart"), hook))
            CURRENT = "restart server"
            rc = servers[-1].stop()
            check("exit 0 on SIGTERM", rc == 0, f"{rc}")
        for s in servers:
            for rep in s.sanitizer_reports():
                check("sanitizer", False, rep)
    finally:
        for s in servers:
            if s and s.proc and s.proc.poll() is None:
                s.proc.kill()
        # training processes left by a failed check
        for d in (os.path.join(tmp, x, "state", "jobs") for x in ("main", "retention", "restart")):
            for jid in os.listdir(d) if os.path.isdir(d) else []:
                try:
                    pid = json.load(open(os.path.join(d, jid, "job.json"))).get("pid", 0)
                    if pid and alive(pid) and "train" in open(f"/proc/{pid}/cmdline").read():
                        os.kill(pid, signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        hook.httpd.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    if os.environ.get("TEST_JOBS_VERBOSE"):
        print(f"total {time.time() - t_start:.1f}s")
    print(f"test_jobs.py: {PASS} passed, {FAIL} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())

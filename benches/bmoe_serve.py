"""What the serve benches share (benches/serve_load.py, prompt_cache/trace.py,
agent_replay/): start and stop `bmoe serve`, read a counter from /metrics,
stream one request's server-sent events. A script imports it with
`sys.path.insert(0, <the benches folder>)`."""
import json
import os
import re
import subprocess
import threading
import time
import urllib.request


def start(binary, model, flags, log_path=os.devnull, env=None):
    """`bmoe serve -m MODEL --port 0 FLAGS`, its stderr appended to log_path
    (none kept by default); (process, port) once it listens."""
    cmd = [binary, "serve", "-m", model, "--port", "0"] + flags
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         text=True, env=env)
    log = open(log_path, "a", buffering=1)
    log.write("$ " + " ".join(cmd) + "\n")
    for line in p.stderr:
        log.write(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        if m:
            def drain():
                for rest in p.stderr:
                    log.write(rest)
                log.close()
            threading.Thread(target=drain, daemon=True).start()
            return p, int(m.group(1))
    raise SystemExit(f"server did not start: {' '.join(cmd)} (log: {log_path})")


def stop(p):
    p.terminate()
    p.wait(timeout=120)


def counter(port, name):
    """A counter's value from /metrics (0 before it is first counted)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def events(port, path, body, timeout=3600):
    """POST body to path streamed; yield (seconds since the send, event)
    for each server-sent event's JSON data."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "x-api-key": "x"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                yield time.time() - t0, json.loads(line[6:])

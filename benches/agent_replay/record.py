#!/usr/bin/env python3
"""Record the requests Claude Code and Codex send (issue 67): each CLI runs
once (`claude -p`, `codex exec`) from a scratch HOME, with every telemetry,
update and error-report switch off (as tests/integration/agents.rs runs
them), against a small proxy that saves each request's whole body (the
server's -v log cuts a body at 16 KiB) and forwards it to `bmoe serve` on the
agent fixture. Where it can (root, util-linux), it runs in a fresh network
namespace with only loopback, so nothing leaves the machine.

Only the bodies are kept, in OUT/recorded/NNN-<route>.json ({"path", "body"});
the scratch HOME is removed. They hold the CLIs' own prompts and tool lists,
no user data; do not commit them.

Usage: benches/agent_replay/record.py BIN AGENT_MODEL OUT --npm DIR
  --npm: a folder (outside the repository) holding, or to hold, the npm
  installs of the pinned CLIs (tests/integration/common.rs CLAUDE_CODE, CODEX).
"""
import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bmoe_serve as serve  # noqa: E402

CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332", "claude")
CODEX = ("@openai/codex", "0.171.0", "codex")
MODEL = "zoo-agent"
PROMPT = "Say hello in one word."


def npm_cli(root, package, version, binary):
    """The CLI's path, installed with npm into root on first use."""
    slug = package.lstrip("@").replace("/", "-")
    d = os.path.join(root, f"npm-{slug}-{version}")
    if not os.path.isdir(d):
        subprocess.run(["npm", "install", "--prefix", d + ".tmp", "--no-audit", "--no-fund",
                        "--no-update-notifier", f"{package}@{version}"], check=True)
        os.rename(d + ".tmp", d)
    return os.path.join(d, "node_modules", ".bin", binary)


def proxy(upstream, out):
    """A proxy on a free loopback port that saves each POST body to out and
    forwards every request to upstream, streaming the answer back."""
    count = [0]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def forward(self, body):
            req = urllib.request.Request(upstream + self.path, body, method=self.command,
                                         headers={k: v for k, v in self.headers.items()
                                                  if k.lower() not in ("host", "content-length")})
            try:
                r = urllib.request.urlopen(req, timeout=600)
            except urllib.error.HTTPError as e:
                r = e
            self.send_response(r.status)
            for k, v in r.headers.items():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.end_headers()
            while chunk := r.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()

        def do_GET(self):
            self.forward(None)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                count[0] += 1
                route = self.path.split("?")[0].strip("/").replace("/", "_")
                name = os.path.join(out, f"{count[0]:03d}-{route}.json")
            with open(name, "w") as f:
                json.dump({"path": self.path, "body": json.loads(body)}, f)
            self.forward(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def isolated(home, extra):
    """The environment every agent gets: PATH, HOME and XDG folders in home."""
    env = {"PATH": os.environ["PATH"], "HOME": home, "TERM": "dumb", "NO_COLOR": "1",
           "XDG_CONFIG_HOME": f"{home}/.config", "XDG_CACHE_HOME": f"{home}/.cache",
           "XDG_DATA_HOME": f"{home}/.local/share", "XDG_STATE_HOME": f"{home}/.local/state"}
    env.update(extra)
    return env


def run_claude(cli, home, url):
    env = isolated(home, {
        "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "x",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16"})
    return subprocess.run([cli, "-p", PROMPT, "--model", MODEL, "--permission-mode", "dontAsk",
                           "--permission-prompts", "none", "--strict-mcp-config"],
                          env=env, cwd=home, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=180)


def codex_config(url):
    """Codex's config.toml: the template tests/integration/agents.rs uses too."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                        "tests", "integration", "codex_config.toml")
    with open(path) as f:
        return f.read().replace("{MODEL}", MODEL).replace("{URL}", url)


def run_codex(cli, home, url):
    codex_home = os.path.join(home, ".codex")
    os.makedirs(codex_home, exist_ok=True)
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(codex_config(url))
    env = isolated(home, {"CODEX_HOME": codex_home})
    return subprocess.run([cli, "exec", "--skip-git-repo-check", "--color", "never", PROMPT],
                          env=env, cwd=home, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=180)


def in_netns():
    """Run this script again in a loopback-only network namespace where one can
    be made; False where not (it then runs here, said on stderr)."""
    if os.environ.get("AGENT_REPLAY_NETNS") or os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    env = dict(os.environ, AGENT_REPLAY_NETNS="1")
    r = subprocess.run(["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                        sys.executable] + sys.argv, env=env)
    sys.exit(r.returncode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--npm", required=True)
    args = ap.parse_args()
    # Installed before entering the namespace (npm needs the registry once).
    clis = {"claude": npm_cli(args.npm, *CLAUDE_CODE), "codex": npm_cli(args.npm, *CODEX)}
    if not in_netns() and not os.environ.get("AGENT_REPLAY_NETNS"):
        print("note: no loopback-only namespace here (needs root and unshare): "
              "recording on the host's network", file=sys.stderr)
    out = os.path.join(args.out, "recorded")
    os.makedirs(out, exist_ok=True)
    # Codex refuses to put its helpers under /tmp: the scratch HOME is in OUT.
    home = tempfile.mkdtemp(prefix="home-", dir=args.out)
    try:
        p, port = serve.start(args.binary, args.model,
                              ["-c", "65536", "-n", "16", "-t", "2", "-v", "--served-name", MODEL,
                               "--prompt-cache", "off"],
                              os.path.join(args.out, "record-server.log"),
                              env=dict(os.environ, BMOE_CACHE_DIR=os.path.join(home, "bmoe")))
        httpd, url = proxy(f"http://127.0.0.1:{port}", out)
        for name, run in (("claude", run_claude), ("codex", run_codex)):
            r = run(clis[name], home, url)
            print(f"{name}: exit {r.returncode}, stdout {r.stdout.strip()[:200]!r}", file=sys.stderr)
            if r.returncode != 0:
                print(r.stderr[-2000:], file=sys.stderr)
        httpd.shutdown()
        serve.stop(p)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for f in sorted(os.listdir(out)):
        print(f, os.path.getsize(os.path.join(out, f)), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()

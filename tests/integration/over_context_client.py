"""A conversation past the server's -c, sent by the official Python clients
to each dialect, whole and streamed (run by the integration test
`serve_dialects::the_official_clients_raise_their_over_context_errors`, the
server started with -c N_CTX): each client raises its own 400 type, in its
dialect's words (Anthropic's `prompt is too long: N tokens > M maximum`,
OpenAI's code `context_length_exceeded` for chat and for Responses), never
a 500 and never a reply cut to fit. /v1/models gives the window and
/metrics counts the 400s. Exits non-zero on failure.

Usage: over_context_client.py BASE_URL N_CTX"""

import json
import re
import sys
import urllib.request

import anthropic
import openai

base_url, n_ctx = sys.argv[1], int(sys.argv[2])
long_text = "word " * (2 * n_ctx)
conversation = [
    {"role": "user", "content": "Remember this: " + long_text},
    {"role": "assistant", "content": "Remembered."},
    {"role": "user", "content": "Say hello."},
]


def get(path):
    with urllib.request.urlopen(base_url + path, timeout=60) as r:
        return r.read().decode()


# The window, as clients that read it look for it.
models = json.loads(get("/v1/models"))["data"]
assert models and all(m["context_length"] == n_ctx for m in models), models
assert all(m["max_model_len"] == n_ctx for m in models), models
model = models[0]["id"]

too_long = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


def anthropic_said(e):
    """Anthropic's error body, its message the one Claude Code acts on."""
    assert e.status_code == 400, e
    assert e.body["type"] == "error", e.body
    assert e.body["error"]["type"] == "invalid_request_error", e.body
    m = too_long.match(e.body["error"]["message"])
    assert m, e.body
    tokens, maximum = int(m.group(1)), int(m.group(2))
    assert maximum == n_ctx - 1 and tokens > maximum, e.body


claude = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120)
try:
    claude.messages.create(model=model, max_tokens=8, messages=conversation)
    raise AssertionError("anthropic: a conversation past the context was answered")
except anthropic.BadRequestError as e:
    anthropic_said(e)
try:
    with claude.messages.stream(model=model, max_tokens=8, messages=conversation) as s:
        text = "".join(s.text_stream)
    raise AssertionError(f"anthropic: a streamed conversation past the context gave {text!r}")
except anthropic.BadRequestError as e:
    anthropic_said(e)
try:
    for _ in claude.messages.create(
        model=model, max_tokens=8, messages=conversation, stream=True
    ):
        pass
    raise AssertionError("anthropic: a raw stream past the context was answered")
except anthropic.BadRequestError as e:
    anthropic_said(e)


def openai_said(e, param):
    """OpenAI's error: the code Codex and other clients compact or stop on."""
    assert e.status_code == 400, e
    assert e.code == "context_length_exceeded" and e.param == param, (e, e.code, e.param)
    assert e.body["type"] == "invalid_request_error", e.body
    assert too_long.match(e.body["message"]), e.body


gpt = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
try:
    gpt.chat.completions.create(model=model, messages=conversation, max_tokens=8)
    raise AssertionError("chat: a conversation past the context was answered")
except openai.BadRequestError as e:
    openai_said(e, "messages")
try:
    for _ in gpt.chat.completions.create(
        model=model, messages=conversation, max_tokens=8, stream=True
    ):
        pass
    raise AssertionError("chat: a streamed conversation past the context was answered")
except openai.BadRequestError as e:
    openai_said(e, "messages")
try:
    with gpt.chat.completions.stream(model=model, messages=conversation, max_tokens=8) as s:
        for _ in s:
            pass
    raise AssertionError("chat: a stream helper past the context was answered")
except openai.BadRequestError as e:
    openai_said(e, "messages")

items = [{"role": m["role"], "content": m["content"]} for m in conversation]
try:
    gpt.responses.create(model=model, input=items, max_output_tokens=16)
    raise AssertionError("responses: input past the context was answered")
except openai.BadRequestError as e:
    openai_said(e, "input")
try:
    for _ in gpt.responses.create(model=model, input=items, max_output_tokens=16, stream=True):
        pass
    raise AssertionError("responses: streamed input past the context was answered")
except openai.BadRequestError as e:
    openai_said(e, "input")
try:
    with gpt.responses.stream(model=model, input=items, max_output_tokens=16) as s:
        for _ in s:
            pass
    raise AssertionError("responses: a stream helper past the context was answered")
except openai.BadRequestError as e:
    openai_said(e, "input")

# The server counted each refusal as a 400 on its route, and nothing as a 5xx.
counted = {}
for line in get("/metrics").splitlines():
    m = re.match(r'bmoe_requests_total\{(.*)\} (\d+)', line)
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        counted[(labels["route"], labels["status"])] = int(m.group(2))
for route in ["messages", "chat", "responses"]:
    assert counted.get((route, "400")) == 3, (route, counted)
assert not [k for k in counted if k[1].startswith("5")], counted

print("over-context clients: ok")

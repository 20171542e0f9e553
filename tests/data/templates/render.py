#!/usr/bin/env python3
"""Expected outputs of the chat-template conformance suite.

Renders every template in manifest.json on every conversation in
conversations.json the way Hugging Face transformers' apply_chat_template
renders a chat template (Python jinja2: a sandboxed environment with
trim_blocks and lstrip_blocks on, loop controls, the {% generation %} tag
rendering its body, the globals raise_exception and strftime_now, a tojson
filter that is json.dumps with ensure_ascii off; messages, tools (None when
absent), documents (None), add_generation_prompt and the bos/eos token texts
as variables), with strftime_now pinned to the manifest's day.

Writes expected.json: {template file: {conversation: {"text": ...} or
{"error": ...}}}. Run it again (python3 render.py) after changing a template
or a conversation; the Rust suite (src/chat/conformance.rs) needs no Python.
Made with jinja2 3.1 (pip install jinja2).
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: the body, unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def environment(today):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return today.strftime(fmt)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, entry, conv, tools):
    try:
        template = env.from_string(source)
        text = template.render(
            messages=conv["messages"],
            tools=tools if conv.get("tools") else None,
            documents=None,
            add_generation_prompt=conv.get("add_generation_prompt", True),
            bos_token=entry["bos"],
            eos_token=entry["eos"],
        )
        return {"text": text}
    except Exception as e:  # the suite expects an error, whatever its words
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    manifest = json.load(open(os.path.join(HERE, "manifest.json")))
    convs = json.load(open(os.path.join(HERE, "conversations.json")))
    today = datetime.datetime.strptime(manifest["today"], "%Y-%m-%d").replace(hour=10, minute=30)
    env = environment(today)
    out = {}
    for entry in manifest["templates"]:
        source = open(os.path.join(HERE, entry["file"]), encoding="utf-8").read()
        out[entry["file"]] = {
            c["name"]: render(env, source, entry, c, convs["tools"]) for c in convs["conversations"]
        }
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in r for t in out.values() for r in t.values())
    print(f"{len(out)} templates x {len(convs['conversations'])} conversations, {errors} expected errors",
          file=sys.stderr)


if __name__ == "__main__":
    main()

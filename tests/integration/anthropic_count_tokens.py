"""The official Anthropic Python client's messages.count_tokens against
`bmoe serve` (run by `serve_dialects::the_anthropic_clients_count_tokens_works`):
the count equals the input tokens a real request reports (decoded plus
read from the cache), with a system
prompt and tools too. Exits non-zero on failure."""

import sys

import anthropic

base_url = sys.argv[1]
client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
tools = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
for extra in [{}, {"system": "Be brief."}, {"system": "Be brief.", "tools": tools}]:
    messages = [{"role": "user", "content": "Tell me a story."}]
    counted = client.messages.count_tokens(model="bmoe", messages=messages, **extra)
    real = client.messages.create(model="bmoe", messages=messages, max_tokens=1, **extra)
    # As Anthropic counts: input_tokens is the part not read from a cache.
    whole = real.usage.input_tokens + (real.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == whole, (extra, counted, real.usage)
    assert counted.input_tokens > 3, counted
print("anthropic count_tokens: ok")

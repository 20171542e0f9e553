#!/usr/bin/env bash
# The call-parser choice, measured: bmoe's Rust parsers and llama.cpp's own
# chat parser (common/chat.cpp through shim.cpp, built against the libraries
# llama-cpp-sys-2 already built for this checkout) on the same recorded
# replies of the 16 conformance families (tests/data/templates/recorded_calls.json).
# Needs a dev build (`cargo build`) first. Usage: benches/chat_parser/run.sh [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats=${1:-2000}
out=$(ls -dt target/debug/build/llama-cpp-sys-2-*/out 2>/dev/null | head -1)
[ -n "$out" ] || { echo "run: no llama-cpp-sys-2 build under target/debug: run cargo build first" >&2; exit 2; }
version=$(cargo metadata --format-version 1 --locked 2>/dev/null |
  python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="llama-cpp-sys-2"))')
src=$(dirname "$version")/llama.cpp
bin=$(mktemp -d)/chat_shim
g++ -std=c++17 -O2 -o "$bin" benches/chat_parser/shim.cpp \
  -I"$src/common" -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
  "$out/build/common/libllama-common.a" "$out/build/common/libllama-common-base.a" \
  "$out/lib/libllama.a" "$out/lib/libggml.a" "$out/lib/libggml-cpu.a" "$out/lib/libggml-rpc.a" \
  "$out/lib/libggml-base.a" "$out/build/vendor/hash/libvendor-hash.a" \
  "$out/build/vendor/cpp-httplib/libcpp-httplib.a" -lpthread -ldl -lm
echo "# llama.cpp's common chat parser (shim.cpp, -O2, $(basename "$(dirname "$version")"))"
"$bin" tests/data/templates "$repeats" 2>/dev/null
echo "# bmoe's parsers (dev profile)"
cargo bench --quiet --profile dev --bench chat_parser 2>/dev/null

#!/usr/bin/env bash
# Fuzz bmoe's model-file opening (ggml's gguf header reader, the completeness
# check, the expert layout and its checks) for a bounded time with cargo-fuzz.
#
#   benches/fuzz.sh [SECONDS] [MODEL]     (default 1800 s, the E8K2 fixture)
#
# Needs a nightly toolchain and cargo-fuzz (`rustup toolchain install nightly`,
# `cargo install cargo-fuzz`). Seeds: a complete tiny MoE and MODEL's header
# without its vocabulary (benches/fuzz_seed.py). libFuzzer stops on any panic,
# abort, or single allocation over 64 MiB (-malloc_limit_mb: inputs are at
# most 64 KiB, so that bound is 1000x the input). Findings land in
# fuzz/artifacts/gguf_header/; the corpus (fuzz/corpus/) is kept between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-1800}"
model="${2:-target/tmp/fixtures/smollm2-135m-upcycled-E8K2-s0.1-seed2.gguf}"
corpus=fuzz/corpus/gguf_header
mkdir -p "$corpus"
if [ -f "$model" ]; then
  python3 benches/fuzz_seed.py "$corpus" "$model"
else
  python3 benches/fuzz_seed.py "$corpus"
fi
cargo +nightly fuzz build gguf_header
cargo +nightly fuzz run gguf_header "$corpus" -- \
  -max_total_time="$secs" -max_len=65536 -malloc_limit_mb=64 -rss_limit_mb=2048 \
  -print_final_stats=1 2>&1 | tee "fuzz/gguf_header-$(date +%Y%m%d-%H%M).log" | grep -E "^#[0-9]+.*(pulse|DONE|NEW)|stat::|ERROR|SUMMARY|Done" || true

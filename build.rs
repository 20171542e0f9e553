//! The fixture builders' version: a hash of the sources that decide a test
//! fixture's bytes (the builders, the gguf writer and the llama.cpp seam they
//! quantize through, and Cargo.lock, which pins llama.cpp). The integration
//! tests keep their fixtures in a folder named by it, so a fixture is built
//! once per change of its builder, not once per test run.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::path::{Path, PathBuf};

/// What a fixture's bytes depend on, relative to the package root.
const INPUTS: [&str; 3] = ["src/fixture", "src/llama", "Cargo.lock"];

fn main() {
    let mut files = Vec::new();
    for input in INPUTS {
        println!("cargo:rerun-if-changed={input}");
        collect(Path::new(input), &mut files);
    }
    files.sort();
    let mut h = DefaultHasher::new();
    for f in &files {
        h.write(f.to_string_lossy().as_bytes());
        h.write(&std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rustc-env=BMOE_FIXTURE_KEY={:016x}", h.finish());
}

/// Every file under `p` (or `p` itself).
fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(p) {
        Ok(dir) => {
            for e in dir.flatten() {
                collect(&e.path(), out);
            }
        }
        Err(_) if p.is_file() => out.push(p.to_path_buf()),
        Err(_) => {}
    }
}

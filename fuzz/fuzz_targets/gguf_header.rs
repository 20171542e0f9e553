//! Fuzz target: any bytes as a model file, opened the way every bmoe command
//! opens one (ggml's gguf header reader, the completeness check, the expert
//! layout and its consistency check). Whatever the bytes: no panic or abort, an
//! accepted file has every expert slice inside it, a refused one gets an exit-4
//! error. Run by `benches/fuzz.sh` (see docs/reliability.md).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use bmoe::layout::MoeLayout;
use bmoe::llama::LlamaError;
use libfuzzer_sys::fuzz_target;

/// One scratch file per fuzzing process, on tmpfs when there is one.
fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("bmoe-fuzz-{}.gguf", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    std::fs::write(path, data).expect("write the scratch file");
    match MoeLayout::open(path) {
        Ok(layout) => {
            for e in &layout.experts {
                assert!(
                    e.slice_offset(e.n_expert) <= data.len() as u64,
                    "{}",
                    e.name
                );
            }
            let _ = (
                layout.expert_bytes(),
                layout.dense_bytes(),
                layout.routed_bytes_per_token(),
            );
        }
        Err(e) => assert!(
            matches!(
                e,
                LlamaError::NotGguf { .. }
                    | LlamaError::Truncated { .. }
                    | LlamaError::Corrupt { .. }
            ),
            "not an exit-4 error: {e:?}"
        ),
    }
});

//! `bmoe inspect`: what a gguf holds, from its header alone (nothing is loaded).

use std::fmt::Write;

use crate::layout::{MoeLayout, Proj};

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

/// A human-readable description of the model's layout.
pub fn report(path: &std::path::Path, l: &MoeLayout) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "model:            {}", path.display());
    let _ = writeln!(s, "arch:             {}", l.arch);
    let _ = writeln!(
        s,
        "file bytes:       {} ({})",
        l.file_bytes,
        mib(l.file_bytes)
    );
    let _ = writeln!(s, "alignment:        {}", l.alignment);
    let _ = writeln!(
        s,
        "layers:           {} trunk + {} nextn (MTP)",
        l.n_layer, l.n_layer_nextn
    );
    let _ = writeln!(s, "n_expert:         {}", l.n_expert);
    let _ = writeln!(s, "n_expert_used:    {}", l.n_expert_used);
    if l.is_moe() {
        for p in Proj::ALL {
            if let Some(b) = l.slice_bytes(p) {
                let ty = l
                    .experts
                    .iter()
                    .find(|e| e.proj == p)
                    .map(|e| e.ggml_type.name())
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "expert slice {:<5} {} bytes ({ty})",
                    format!("{}:", p.name()),
                    b
                );
            }
        }
        let _ = writeln!(s, "expert layers:    {}", l.expert_layers().len());
    } else {
        let _ = writeln!(
            s,
            "experts:          none (dense model: runs resident, nothing to stream)"
        );
    }
    let _ = writeln!(
        s,
        "dense bytes:      {} ({})",
        l.dense_bytes(),
        mib(l.dense_bytes())
    );
    let _ = writeln!(
        s,
        "expert bytes:     {} ({})",
        l.expert_bytes(),
        mib(l.expert_bytes())
    );
    let _ = writeln!(
        s,
        "routed bytes/tok: {} ({})",
        l.routed_bytes_per_token(),
        mib(l.routed_bytes_per_token())
    );
    if l.n_layer_nextn > 0 {
        let _ = writeln!(
            s,
            "routed bytes/MTP: {} ({})",
            l.routed_bytes_per_mtp_pass(),
            mib(l.routed_bytes_per_mtp_pass())
        );
    }
    let types: Vec<String> = l
        .types
        .iter()
        .map(|(t, (n, b))| format!("{t} x{n} ({})", mib(*b)))
        .collect();
    let _ = writeln!(s, "quant types:      {}", types.join(", "));
    s
}

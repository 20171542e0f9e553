//! The prompts a bench runs (shipped workloads or a prompt file) and warming
//! the model file into the page cache.

use super::error::BenchError;

/// The shipped prompts (benches/workloads/): (name, text).
pub const WORKLOADS: &[(&str, &str)] = &[
    (
        "prose",
        include_str!("../../../benches/workloads/prose.txt"),
    ),
    ("copy", include_str!("../../../benches/workloads/copy.txt")),
    ("long", include_str!("../../../benches/workloads/long.txt")),
    ("p64", include_str!("../../../benches/workloads/p64.txt")),
    ("p512", include_str!("../../../benches/workloads/p512.txt")),
    (
        "p2048",
        include_str!("../../../benches/workloads/p2048.txt"),
    ),
];

/// A shipped workload by name, or the text of a prompt file.
pub fn workload(name: &str) -> Result<(String, String), BenchError> {
    if let Some((n, t)) = WORKLOADS.iter().find(|w| w.0 == name) {
        return Ok((n.to_string(), t.to_string()));
    }
    let path = std::path::Path::new(name);
    if path.is_file() {
        return std::fs::read_to_string(path)
            .map(|t| (path.display().to_string(), t))
            .map_err(|source| BenchError::Io {
                what: "read the prompt file",
                path: path.to_path_buf(),
                source,
            });
    }
    Err(BenchError::Workload {
        name: name.to_string(),
        known: WORKLOADS.iter().map(|w| w.0).collect::<Vec<_>>().join(", "),
    })
}

/// Read `path` once through the page cache (so a following resident run
/// measures compute, not the disk). Returns the bytes read and the time taken.
pub fn warm_page_cache(path: &std::path::Path) -> std::io::Result<(u64, std::time::Duration)> {
    use std::io::Read;
    let t0 = std::time::Instant::now();
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((total, t0.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_shipped_and_unknown_names_fail() {
        for (name, text) in WORKLOADS {
            assert!(text.len() > 40, "{name} is too short");
            assert_eq!(workload(name).unwrap().1, *text);
        }
        assert!(workload("no-such-workload").is_err());
    }
}

//! What made a cached state: the model file (its size and a BLAKE3 hash of
//! all its bytes, [`super::model_id`]), the context settings that shape the
//! state, the settings that change its values, and the bmoe version.
//!
//! The context size is not one of them: a sequence's state holds its tokens'
//! KV cells, and llama.cpp restores them into any sequence with as many
//! cells (`llama_kv_cache::state_read_meta`: "not enough cells" is its only
//! size check, a refusal). An entry restores wherever its tokens fit
//! ([`Ident::fits`]), after a restart with another `-c` or `--parallel` too.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// An entry is restored only into a context with the same `Ident` (but for
/// `n_ctx`) and room for its tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ident {
    pub bmoe_version: String,
    pub model_bytes: u64,
    /// BLAKE3 of the whole model file, in hex: two files that differ
    /// anywhere never share states.
    pub model_hash: String,
    /// Positions per sequence (`-c`) of the context that wrote it: not a
    /// mismatch ([`Ident::fits`]).
    pub n_ctx: u32,
    /// KV streams the state is laid out for (`Context::state_streams`): 1
    /// for a plain KV cache whatever `--parallel`, else the sequences of the
    /// context (llama.cpp refuses another: "n_stream mismatch").
    #[serde(default = "one")]
    pub state_streams: u32,
    /// Other settings that change the state's values (e.g. `--n-expert-used`).
    pub settings: String,
}

impl Ident {
    /// The entries' folder under the cache directory: a hash of the ident,
    /// so that each model and context keeps its own.
    /// Every context size shares it.
    pub fn folder(&self) -> String {
        let key = Ident {
            n_ctx: 0,
            ..self.clone()
        };
        let json = serde_json::to_vec(&key).unwrap_or_default();
        let h = Sha256::digest(json);
        hex(&h[..8])
    }

    /// Whether an entry of `n_tokens` fits in a sequence of this context.
    pub fn fits(&self, n_tokens: usize) -> bool {
        n_tokens <= self.n_ctx as usize
    }

    /// What differs from `other`, in words (None: nothing, or only the
    /// context size: [`Ident::fits`] says whether its tokens fit).
    pub fn differs(&self, other: &Ident) -> Option<String> {
        if self.model_bytes != other.model_bytes || self.model_hash != other.model_hash {
            return Some(format!(
                "another model ({} bytes, hash {}; this one {} bytes, hash {})",
                other.model_bytes,
                short(&other.model_hash),
                self.model_bytes,
                short(&self.model_hash)
            ));
        }
        if self.state_streams != other.state_streams {
            return Some(format!(
                "another --parallel ({} KV streams; this one {})",
                other.state_streams, self.state_streams
            ));
        }
        if self.settings != other.settings {
            return Some(format!(
                "other settings ({}; these: {})",
                other.settings, self.settings
            ));
        }
        (self.bmoe_version != other.bmoe_version).then(|| {
            format!(
                "bmoe {} (this is bmoe {})",
                other.bmoe_version, self.bmoe_version
            )
        })
    }
}

fn one() -> u32 {
    1
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident() -> Ident {
        Ident {
            bmoe_version: "0.1.0".into(),
            model_bytes: 1000,
            model_hash: "ab".repeat(32),
            n_ctx: 512,
            state_streams: 1,
            settings: String::new(),
        }
    }

    #[test]
    fn each_difference_is_named_and_gets_its_own_folder() {
        let a = ident();
        assert_eq!(a.differs(&a.clone()), None);
        assert_eq!(a.folder(), a.clone().folder());
        type Change = fn(&mut Ident);
        let cases: [(Change, &str); 4] = [
            (|i| i.model_bytes = 1, "another model"),
            (|i| i.state_streams = 2, "another --parallel"),
            (|i| i.settings = "k=4".into(), "other settings"),
            (|i| i.bmoe_version = "9".into(), "bmoe 9"),
        ];
        for (change, says) in cases {
            let mut b = a.clone();
            change(&mut b);
            assert!(a.differs(&b).unwrap().contains(says), "{says}");
            assert_ne!(a.folder(), b.folder(), "{says}");
        }
    }

    #[test]
    fn another_context_size_restores_what_fits_and_skips_what_does_not() {
        let a = ident();
        for n_ctx in [256, 4096] {
            let b = Ident { n_ctx, ..a.clone() };
            assert_eq!(a.differs(&b), None, "-c {n_ctx}");
            assert_eq!(a.folder(), b.folder(), "-c {n_ctx}");
        }
        // An entry of 300 tokens (written at -c 4096, or 512) fits -c 512 and
        // 300, not -c 256.
        assert!(a.fits(300) && a.fits(512) && !a.fits(513));
        assert!(Ident {
            n_ctx: 300,
            ..a.clone()
        }
        .fits(300));
        assert!(!Ident { n_ctx: 256, ..a }.fits(300));
    }

    #[test]
    fn an_entry_without_its_stream_count_is_of_one_stream() {
        let mut v = serde_json::to_value(ident()).unwrap();
        v.as_object_mut().unwrap().remove("state_streams");
        let back: Ident = serde_json::from_value(v).unwrap();
        assert_eq!(back, ident());
    }
}

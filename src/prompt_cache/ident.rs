//! What made a cached state: the model file (its size and a BLAKE3 hash of
//! all its bytes, [`super::model_id`]), the context settings that shape the
//! state, the settings that change its values, and the bmoe version.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// An entry is restored only into a context with the same `Ident`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ident {
    pub bmoe_version: String,
    pub model_bytes: u64,
    /// BLAKE3 of the whole model file, in hex: two files that differ
    /// anywhere never share states.
    pub model_hash: String,
    /// Positions per sequence (`-c`).
    pub n_ctx: u32,
    /// Other settings that change the state's values (e.g. `--n-expert-used`).
    pub settings: String,
}

impl Ident {
    /// The entries' folder under the cache directory: a hash of the ident,
    /// so that each model and context keeps its own.
    pub fn folder(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let h = Sha256::digest(json);
        hex(&h[..8])
    }

    /// What differs from `other`, in words (None: nothing).
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
        if self.n_ctx != other.n_ctx {
            return Some(format!(
                "another context size (-c {}; this one -c {})",
                other.n_ctx, self.n_ctx
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
            (|i| i.n_ctx = 1024, "another context size"),
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
}

//! The RAM tier: states within a byte budget, the least recently used out
//! first; an entry whose tokens another entry's start with is dropped (the
//! longer one serves every prompt the shorter one would).

use std::sync::Arc;

use super::hit::{common_prefix, Hit};

struct RamEntry {
    /// Who may restore it ([`super::cache::PromptCache::lookup`]'s scope).
    scope: u64,
    tokens: Arc<[i32]>,
    state: Arc<Vec<u8>>,
    last_use: u64,
}

impl RamEntry {
    fn bytes(&self) -> u64 {
        entry_bytes(&self.tokens, &self.state)
    }
}

fn entry_bytes(tokens: &[i32], state: &[u8]) -> u64 {
    state.len() as u64 + 4 * tokens.len() as u64
}

pub(super) struct RamTier {
    budget_bytes: u64,
    used_bytes: u64,
    entries: Vec<RamEntry>,
    clock: u64,
}

impl RamTier {
    pub(super) fn new(budget_bytes: u64) -> Self {
        Self {
            budget_bytes,
            used_bytes: 0,
            entries: Vec::new(),
            clock: 0,
        }
    }

    /// The entry of `scope` sharing the longest prefix with `prompt`
    /// (marked used); another scope's entries are never looked at.
    pub(super) fn best(&mut self, scope: u64, prompt: &[i32]) -> Option<Hit> {
        self.clock += 1;
        let e = self
            .entries
            .iter_mut()
            .filter(|e| e.scope == scope)
            .max_by_key(|e| common_prefix(&e.tokens, prompt))?;
        e.last_use = self.clock;
        Some(Hit {
            tokens: e.tokens.clone(),
            state: e.state.clone(),
            common: common_prefix(&e.tokens, prompt),
        })
    }

    /// Keep `state` (false: bigger than the whole budget, or an entry
    /// already covers its tokens). Evicts the least recently used to fit.
    pub(super) fn insert(&mut self, scope: u64, tokens: Arc<[i32]>, state: Arc<Vec<u8>>) -> bool {
        let bytes = entry_bytes(&tokens, &state);
        let covered = |e: &RamEntry| e.scope == scope && e.tokens.starts_with(&tokens);
        if bytes > self.budget_bytes || self.entries.iter().any(covered) {
            return false;
        }
        self.entries
            .retain(|e| e.scope != scope || !tokens.starts_with(&e.tokens));
        self.used_bytes = self.entries.iter().map(RamEntry::bytes).sum();
        while self.used_bytes + bytes > self.budget_bytes {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_use)
            else {
                break;
            };
            self.used_bytes -= self.entries.swap_remove(oldest).bytes();
        }
        self.clock += 1;
        self.entries.push(RamEntry {
            scope,
            tokens,
            state,
            last_use: self.clock,
        });
        self.used_bytes += bytes;
        debug_assert!(self.used_bytes <= self.budget_bytes);
        true
    }

    #[cfg(test)]
    fn held(&self) -> Vec<Vec<i32>> {
        self.entries.iter().map(|e| e.tokens.to_vec()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(t: &mut RamTier, tokens: &[i32], bytes: usize) -> bool {
        t.insert(0, tokens.into(), Arc::new(vec![0; bytes]))
    }

    #[test]
    fn the_longest_shared_prefix_wins() {
        let mut t = RamTier::new(1 << 20);
        put(&mut t, &[1, 2, 3], 10);
        put(&mut t, &[1, 5, 6, 7], 10);
        let h = t.best(0, &[1, 2, 3, 4]).unwrap();
        assert_eq!((&*h.tokens, h.common), (&[1, 2, 3][..], 3));
        assert_eq!(t.best(0, &[1, 5, 9]).unwrap().common, 2);
    }

    #[test]
    fn the_budget_is_kept_least_recently_used_first() {
        // Each entry: 100 state bytes + 4 per token.
        let mut t = RamTier::new(320);
        put(&mut t, &[1], 100);
        put(&mut t, &[2], 100);
        put(&mut t, &[3], 100);
        t.best(0, &[1]);
        put(&mut t, &[4], 100);
        assert_eq!(t.held(), vec![vec![1], vec![3], vec![4]]);
        assert!(!put(&mut t, &[5], 400), "bigger than the budget");
        assert!(t.used_bytes <= 320);
    }

    #[test]
    fn a_covered_prefix_is_not_kept_twice() {
        let mut t = RamTier::new(1 << 20);
        put(&mut t, &[1, 2], 10);
        put(&mut t, &[1, 2, 3], 10);
        assert_eq!(t.held(), vec![vec![1, 2, 3]]);
        assert!(!put(&mut t, &[1, 2], 10));
    }
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    /// Issue 64, finding 8: another scope's entry is never a hit, and one
    /// scope's longer entry does not replace another's shorter one.
    #[test]
    fn a_scope_sees_only_its_own_entries() {
        let mut t = RamTier::new(1 << 20);
        assert!(t.insert(1, [1, 2, 3].into(), Arc::new(vec![0; 10])));
        assert!(t.best(2, &[1, 2, 3, 4]).is_none());
        assert!(t.insert(2, [1, 2, 3, 4].into(), Arc::new(vec![0; 10])));
        assert_eq!(t.best(1, &[1, 2, 3, 4]).unwrap().common, 3);
        assert_eq!(t.best(2, &[1, 2, 3, 4]).unwrap().common, 4);
    }
}

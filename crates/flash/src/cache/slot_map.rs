//! A map keyed by [`SlotKey`] stored densely, a row of experts per layer:
//! a lookup indexes two vectors instead of hashing. The expert cache's
//! eviction scan looks up every resident slot (thousands on a real model),
//! so its cost is this map's lookup.
//!
//! Keys are a model's (layer, expert) pairs: the flash actor checks them
//! against the model's expert counts before they reach the cache, and a
//! route trace's reader against its header (at most 2^24 slots). A row grows
//! to the largest expert id seen in its layer.

/// One cached unit: all projections of one expert of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    pub layer: u32,
    pub expert: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct SlotMap<T> {
    rows: Vec<Vec<Option<T>>>,
    len: usize,
}

impl<T> Default for SlotMap<T> {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            len: 0,
        }
    }
}

impl<T> SlotMap<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, k: &SlotKey) -> Option<&T> {
        self.rows
            .get(k.layer as usize)?
            .get(k.expert as usize)?
            .as_ref()
    }

    pub(crate) fn get_mut(&mut self, k: &SlotKey) -> Option<&mut T> {
        self.rows
            .get_mut(k.layer as usize)?
            .get_mut(k.expert as usize)?
            .as_mut()
    }

    pub(crate) fn contains_key(&self, k: &SlotKey) -> bool {
        self.get(k).is_some()
    }

    fn cell(&mut self, k: SlotKey) -> &mut Option<T> {
        let (l, e) = (k.layer as usize, k.expert as usize);
        if self.rows.len() <= l {
            self.rows.resize_with(l + 1, Vec::new);
        }
        let row = &mut self.rows[l];
        if row.len() <= e {
            row.resize_with(e + 1, || None);
        }
        &mut row[e]
    }

    /// Insert `v` at `k`; returns the value it replaced.
    pub(crate) fn insert(&mut self, k: SlotKey, v: T) -> Option<T> {
        let old = self.cell(k).replace(v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The value at `k`, inserted from `make` when absent.
    pub(crate) fn get_or_insert_with(&mut self, k: SlotKey, make: impl FnOnce() -> T) -> &mut T {
        if !self.contains_key(&k) {
            self.len += 1;
        }
        self.cell(k).get_or_insert_with(make)
    }

    pub(crate) fn remove(&mut self, k: &SlotKey) -> Option<T> {
        let old = self
            .rows
            .get_mut(k.layer as usize)?
            .get_mut(k.expert as usize)?
            .take();
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Every (key, value), layer-major.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotKey, &T)> {
        self.rows.iter().enumerate().flat_map(|(l, row)| {
            row.iter().enumerate().filter_map(move |(e, v)| {
                let k = SlotKey {
                    layer: l as u32,
                    expert: e as u32,
                };
                v.as_ref().map(|v| (k, v))
            })
        })
    }

    /// The entries of `layer` as (expert, value), in expert order.
    pub(crate) fn row_mut(&mut self, layer: u32) -> impl Iterator<Item = (u32, &mut T)> {
        self.rows
            .get_mut(layer as usize)
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(e, v)| v.as_mut().map(|v| (e as u32, v)))
    }

    /// Keep the entries `keep` says to (it may change them).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        for cell in self.rows.iter_mut().flatten() {
            if cell.as_mut().is_some_and(|v| !keep(v)) {
                *cell = None;
                self.len -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(layer: u32, expert: u32) -> SlotKey {
        SlotKey { layer, expert }
    }

    #[test]
    fn it_counts_inserts_removals_and_retains_like_a_map() {
        let mut m = SlotMap::default();
        assert_eq!(m.insert(k(3, 7), 1u32), None);
        assert_eq!(m.insert(k(3, 7), 2), Some(1));
        assert_eq!(m.insert(k(0, 0), 5), None);
        *m.get_or_insert_with(k(1, 2), || 0) += 4;
        *m.get_or_insert_with(k(1, 2), || 0) += 4;
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(&k(1, 2)), Some(&8));
        assert_eq!(m.get(&k(9, 9)), None);
        assert!(!m.contains_key(&k(3, 6)));
        let all: Vec<_> = m.iter().map(|(k, v)| (k.layer, k.expert, *v)).collect();
        assert_eq!(all, vec![(0, 0, 5), (1, 2, 8), (3, 7, 2)]);
        m.retain(|v| {
            *v /= 2;
            *v > 2
        });
        assert_eq!(m.len(), 1);
        assert_eq!(m.get(&k(1, 2)), Some(&4));
        assert_eq!(
            m.row_mut(1).map(|(e, v)| (e, *v)).collect::<Vec<_>>(),
            vec![(2, 4)]
        );
        assert_eq!(m.row_mut(8).count(), 0);
        assert_eq!(m.remove(&k(1, 2)), Some(4));
        assert_eq!(m.remove(&k(1, 2)), None);
        assert_eq!(m.len(), 0);
    }
}

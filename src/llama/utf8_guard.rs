//! Whole characters under a grammar. llama.cpp's grammar decodes a token's
//! bytes leniently: a surrogate (`ED A0 80`), an overlong form (`C0 80`) or
//! a lead byte above U+10FFFF (`F5`..`FF`) counts as one character there,
//! while the reply's UTF-8 is strict and writes each bad byte as U+FFFD. A
//! string under `maxLength` 16 came back as 18 characters, three of them
//! U+FFFD. This guard bans, at each step, the tokens whose bytes would not
//! continue the reply as valid UTF-8 (a character may still end in a later
//! token), so the grammar counts the characters the reply holds.

use super::{batch::Token, model::Model};

/// How a token's bytes stand alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// No bytes (a control token): the guard leaves it to the grammar.
    Empty,
    /// Whole valid characters, starting a new one.
    Whole,
    /// Anything else: its index among the odd tokens' bytes.
    Odd(u32),
}

/// The tokens' classes and the bytes of a character left open.
pub(crate) struct Utf8Guard {
    class: Vec<Class>,
    odd: Vec<(Token, Vec<u8>)>,
    /// The bytes of the last character, when it is not yet whole.
    pending: Vec<u8>,
}

/// Whether `piece` after `pending` (an open character, or nothing) is valid
/// UTF-8 so far (it may end in a character still open).
pub(crate) fn continues(pending: &[u8], piece: &[u8]) -> bool {
    let mut all = Vec::with_capacity(pending.len() + piece.len());
    all.extend_from_slice(pending);
    all.extend_from_slice(piece);
    match std::str::from_utf8(&all) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

impl Utf8Guard {
    /// The guard for `model`'s vocabulary.
    pub(crate) fn new(model: &Model) -> Self {
        let n = model.n_vocab() as Token;
        Self::of((0..n).map(|t| model.token_bytes(t, false)))
    }

    /// The guard for a vocabulary of these pieces (token `i` the `i`th).
    pub(crate) fn of(pieces: impl Iterator<Item = Vec<u8>>) -> Self {
        let mut odd = Vec::new();
        let class = pieces
            .enumerate()
            .map(|(t, bytes)| match std::str::from_utf8(&bytes) {
                _ if bytes.is_empty() => Class::Empty,
                Ok(_) => Class::Whole,
                Err(_) => {
                    odd.push((t as Token, bytes));
                    Class::Odd(odd.len() as u32 - 1)
                }
            })
            .collect();
        Self {
            class,
            odd,
            pending: Vec::new(),
        }
    }

    /// Whether token `t` may come next.
    pub(crate) fn admits(&self, t: Token) -> bool {
        match self.class.get(t as usize) {
            None | Some(Class::Empty) => true,
            Some(Class::Whole) => self.pending.is_empty(),
            Some(&Class::Odd(i)) => continues(&self.pending, &self.odd[i as usize].1),
        }
    }

    /// Set `ban(t)` for each token that may not come next.
    pub(crate) fn bans(&self, mut ban: impl FnMut(Token)) {
        if self.pending.is_empty() {
            self.odd
                .iter()
                .filter(|(_, b)| !continues(&[], b))
                .for_each(|&(t, _)| ban(t));
            return;
        }
        (0..self.class.len() as Token)
            .filter(|&t| !self.admits(t))
            .for_each(ban);
    }

    /// Token `t` was taken: the character it leaves open, if any.
    pub(crate) fn accept(&mut self, t: Token) {
        let piece: &[u8] = match self.class.get(t as usize) {
            Some(&Class::Odd(i)) => &self.odd[i as usize].1,
            Some(Class::Whole) => {
                self.pending.clear();
                return;
            }
            _ => return,
        };
        self.pending.extend_from_slice(piece);
        match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.clear(),
            Err(e) if e.error_len().is_none() => {
                self.pending.drain(..e.valid_up_to());
            }
            Err(_) => self.pending.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Utf8Guard {
        let pieces: Vec<Vec<u8>> = vec![
            b"ab".to_vec(),         // 0 whole
            vec![0xe4],             // 1 opens a 3-byte character
            vec![0xb8, 0xad],       // 2 closes it (U+4E2D)
            vec![0xed, 0xa0],       // 3 a surrogate's start: never valid
            vec![0x80],             // 4 a lone continuation byte
            vec![0xf8],             // 5 no such lead byte
            Vec::new(),             // 6 a control token
            vec![b'x', 0xe4, 0xb8], // 7 a whole character, then one open
        ];
        Utf8Guard::of(pieces.into_iter())
    }

    fn banned(g: &Utf8Guard) -> Vec<Token> {
        let mut out = Vec::new();
        g.bans(|t| out.push(t));
        out.sort();
        out
    }

    #[test]
    fn bytes_that_can_never_be_utf8_are_banned_and_a_split_character_must_close() {
        let mut g = guard();
        assert_eq!(banned(&g), vec![2, 3, 4, 5]);
        g.accept(1);
        // Only the bytes that continue U+4E2D's first byte, or a control token.
        assert_eq!(banned(&g), vec![0, 1, 3, 5, 7]);
        assert!(g.admits(2) && g.admits(4) && g.admits(6));
        g.accept(2);
        assert_eq!(banned(&g), vec![2, 3, 4, 5]);
        g.accept(7);
        assert!(!g.admits(0) && g.admits(4), "x then an open character");
        g.accept(4);
        assert!(g.admits(0));
    }

    #[test]
    fn continues_is_strict_utf8_with_an_open_end() {
        assert!(continues(&[], "é".as_bytes()));
        assert!(continues(&[0xe4], &[0xb8]));
        assert!(!continues(&[0xe4], b"a"));
        assert!(!continues(&[], &[0xc0, 0x80]), "overlong");
        assert!(!continues(&[], &[0xf4, 0x90, 0x80, 0x80]), "above U+10FFFF");
    }
}

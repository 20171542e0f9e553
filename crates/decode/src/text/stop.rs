//! Stop strings over streamed text: generation ends at the first occurrence
//! of any of them, and none of a stop string's text is ever handed out, even
//! when it arrives split over several tokens.

/// Holds back the tail of the text that could still begin a stop string.
#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not handed out (a possible stop string's beginning).
    held: String,
}

/// What one piece of text gave.
#[derive(Debug, PartialEq, Eq)]
pub struct Stopped {
    /// Text safe to hand out now.
    pub text: String,
    /// A stop string was found: `text` ends just before it, and generation ends.
    pub hit: bool,
}

impl StopStrings {
    /// Empty strings are ignored (they would stop before any text).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Add a piece of text: what can be handed out, and whether a stop string ended it.
    pub fn push(&mut self, piece: &str) -> Stopped {
        if self.stops.is_empty() {
            return Stopped {
                text: piece.to_owned(),
                hit: false,
            };
        }
        self.held.push_str(piece);
        if let Some(at) = self.first_match() {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Stopped { text, hit: true };
        }
        let keep = self.partial_tail();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        Stopped { text, hit: false }
    }

    /// The text still held at the end of generation (no stop string came).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The byte offset of the earliest complete stop string in the held text.
    fn first_match(&self) -> Option<usize> {
        self.stops.iter().filter_map(|s| self.held.find(s)).min()
    }

    /// The length of the longest held suffix that is a proper prefix of a stop
    /// string (always on a character boundary).
    fn partial_tail(&self) -> usize {
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let h = &self.held;
        (1..longest.min(h.len() + 1))
            .rev()
            .filter(|&n| h.is_char_boundary(h.len() - n))
            .find(|&n| self.stops.iter().any(|s| s.starts_with(&h[h.len() - n..])))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopStrings {
        StopStrings::new(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn no_stops_passes_text_through() {
        let mut s = stops(&[""]);
        assert!(s.is_empty());
        assert_eq!(s.push("abc").text, "abc");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn a_stop_split_over_pieces_is_never_handed_out() {
        let mut s = stops(&["\nUser:"]);
        let a = s.push("Hello\nUs");
        assert_eq!(
            a,
            Stopped {
                text: "Hello".into(),
                hit: false
            }
        );
        let b = s.push("er: hi");
        assert_eq!(
            b,
            Stopped {
                text: "".into(),
                hit: true
            }
        );
    }

    #[test]
    fn a_false_start_is_released() {
        let mut s = stops(&["END"]);
        assert_eq!(s.push("the E").text, "the ");
        assert_eq!(s.push("Nd").text, "ENd");
        assert_eq!(s.push("EN").text, "");
        assert_eq!(s.finish(), "EN");
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let mut s = stops(&["bb", "a"]);
        let r = s.push("xxbba");
        assert_eq!(
            r,
            Stopped {
                text: "xx".into(),
                hit: true
            }
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let mut s = stops(&["é!"]);
        assert_eq!(s.push("caféé").text, "café");
        assert_eq!(s.push("!").text, "");
        let mut t = stops(&["xé"]);
        assert_eq!(t.push("ééx").text, "éé");
    }
}

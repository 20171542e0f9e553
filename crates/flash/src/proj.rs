//! The three projections of a SwiGLU expert: one type for the model layout
//! (bmoe's `layout`) and the flash actor's arena (a region per layer and
//! projection), so the two never map indices by hand.

/// One projection of a SwiGLU expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proj {
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];
    /// How many there are (the arena's regions per layer).
    pub const COUNT: usize = Self::ALL.len();

    pub fn name(self) -> &'static str {
        match self {
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        }
    }

    /// Its position in [`Proj::ALL`] (0 gate, 1 up, 2 down).
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::Proj;

    #[test]
    fn indices_follow_all() {
        for (i, p) in Proj::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), i);
        }
    }
}

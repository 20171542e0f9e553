//! What it took to reach the first token: the load (model, contexts, the
//! dense weights read in), the bytes it read from storage, and the time to
//! the first generated token. Pure functions of the measured facts.

use std::time::Duration;

const MIB: f64 = 1024.0 * 1024.0;

/// The run's start-up, measured by the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Startup {
    /// Loading the model, creating the contexts and preparing the mapping
    /// (the dense weights warmed, locked or noted for copying).
    pub(crate) load: Duration,
    /// Bytes the process read from storage in that time (the kernel's count;
    /// None where /proc/self/io is unreadable).
    pub(crate) load_read_bytes: Option<u64>,
    /// From the start of the run to the prefill.
    pub(crate) before_prefill: Duration,
    /// llama.cpp's mapping was made without reading the files in (streamed).
    pub(crate) unpopulated: bool,
}

impl Startup {
    /// From the start of the run to the first generated token.
    pub(crate) fn first_token(&self, prefill: Duration) -> Duration {
        self.before_prefill + prefill
    }

    /// `load_s`, `load_read_bytes` (for the CSV preamble).
    pub(crate) fn load_pairs(&self) -> Vec<(String, String)> {
        vec![
            ("load_s".into(), format!("{:.3}", self.load.as_secs_f64())),
            (
                "load_read_bytes".into(),
                self.load_read_bytes.map_or("NA".into(), |b| b.to_string()),
            ),
        ]
    }

    /// The load pairs and `ttft_s` (for the CSV trailer and `BMOE_DONE`).
    pub(crate) fn trailer_pairs(&self, prefill: Duration) -> Vec<(String, String)> {
        let mut v = self.load_pairs();
        let ttft = self.first_token(prefill).as_secs_f64();
        v.push(("ttft_s".into(), format!("{ttft:.3}")));
        v
    }

    /// The summary's `load:` line.
    pub(crate) fn line(&self, prefill: Duration) -> String {
        let read = match self.load_read_bytes {
            Some(b) => format!("{:.1} MiB read from storage", b as f64 / MIB),
            None => "storage reads unknown".into(),
        };
        let how = if self.unpopulated {
            "the mapping not populated: experts left unread"
        } else {
            "the whole file mapped and populated"
        };
        format!(
            "load: {:.2} s, {read} ({how}); first token at {:.2} s",
            self.load.as_secs_f64(),
            self.first_token(prefill).as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_and_pairs_say_the_load_and_the_first_token() {
        let s = Startup {
            load: Duration::from_millis(1500),
            load_read_bytes: Some(30 << 20),
            before_prefill: Duration::from_millis(1600),
            unpopulated: true,
        };
        let prefill = Duration::from_millis(400);
        assert_eq!(
            s.line(prefill),
            "load: 1.50 s, 30.0 MiB read from storage (the mapping not populated: experts left \
             unread); first token at 2.00 s"
        );
        let pairs = s.trailer_pairs(prefill);
        let get = |k: &str| pairs.iter().find(|p| p.0 == k).unwrap().1.clone();
        assert_eq!(get("load_s"), "1.500");
        assert_eq!(get("load_read_bytes"), (30u64 << 20).to_string());
        assert_eq!(get("ttft_s"), "2.000");
        let unknown = Startup::default().load_pairs();
        assert_eq!(unknown[1].1, "NA");
    }
}

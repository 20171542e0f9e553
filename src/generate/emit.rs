//! From picked tokens to text: end of text, UTF-8 pieces, stop strings and
//! the token limit, the same for one generation or several side by side.

use bmoe_decode::text::{StopStrings, Utf8Stream};

use super::outcome::{GenerationSink, Limit, StopReason};
use crate::llama::{Model, Token};

/// One generation's output so far.
pub(crate) struct Emitter {
    /// Generated tokens (an end-of-generation token is not included).
    pub(crate) tokens: Vec<Token>,
    /// The text handed to the sink.
    pub(crate) text: String,
    utf8: Utf8Stream,
    stops: StopStrings,
    limit: Limit,
    /// Control tokens as their text.
    special: bool,
}

impl Emitter {
    pub(crate) fn new(stop: &[String], limit: Limit, special: bool) -> Self {
        Self {
            tokens: Vec::new(),
            text: String::new(),
            utf8: Utf8Stream::new(),
            stops: StopStrings::new(stop),
            limit,
            special,
        }
    }

    /// Hand one picked token's text to `sink`; a stop when the token ends
    /// the text, completes a stop string or reaches the limit.
    pub(crate) fn token(
        &mut self,
        model: &Model,
        t: Token,
        sink: &mut dyn GenerationSink,
    ) -> Option<StopReason> {
        if model.is_eog(t) {
            return Some(StopReason::EndOfText);
        }
        self.tokens.push(t);
        let piece = self.utf8.push(&model.token_bytes(t, self.special));
        if self.hand_out(&piece, sink) {
            return Some(StopReason::StopString);
        }
        (self.tokens.len() >= self.limit.n_predict as usize).then_some(StopReason::Limit)
    }

    /// Tokens the limit still allows.
    pub(crate) fn room(&self) -> usize {
        (self.limit.n_predict as usize).saturating_sub(self.tokens.len())
    }

    /// Pass text through the stop strings to the sink; true when one was hit.
    fn hand_out(&mut self, piece: &str, sink: &mut dyn GenerationSink) -> bool {
        if piece.is_empty() {
            return false;
        }
        let out = self.stops.push(piece);
        if !out.text.is_empty() {
            sink.text(&out.text);
            self.text.push_str(&out.text);
        }
        out.hit
    }

    /// The generation ended with `stop`: flush an incomplete UTF-8 tail and
    /// text held back for a stop string that never came.
    pub(crate) fn finish(&mut self, stop: StopReason, sink: &mut dyn GenerationSink) {
        let rest = self.utf8.finish();
        if stop == StopReason::StopString {
            return;
        }
        let rest = self.stops.push(&rest).text + &self.stops.finish();
        if !rest.is_empty() {
            sink.text(&rest);
            self.text.push_str(&rest);
        }
    }
}

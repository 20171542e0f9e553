//! A reply's reasoning block (`<think>…</think>`, as Qwen3, DeepSeek-R1 and
//! V3.x thinking, GLM, MiniMax-M2 and Kimi-K2-Thinking write it) split from
//! its answer, whole ([`split`]) or as the reply streams ([`ThinkStream`]).
//! The block is reasoning only where it opens the reply (after whitespace),
//! or where the prompt's generation prompt already opened it
//! ([`prompt_opens`]: the reply starts inside the block). Pure text work.

use super::tool_calls::partial_marker;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a template writes reasoning blocks (its source names the tag).
pub fn template_thinks(source: &str) -> bool {
    source.contains(CLOSE)
}

/// Whether a rendered prompt ends inside an open reasoning block: its
/// generation prompt ends with `<think>` (and whitespace), so the reply
/// starts with reasoning.
pub fn prompt_opens(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// `text` split into its reasoning (None: the reply has no block) and its
/// answer; `open`: the reply starts inside the block. An unclosed block is
/// all reasoning (the reply was cut while thinking).
pub fn split(text: &str, open: bool) -> (Option<String>, String) {
    let body = if open {
        text
    } else {
        match text.trim_start().strip_prefix(OPEN) {
            Some(rest) => rest,
            None => return (None, text.to_string()),
        }
    };
    match body.find(CLOSE) {
        Some(end) => (
            Some(trim_block(&body[..end]).to_string()),
            body[end + CLOSE.len()..].trim_start().to_string(),
        ),
        None => (Some(trim_block(body).to_string()), String::new()),
    }
}

/// A block's text less the newlines templates put inside its tags.
fn trim_block(s: &str) -> &str {
    s.trim_matches('\n')
}

/// Where a streaming reply is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Only whitespace so far: a `<think>` may still open the reply.
    Start,
    Reasoning,
    /// The block closed: whitespace before the answer is dropped.
    AfterBlock,
    Answer,
}

/// One streaming reply's reasoning split: each piece gives the reasoning
/// and the answer text it makes known. What went out, joined, is what
/// [`split`] gives for the whole reply.
#[derive(Debug)]
pub struct ThinkStream {
    phase: Phase,
    /// Text not yet decided (a partial tag, or whitespace that may be
    /// trimmed).
    held: String,
    /// The reasoning handed out so far (to trim its end at the close).
    reasoning_sent: bool,
}

/// What one piece made known.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ThinkDelta {
    pub reasoning: String,
    pub answer: String,
}

impl ThinkStream {
    /// `open`: the prompt opened the block ([`prompt_opens`]).
    pub fn new(open: bool) -> Self {
        Self {
            phase: if open { Phase::Reasoning } else { Phase::Start },
            held: String::new(),
            reasoning_sent: false,
        }
    }

    /// Take the next piece.
    pub fn push(&mut self, piece: &str) -> ThinkDelta {
        self.held.push_str(piece);
        let mut out = ThinkDelta::default();
        loop {
            let before = (self.phase, self.held.len());
            match self.phase {
                Phase::Start => self.start(&mut out),
                Phase::Reasoning => self.reasoning(&mut out),
                Phase::AfterBlock => {
                    let t = self.held.trim_start().to_string();
                    if !t.is_empty() {
                        self.phase = Phase::Answer;
                    }
                    self.held = t;
                }
                Phase::Answer => {
                    out.answer.push_str(&std::mem::take(&mut self.held));
                }
            }
            if (self.phase, self.held.len()) == before {
                return out;
            }
        }
    }

    /// The reply ended: what was held back.
    pub fn finish(mut self) -> ThinkDelta {
        let mut out = ThinkDelta::default();
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Start | Phase::Answer => out.answer = held,
            Phase::AfterBlock => {}
            Phase::Reasoning => {
                let r = if self.reasoning_sent {
                    held.trim_end_matches('\n')
                } else {
                    trim_block(&held)
                };
                out.reasoning = r.to_string();
            }
        }
        out
    }

    fn start(&mut self, out: &mut ThinkDelta) {
        let t = self.held.trim_start();
        if let Some(rest) = t.strip_prefix(OPEN) {
            self.held = rest.to_string();
            self.phase = Phase::Reasoning;
        } else if !OPEN.starts_with(t) {
            out.answer.push_str(&std::mem::take(&mut self.held));
            self.phase = Phase::Answer;
        }
    }

    fn reasoning(&mut self, out: &mut ThinkDelta) {
        if !self.reasoning_sent {
            // The newlines after the opening tag are no part of it.
            let t = self.held.trim_start_matches('\n');
            if t.is_empty() {
                return;
            }
            self.held = t.to_string();
        }
        if let Some(end) = self.held.find(CLOSE) {
            let r = self.held[..end].trim_end_matches('\n').to_string();
            self.reasoning_sent |= !r.is_empty();
            out.reasoning.push_str(&r);
            self.held.drain(..end + CLOSE.len());
            self.phase = Phase::AfterBlock;
            return;
        }
        // Hold a partial close tag and trailing newlines (trimmed at the close).
        let hold = partial_marker(&self.held, CLOSE);
        let keep = self.held[..self.held.len() - hold]
            .trim_end_matches('\n')
            .len();
        if keep > 0 {
            out.reasoning.push_str(&self.held[..keep]);
            self.reasoning_sent = true;
            self.held.drain(..keep);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `text` streamed in pieces of the given sizes: the reasoning and the
    /// answer handed out, joined.
    fn streamed(text: &str, open: bool, sizes: &[usize]) -> (String, String) {
        let mut s = ThinkStream::new(open);
        let (mut r, mut a) = (String::new(), String::new());
        let mut at = 0;
        for size in sizes.iter().cycle() {
            if at >= text.len() {
                break;
            }
            let mut end = (at + size).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            let d = s.push(&text[at..end]);
            assert!(
                d.reasoning.is_empty() || a.is_empty(),
                "no reasoning after the answer began: {text:?}"
            );
            r.push_str(&d.reasoning);
            a.push_str(&d.answer);
            at = end;
        }
        let d = s.finish();
        r.push_str(&d.reasoning);
        a.push_str(&d.answer);
        (r, a)
    }

    #[test]
    fn a_reply_opening_with_think_splits_and_other_text_is_answer() {
        let (r, a) = split("<think>\nHmm.\n</think>\n\nHello", false);
        assert_eq!((r.as_deref(), a.as_str()), (Some("Hmm."), "Hello"));
        let (r, a) = split("Hmm.\n</think>\n\nHello", true);
        assert_eq!((r.as_deref(), a.as_str()), (Some("Hmm."), "Hello"));
        let (r, a) = split("Say <think> to think.", false);
        assert_eq!((r, a.as_str()), (None, "Say <think> to think."));
        // Cut while thinking: all reasoning, no answer.
        let (r, a) = split("<think>still go", false);
        assert_eq!((r.as_deref(), a.as_str()), (Some("still go"), ""));
    }

    #[test]
    fn a_prompt_ending_inside_think_opens_the_reply() {
        assert!(prompt_opens("<|assistant|><think>"));
        assert!(prompt_opens("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!prompt_opens("<|im_start|>assistant\n"));
    }

    #[test]
    fn reasoning_streams_before_the_answer_as_it_comes() {
        let mut s = ThinkStream::new(false);
        assert_eq!(s.push("<thi"), ThinkDelta::default());
        let d = s.push("nk>\nI will");
        assert_eq!((d.reasoning.as_str(), d.answer.as_str()), ("I will", ""));
        let d = s.push(" greet.\n</th");
        assert_eq!(d.reasoning, " greet.");
        let d = s.push("ink>\n\nHi");
        assert_eq!((d.reasoning.as_str(), d.answer.as_str()), ("", "Hi"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn streamed_in_random_pieces_splits_as_whole(
            sizes in proptest::collection::vec(1usize..9, 1..8),
            lead in "[ \n]{0,2}",
            open_tag in proptest::bool::ANY,
            thought in "[a-z\n<>/]{0,16}",
            answer in "[a-z \n<>/]{0,12}",
        ) {
            let text = if open_tag {
                format!("{lead}<think>\n{thought}\n</think>\n\n{answer}")
            } else {
                format!("{thought}</think>{answer}")
            };
            let open = !open_tag;
            let (r, a) = split(&text, open);
            let (sr, sa) = streamed(&text, open, &sizes);
            prop_assert_eq!(sr, r.unwrap_or_default(), "{:?}", text);
            prop_assert_eq!(sa, a, "{:?}", text);
        }
    }
}

//! The formats by name, and the one table that says which a chat template
//! writes and which file reads it: each row names a format, the markers a
//! template's Jinja source holds when it asks for calls that way, and the
//! format's [`Syntax`]. Adding a format is a new file implementing
//! [`Syntax`] and one row here.

use super::harmony::Harmony;
use super::invoke::{DSML, MINIMAX};
use super::mistral::{JsonList, Mistral};
use super::pythonic::Pythonic;
use super::sections::{DeepSeek, Kimi};
#[cfg(test)]
use super::syntax::Frame;
use super::syntax::Syntax;
use super::tagged::{Glm, Hermes, Plain, XmlFunction, OPEN};

/// The enum of format names and the table of their rows, in one list: a
/// row's place in the table is its name's discriminant.
macro_rules! formats {
    ($($(#[$attr:meta])* $name:ident => $syntax:path, if_source_has [$($marker:expr),*];)*) => {
        /// How a template asks the model to write tool calls.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub enum CallFormat {
            $($(#[$attr])* $name,)*
        }

        /// Each format's row, in the order a template's source is tried:
        /// the first whose markers the source all holds is its format.
        const TABLE: &[(CallFormat, &[&str], &dyn Syntax)] = &[
            $((CallFormat::$name, &[$($marker),*], &$syntax),)*
        ];
    };
}

formats! {
    /// gpt-oss's harmony channels, calls addressed `to=functions.NAME`.
    Harmony => Harmony, if_source_has ["<|channel|>", "<|call|>"];
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:N..`.
    Kimi => Kimi, if_source_has ["<|tool_calls_section_begin|>"];
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}..`.
    DeepSeek => DeepSeek, if_source_has ["tool▁calls▁begin"];
    /// `<｜DSML｜function_calls><｜DSML｜invoke name=..>..`.
    Dsml => DSML, if_source_has ["DSML", "function_calls"];
    /// `<minimax:tool_call><invoke name=..><parameter name=..>V</parameter></invoke>..`.
    MiniMax => MINIMAX, if_source_has ["<minimax:tool_call>"];
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.
    Glm => Glm, if_source_has [OPEN, "<arg_key>"];
    /// `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`.
    XmlFunction => XmlFunction, if_source_has [OPEN, "<function="];
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
    Hermes => Hermes, if_source_has [OPEN];
    /// `<TOOLCALL>[{"name": .., "arguments": {..}}]</TOOLCALL>`.
    JsonList => JsonList, if_source_has ["<TOOLCALL>"];
    /// `[TOOL_CALLS][{..}]` or `[TOOL_CALLS]NAME[ARGS]{..}`.
    Mistral => Mistral, if_source_has ["[TOOL_CALLS]"];
    /// `<|tool_call_start|>[f(a='x')]<|tool_call_end|>`.
    Pythonic => Pythonic, if_source_has ["<|tool_call_start|>"];
    /// Calls are not parsed: the reply is text.
    #[default]
    None => Plain, if_source_has [];
}

impl CallFormat {
    /// The format a chat template's Jinja source writes calls in.
    pub fn detect(source: &str) -> Self {
        TABLE
            .iter()
            .find(|(_, markers, _)| markers.iter().all(|m| source.contains(m)))
            .map_or(Self::None, |(format, _, _)| *format)
    }

    /// What reads and writes this format's calls.
    pub(crate) fn syntax(self) -> &'static dyn Syntax {
        TABLE[self as usize].2
    }

    /// The markers around a block of calls (none for harmony and `None`;
    /// the tests cut replies at them).
    #[cfg(test)]
    pub(crate) fn frame(self) -> Option<Frame> {
        self.syntax().frame()
    }

    /// Whether the reply must be detokenized with its special tokens as
    /// text for its calls to be seen: the formats whose markers are control
    /// tokens of their models (harmony always, the others when the request
    /// offered tools).
    pub fn special_text(self, tools_offered: bool) -> bool {
        self.syntax().special_text(tools_offered)
    }

    /// A short name for notes and logs.
    pub fn name(self) -> &'static str {
        self.syntax().name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name's row is its own (the table is indexed by discriminant).
    #[test]
    fn each_format_is_its_own_row() {
        for (i, (format, _, _)) in TABLE.iter().enumerate() {
            assert_eq!(*format as usize, i);
        }
        let names: std::collections::HashSet<_> = TABLE.iter().map(|r| r.2.name()).collect();
        assert_eq!(names.len(), TABLE.len());
    }
}

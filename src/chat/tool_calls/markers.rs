//! Text that could be the start of a marker, held back while a reply
//! streams until the next piece decides. A leaf: it names no other file.

/// Bytes at the end of `text` that could be the start of `marker` (0 when
/// none): text to hold back until the next piece decides.
pub(crate) fn partial_marker(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| {
            // Markers are not all ASCII (DeepSeek's `｜`, `▁`): both cuts on
            // char boundaries.
            marker.is_char_boundary(k)
                && text.is_char_boundary(text.len() - k)
                && text.ends_with(&marker[..k])
        })
        .unwrap_or(0)
}

/// Bytes at the end of `text` that could start any of `markers`.
pub(crate) fn held_for_any(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| partial_marker(text, m))
        .max()
        .unwrap_or(0)
}

/// A value's text with `marker` possibly starting at its end held back.
pub(crate) fn held(value: &str, marker: &str) -> String {
    value[..value.len() - partial_marker(value, marker)].to_string()
}

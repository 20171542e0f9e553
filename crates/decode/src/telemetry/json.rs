//! The little JSON the telemetry writes: string literals and flat objects.

/// A JSON string literal for `s`.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `{"k":v,...}` from key/value pairs: a value that is already JSON (a
/// number, `null`, `true`, `false`, a string literal) is written as it is,
/// anything else (`NA`, an empty value) as a string, so the object is valid.
pub fn json_object(pairs: &[(String, String)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}:{}", json_string(k), json_value(v)))
        .collect();
    format!("{{{}}}", body.join(","))
}

fn json_value(v: &str) -> String {
    let number = v.starts_with(|c: char| c == '-' || c.is_ascii_digit())
        && v.ends_with(|c: char| c.is_ascii_digit())
        && v.parse::<f64>().is_ok_and(f64::is_finite);
    let literal = matches!(v, "null" | "true" | "false");
    let string = v.len() >= 2 && v.starts_with('"') && v.ends_with('"');
    if number || literal || string {
        v.to_string()
    } else {
        json_string(v)
    }
}

//! What a request holds its reply to: JSON valid against a schema
//! (`response_format` on the chat route, `text.format` on the Responses
//! route) or a tool call in the template's own format (`tool_choice`
//! `required` or a named function, Anthropic's `any` and `tool`; under
//! `auto` a lazy grammar that wakes where a call opens). Turned into a
//! llama.cpp grammar for the sampler; a schema llama.cpp's converter refuses
//! is a 400 naming the part refused, checked when the request is read.

use serde_json::{json, Value};

use super::error::ApiError;
use super::job::{Constraint, JobSpec, PromptSpec};
use crate::chat::tool_calls::CallFormat;
use crate::chat::tool_grammar::{call_grammar, ToolChoice};
use crate::llama::{Grammar, GrammarError};

impl Constraint {
    /// The constraint of a reply to `tools` (None: not offered) under
    /// `choice`, with `format` (a JSON schema) asked for: a forced call wins
    /// over the format, the format over a lazy call.
    pub(crate) fn of(choice: ToolChoice, tools_offered: bool, format: Self) -> Self {
        match (tools_offered, choice, format) {
            (true, c @ (ToolChoice::Required | ToolChoice::Named(_)), _) => Self::Calls(c),
            (_, _, f @ Self::Json { .. }) => f,
            (true, ToolChoice::Auto, _) => Self::Calls(ToolChoice::Auto),
            _ => Self::None,
        }
    }

    /// The grammar for `spec`'s reply under a template writing calls in
    /// `format`; None: unconstrained. A lazy grammar whose tools' schemas do
    /// not convert is left out (the reply is parsed as before).
    pub(crate) fn grammar(spec: &JobSpec, format: CallFormat) -> Result<Option<Grammar>, ApiError> {
        let tools = match &spec.prompt {
            PromptSpec::Chat { tools, .. } => tools.as_ref(),
            PromptSpec::Text(_) => None,
        };
        let grammar = match (&spec.constraint, tools) {
            (Self::None, _) | (Self::Calls(_), None) => return Ok(None),
            (Self::Json { schema, param }, _) => {
                Grammar::json(schema).map_err(|e| ApiError::invalid(Some(*param), e.to_string()))?
            }
            (Self::Calls(choice), Some(tools)) => match call_grammar(format, tools, choice) {
                Ok(g) => g,
                Err(e) if *choice == ToolChoice::Auto && !e.refused_everywhere() => {
                    tracing::info!("tool calls not constrained under auto: {e}");
                    return Ok(None);
                }
                Err(e) => return Err(ApiError::invalid(Some("tools"), e.to_string())),
            },
        };
        if let Err(e) = grammar.bounded() {
            let param: &'static str = match &spec.constraint {
                Self::Json { param, .. } => param,
                Self::Calls(ToolChoice::Auto) => {
                    tracing::info!("tool calls not constrained under auto: {e}");
                    return Ok(None);
                }
                _ => "tools",
            };
            return Err(ApiError::invalid(Some(param), e.to_string()));
        }
        spec.constraint.parsed(grammar)
    }

    /// `grammar` once llama.cpp parses it. A schema that passed the check
    /// can still exceed llama.cpp's bound on rules times repetitions (a 400
    /// on the field); under `auto` the calls are left unconstrained.
    fn parsed(&self, grammar: Grammar) -> Result<Option<Grammar>, ApiError> {
        let param: &'static str = match self {
            Self::Json { param, .. } => param,
            _ => "tools",
        };
        match grammar.check() {
            Ok(()) => Ok(Some(grammar)),
            Err(e) if *self == Self::Calls(ToolChoice::Auto) => {
                tracing::warn!("tool calls not constrained under auto: {e}");
                Ok(None)
            }
            Err(e @ GrammarError::Parse(_)) => {
                tracing::warn!("a schema's grammar refused by llama.cpp: {e}");
                Err(ApiError::invalid(
                    Some(param),
                    format!("{param}: llama.cpp refuses the grammar built from the schema: it exceeds llama.cpp's bound on rules times repetitions; lower maxItems, maxLength or a pattern's counts"),
                ))
            }
            Err(e) => Err(ApiError::server(&e.to_string())),
        }
    }

    /// A 400 now for a request whose constraint cannot be built (the
    /// schemas do not depend on the template's format).
    pub(crate) fn check(spec: &JobSpec) -> Result<(), ApiError> {
        Self::grammar(spec, CallFormat::Hermes).map(drop)
    }
}

/// OpenAI's `response_format` (`text.format` on the Responses route, whose
/// `json_schema` fields sit beside `type`): the JSON constraint it asks
/// for, [`Constraint::None`] for text. `param` names the field in errors.
pub(crate) fn response_format(
    v: Option<&Value>,
    param: &'static str,
) -> Result<Constraint, ApiError> {
    let shape = || {
        ApiError::invalid(
            Some(param),
            format!("{param}: give {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {{\"type\": \"json_schema\", \"json_schema\": {{\"name\": ..., \"schema\": {{...}}}}}}"),
        )
    };
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Constraint::None);
    };
    let schema = match v.get("type").and_then(Value::as_str).ok_or_else(shape)? {
        "text" => return Ok(Constraint::None),
        "json_object" => json!({"type": "object"}),
        "json_schema" => {
            let holder = v.get("json_schema").unwrap_or(v);
            match holder.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(_) => {
                    return Err(ApiError::invalid(
                        Some(param),
                        format!("{param}: the json_schema's schema must be a JSON Schema object"),
                    ))
                }
            }
        }
        _ => return Err(shape()),
    };
    Ok(Constraint::Json { schema, param })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_formats_become_a_schema_or_nothing() {
        let f = |v: Value| response_format(Some(&v), "response_format");
        assert_eq!(f(json!({"type": "text"})), Ok(Constraint::None));
        let object = Constraint::Json {
            schema: json!({"type": "object"}),
            param: "response_format",
        };
        assert_eq!(f(json!({"type": "json_object"})), Ok(object));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let chat = f(json!({"type": "json_schema",
            "json_schema": {"name": "x", "strict": true, "schema": schema}}));
        let responses = f(json!({"type": "json_schema", "name": "x", "schema": schema}));
        assert_eq!(chat, responses);
        assert!(matches!(chat, Ok(Constraint::Json { schema: s, .. }) if s == schema));
        for bad in [
            json!({"type": "xml"}),
            json!("json"),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            let e = f(bad).unwrap_err();
            assert_eq!(e.param(), Some("response_format"), "{}", e.message);
        }
    }

    #[test]
    fn a_forced_call_wins_over_a_format_which_wins_over_auto() {
        let json = || Constraint::Json {
            schema: json!({}),
            param: "response_format",
        };
        let required = Constraint::of(ToolChoice::Required, true, json());
        assert_eq!(required, Constraint::Calls(ToolChoice::Required));
        assert_eq!(Constraint::of(ToolChoice::Auto, true, json()), json());
        let auto = Constraint::of(ToolChoice::Auto, true, Constraint::None);
        assert_eq!(auto, Constraint::Calls(ToolChoice::Auto));
        let no_tools = Constraint::of(ToolChoice::Required, false, Constraint::None);
        assert_eq!(no_tools, Constraint::None);
    }
}

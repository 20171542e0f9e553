//! Tests of `template` (beside it to keep that file on its one topic).
use super::*;

#[test]
fn renders_messages_options_and_python_methods() {
    let t = ChatTemplate::new(
        Some(
            "{{ bos_token }}{% for m in messages %}[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}\
             {% if add_generation_prompt %}[ASSISTANT]{% endif %}{% if enable_thinking %} think{% endif %}\
             {% if tools is none %} no-tools{% endif %}"
                .into(),
        ),
        "<s>",
        "</s>",
    );
    let mut opts = TemplateOptions::new();
    opts.insert("enable_thinking".into(), true.into());
    let msgs = [
        Message::new("system", " be brief "),
        Message::new("user", "hi"),
    ];
    let out = t
        .render_jinja(
            t.source.as_deref().unwrap(),
            &ChatInput::messages(&msgs, &opts),
        )
        .unwrap();
    assert_eq!(
        out,
        "<s>[SYSTEM] be brief\n[USER] hi\n[ASSISTANT] think no-tools"
    );
}

#[test]
fn fields_beyond_role_and_content_reach_the_template() {
    let t = ChatTemplate::new(
        Some("{% for m in messages %}{{ m.tool_call_id }}{% endfor %}".into()),
        "",
        "",
    );
    let mut m = Message::new("tool", "18C");
    m.extra.insert("tool_call_id".into(), "call_1".into());
    let opts = TemplateOptions::new();
    let out = t
        .render_jinja(
            t.source.as_deref().unwrap(),
            &ChatInput::messages(&[m], &opts),
        )
        .unwrap();
    assert_eq!(out, "call_1");
}

/// Renders with the template's own Jinja (no model needed).
fn jinja(t: &ChatTemplate) -> impl Fn(&ChatInput) -> Result<Rendered, TemplateError> + '_ {
    |i| {
        Ok(Rendered {
            text: t.render_jinja(t.source.as_deref().unwrap(), i)?,
            source: TemplateSource::Jinja,
        })
    }
}

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}\
     {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[test]
fn a_last_assistant_message_is_continued_not_closed() {
    let t = ChatTemplate::new(Some(CHATML.into()), "", "");
    let opts = TemplateOptions::new();
    let msgs = [
        Message::new("user", "Why is the sky blue?"),
        Message::new("assistant", "The sky is "),
    ];
    assert!(continues_last(&msgs));
    let out = continuing(&ChatInput::messages(&msgs, &opts), jinja(&t)).unwrap();
    assert_eq!(
        out.text,
        "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\nThe sky is ",
        "no end of turn, no new turn, the text as given (its space kept)"
    );
}

#[test]
fn a_template_that_changes_the_text_is_continued_the_llama_server_way() {
    // Drops every assistant message's text: the mark never shows.
    let t = ChatTemplate::new(
        Some(
            "{% for m in messages %}[{{ m.role }}]{% if m.role != 'assistant' %}{{ m.content }}{% endif %}\n{% endfor %}\
             {% if add_generation_prompt %}[assistant]{% endif %}"
                .into(),
        ),
        "",
        "",
    );
    let opts = TemplateOptions::new();
    let msgs = [Message::new("user", "hi"), Message::new("assistant", "Hel")];
    let out = continuing(&ChatInput::messages(&msgs, &opts), jinja(&t)).unwrap();
    assert_eq!(out.text, "[user]hi[assistant]Hel");
}

#[test]
fn only_a_last_assistant_message_without_calls_is_continued() {
    let mut call = Message::new("assistant", "");
    call.extra
        .insert("tool_calls".into(), serde_json::json!([{"id": "c"}]));
    assert!(!continues_last(&[Message::new("user", "hi")]));
    assert!(!continues_last(&[Message::new("user", "hi"), call]));
    assert!(!continues_last(&[]));
}

/// Issue 64, finding 9: `-v` shows at most 16 KiB of a rendered prompt,
/// cut at a character's boundary.
#[test]
fn the_log_shows_a_prompts_first_16_kib() {
    let long = "é".repeat(20_000);
    let head = super::log_head(&long);
    assert!(head.len() <= 16 * 1024 && head.len() > 16 * 1024 - 2);
    assert!(long.starts_with(head));
    assert_eq!(super::log_head("short"), "short");
}

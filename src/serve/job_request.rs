//! A queued job turned into the engine's request: its prompt rendered and
//! tokenized, bounded by the context, constrained by its grammar, and its
//! start told to the client (or the error it is answered with).

use axum::http::StatusCode;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::job::{Constraint, Event, Job, Started};
use super::job_prompt::prompt_of;
use super::metrics as m;
use super::sink::JobSink;
use super::split::ReplySplit;
use crate::chat::ChatTemplate;
use crate::engine::Session;
use crate::generate::{Limit, Options, Request};

/// Tokenize and bound one job (None: a job that only counts its prompt's
/// tokens, answered); its events sender back when it cannot run.
pub(super) fn request_of(
    session: &Session,
    template: &ChatTemplate,
    job: Job,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<Request<JobSink>>, (ApiError, mpsc::Sender<Event>)> {
    // A client that went away, or a signal, stops its template's render.
    let events = &job.events;
    let cancelled = || {
        if events.is_closed() {
            Some("the client went away")
        } else {
            crate::interrupt::requested().map(|_| "the server is stopping")
        }
    };
    let (prompt, mut notes, reasoning_open) =
        match prompt_of(session, template, &job.spec.prompt, &cancelled) {
            Ok(p) => p,
            Err(e) => return Err((e, job.events)),
        };
    if job.spec.count_only {
        let _ = job.events.blocking_send(Event::Started(Started {
            prompt_tokens: prompt.len(),
            max_tokens: 0,
            reasoning_open,
            calls_held: false,
        }));
        return Ok(None);
    }
    let n_ctx = session.n_ctx() as usize;
    if prompt.len() >= n_ctx {
        return Err((ApiError::over_context(prompt.len(), n_ctx), job.events));
    }
    let grammar = match Constraint::grammar(&job.spec, template.call_format()) {
        Ok(g) if reasoning_open => g.map(crate::chat::tool_grammar::after_open_reasoning),
        Ok(g) => g,
        Err(e) => return Err((e, job.events)),
    };
    let n_predict = reply_room(job.spec.max_tokens, n_ctx, prompt.len(), &mut notes);
    if job
        .events
        .blocking_send(Event::Started(Started {
            prompt_tokens: prompt.len(),
            max_tokens: n_predict,
            reasoning_open,
            calls_held: grammar.is_some() && matches!(job.spec.constraint, Constraint::Calls(_)),
        }))
        .is_err()
    {
        m::cancelled();
        let e = ApiError::new(StatusCode::BAD_REQUEST, "cancelled", "the client went away");
        return Err((e, job.events));
    }
    let json_schema = grammar.is_some() && matches!(job.spec.constraint, Constraint::Json { .. });
    let opts = Options {
        grammar,
        limit: Limit {
            n_predict,
            ignore_eos: false,
        },
        sampling: job.spec.sampling.clone(),
        stop: job.spec.stop.clone(),
        special_text: ReplySplit::of(&job.spec, template.call_format()).special_text(),
        ..Options::default()
    };
    let scope = job.scope;
    let mut sink = JobSink::new(job.events, runtime.clone(), notes, job.spec.requester);
    sink.span = job.span;
    sink.stop = job.spec.stop;
    sink.json_schema = json_schema;
    Ok(Some(Request {
        prompt,
        opts,
        sink,
        scope,
    }))
}

/// The most tokens a reply may have: the request's `max_tokens` (none: what
/// the context leaves), capped to what the context leaves with a note.
fn reply_room(asked: Option<u32>, n_ctx: usize, prompt: usize, notes: &mut Vec<String>) -> u32 {
    let room = (n_ctx - prompt) as u32;
    match asked {
        Some(n) if n > room => {
            notes.push(format!(
                "max_tokens {n} capped to {room}: the context holds {n_ctx} tokens and the prompt takes {prompt}"
            ));
            room
        }
        Some(n) => n,
        None => room,
    }
}

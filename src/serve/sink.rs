//! A job's way back to its request. The engine thread never waits on a
//! client: text the request's channel has no room for is held (at most one
//! generation's text, which the context bounds) and goes with the next
//! piece; the last events, when the channel is full, go on a task of the
//! server's runtime that waits for the client (or its leaving).

use std::time::Instant;

use tokio::sync::mpsc::{self, error::TrySendError};

use super::job::Event;
use crate::generate::GenerationSink;

/// Sends a job's text to its request; a closed channel (the client went
/// away) or a signal stops its generation at the next token.
pub(crate) struct JobSink {
    events: mpsc::Sender<Event>,
    runtime: tokio::runtime::Handle,
    /// Text the channel had no room for yet, oldest first.
    held: String,
    gone: bool,
    pub(crate) notes: Vec<String>,
    pub(crate) requester: String,
    pub(crate) t0: Instant,
    /// When the first piece of text came (time to first token).
    first_text: Option<Instant>,
    /// The request's stop strings (to say which one ended the text).
    pub(crate) stop: Vec<String>,
    /// A grammar holds the reply to a JSON schema (a cut reply says so).
    pub(crate) json_schema: bool,
    /// The request's span (see `Job::span`).
    pub(crate) span: tracing::Span,
}

impl JobSink {
    pub(crate) fn new(
        events: mpsc::Sender<Event>,
        runtime: tokio::runtime::Handle,
        notes: Vec<String>,
        requester: String,
    ) -> Self {
        Self {
            events,
            runtime,
            held: String::new(),
            gone: false,
            notes,
            requester,
            t0: Instant::now(),
            first_text: None,
            stop: Vec::new(),
            json_schema: false,
            span: tracing::Span::none(),
        }
    }

    /// Whether the client went away.
    pub(crate) fn gone(&self) -> bool {
        self.gone
    }

    /// Milliseconds from the job's start to its first text (None: no text).
    pub(crate) fn first_text_ms(&self) -> Option<u64> {
        self.first_text
            .map(|t| t.duration_since(self.t0).as_millis() as u64)
    }

    /// Bytes of text waiting for room in the channel.
    #[cfg(test)]
    fn held_bytes(&self) -> u64 {
        self.held.len() as u64
    }

    /// Send the held text and then `last` without blocking: what does not fit
    /// now is sent by a task that waits for the client.
    pub(crate) fn finish(mut self, last: Event) {
        let mut queue = Vec::with_capacity(2);
        if !self.held.is_empty() {
            queue.push(Event::Text(std::mem::take(&mut self.held)));
        }
        queue.push(last);
        let mut queue = queue.into_iter();
        while let Some(event) = queue.next() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Closed(_)) => return,
                Err(TrySendError::Full(event)) => {
                    let events = self.events;
                    self.runtime.spawn(async move {
                        for e in std::iter::once(event).chain(queue) {
                            if events.send(e).await.is_err() {
                                return;
                            }
                        }
                    });
                    return;
                }
            }
        }
    }
}

impl GenerationSink for JobSink {
    fn text(&mut self, piece: &str) {
        if self.gone {
            return;
        }
        self.first_text.get_or_insert_with(Instant::now);
        self.held.push_str(piece);
        let text = std::mem::take(&mut self.held);
        match self.events.try_send(Event::Text(text)) {
            Ok(()) => {}
            Err(TrySendError::Full(Event::Text(text))) => self.held = text,
            Err(_) => self.gone = true,
        }
    }

    fn should_stop(&mut self) -> bool {
        self.gone = self.gone || self.events.is_closed();
        self.gone || crate::interrupt::requested().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::Done;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    fn done() -> Event {
        Event::Done(Box::new(Done {
            finish_reason: "stop",
            stop_sequence: None,
            prompt_tokens: 1,
            completion_tokens: 3,
            figures: Default::default(),
            notes: Vec::new(),
        }))
    }

    /// Every event in the channel until it closes: the texts joined, and
    /// whether a `Done` came last.
    async fn drain(mut rx: mpsc::Receiver<Event>) -> (String, bool) {
        let (mut text, mut done) = (String::new(), false);
        while let Some(e) = rx.recv().await {
            assert!(!done, "nothing follows Done");
            match e {
                Event::Text(t) => text.push_str(&t),
                Event::Done(_) => done = true,
                other => panic!("unexpected {other:?}"),
            }
        }
        (text, done)
    }

    #[test]
    fn a_client_that_does_not_read_never_blocks_the_engine_and_loses_nothing() {
        let rt = runtime();
        let (tx, rx) = mpsc::channel(1);
        let mut sink = JobSink::new(tx, rt.handle().clone(), Vec::new(), "a".into());
        for piece in ["one ", "two ", "three"] {
            sink.text(piece); // the channel holds one event: the rest is held
        }
        assert_eq!(sink.held_bytes(), "two three".len() as u64);
        assert!(!sink.should_stop());
        sink.finish(done()); // the channel is full: a task sends the rest
        let (text, done) = rt.block_on(drain(rx));
        assert_eq!(text, "one two three");
        assert!(done);
    }

    #[test]
    fn a_client_that_left_stops_the_generation() {
        let rt = runtime();
        let (tx, rx) = mpsc::channel(4);
        let mut sink = JobSink::new(tx, rt.handle().clone(), Vec::new(), "a".into());
        sink.text("hello");
        drop(rx);
        sink.text(" world");
        assert!(sink.gone());
        assert!(sink.should_stop());
        sink.finish(done()); // nowhere to go: dropped, no task left waiting
    }
}

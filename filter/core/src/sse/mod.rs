//! One reading of a streamed answer (server-sent events) as it passes: the
//! bytes are split into events once and each event's data is parsed once,
//! and that one reading feeds the usage the provider reported, the strip of
//! the usage chunk the filter asked for on the client's behalf, and the
//! cache's rebuilding of the answer.
//!
//! The layers, from the bytes up:
//! - [`reader::Reader`] splits bytes cut anywhere into [`Event`]s (an optional
//!   `event:` type and the joined `data:` lines), holding at most one event.
//! - A [`Grammar`] says what a dialect's events mean: which event carries the
//!   usage, which ends the stream, which is the usage-only event the filter
//!   asked for, and it parses each event's data, once: only the fields it
//!   needs, or the whole tree when a [`Collect`]or takes the event.
//!   This module knows no dialect: each gives its own grammar, and the
//!   picker over them, from the dialect module (`AnyGrammar`).
//! - A [`Collect`]or takes the parsed events of the answer (the cache's
//!   `StreamAssembler`), within its limit.
//! - [`Stream`] is one response's stream: the reader, its grammar and the
//!   strip, driving the collector the caller passes with each piece.

pub mod reader;
pub mod transcript;

use serde_json::Value;

pub use reader::{Event, Reader, MAX_EVENT};
pub use transcript::Transcript;

use crate::usage::{Usage, MAX_FINISH_REASONS};

/// Longest incomplete event the strip holds back from the client; past it
/// the stream passes as it is from there on.
pub const MAX_HELD_EVENT: usize = 256 * 1024;

/// The event grammar of one API dialect's stream. A grammar reads its
/// events its own way and keeps what every stream says in one
/// [`StreamState`]; what is asked of that is answered here, once.
pub trait Grammar {
    /// Reads one event. `parse`: a collector takes the event, so its data
    /// is parsed into a whole tree (and read from there), once.
    fn read(&mut self, event: &Event<'_>, parse: bool) -> Reading;
    /// What the stream said so far.
    fn state(&self) -> &StreamState;
    /// What the stream said so far, to keep more of it.
    fn state_mut(&mut self) -> &mut StreamState;
    /// The tokens the stream reported so far.
    fn usage(&self) -> Option<Usage> {
        self.state().usage
    }
    /// The stream's final event passed: nothing after it is the answer's.
    fn ended(&self) -> bool {
        self.state().done
    }
    /// The stream finished its answer: a choice or the response completed,
    /// or the message gave its stop reason and then stopped.
    fn finished(&self) -> bool {
        self.state().finished
    }
    /// Why the answer ended, as the stream said so far.
    fn finish_reasons(&self) -> &FinishReasons {
        &self.state().reasons
    }
    /// From now on, keeps the answer's text, at most `limit` bytes
    /// (`tracing.capture.completion`).
    fn keep_text(&mut self, limit: usize) {
        self.state_mut()
            .transcript
            .get_or_insert_with(|| Transcript::new(limit));
    }
    /// The answer's text kept so far, when asked.
    fn transcript(&self) -> Option<&Transcript> {
        self.state().transcript.as_ref()
    }
    /// The id of the response a later call may continue, when the stream
    /// gave one (OpenAI Responses).
    fn response_id(&self) -> Option<&str> {
        None
    }
}

/// What a stream said so far, whatever its dialect: each grammar keeps
/// these as its events say them, and only what is its own beside them.
#[derive(Debug, Default)]
pub struct StreamState {
    /// The tokens reported so far.
    pub usage: Option<Usage>,
    /// The answer is whole: a choice or a candidate gave its finish reason,
    /// the response completed, the message stopped after its stop reason.
    pub finished: bool,
    /// Why it ended, in the order the stream said it.
    pub reasons: FinishReasons,
    /// The final event passed (`[DONE]`, the final response, `message_stop`
    /// or an error, the last candidate's end).
    pub done: bool,
    /// The answer's text, when kept.
    pub transcript: Option<Transcript>,
}

impl StreamState {
    /// Takes in a usage that reports the call's so far: a later count
    /// replaces an earlier one, a count it leaves out stays (Anthropic's
    /// split over its events, Gemini's on each).
    pub(crate) fn update_usage(&mut self, usage: Usage) {
        self.usage = Some(self.usage.map_or(usage, |so_far| so_far.updated_by(usage)));
    }
}

/// Most bytes kept of one finish reason (they are short words).
pub const MAX_REASON_BYTES: usize = 64;

/// Why a stream's answer ended, as its events said (a chat choice's
/// `finish_reason`, the final response's status or incomplete reason, a
/// message's `stop_reason`): at most [`MAX_FINISH_REASONS`], each cut to
/// [`MAX_REASON_BYTES`], so no stream grows what its call holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FinishReasons(Vec<String>);

impl FinishReasons {
    /// Keeps `reason` while there is room; an empty one says nothing.
    pub(crate) fn push(&mut self, reason: &str) {
        if reason.is_empty() || self.0.len() >= MAX_FINISH_REASONS {
            return;
        }
        let mut end = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        self.0
            .push(reason.get(..end).unwrap_or_default().to_string());
    }

    /// The reasons, in the order the stream gave them.
    pub fn as_strs(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }
}

/// What one event turned out to be.
#[derive(Debug, Default)]
pub struct Reading {
    /// It carries only the usage the filter asks for on a client's behalf.
    pub usage_only: bool,
    /// Its data, when a collector asked for it.
    pub parsed: Parsed,
}

/// An event's data as a collector gets it.
#[derive(Debug, Default)]
pub enum Parsed {
    /// Not asked for, or nothing to collect (no data, the final event).
    #[default]
    Skipped,
    /// The data's tree.
    Tree(Value),
    /// The data is not JSON.
    NotJson,
}

impl Parsed {
    /// What `read` made of an event's data: `None` when no collector asked
    /// for it, else its tree or `None` when it is not JSON.
    pub(crate) fn of(tree: Option<Option<Value>>) -> Self {
        match tree {
            Some(Some(t)) => Self::Tree(t),
            Some(None) => Self::NotJson,
            None => Self::Skipped,
        }
    }
}

/// An event's data parsed into a tree, when a collector takes it.
pub(crate) fn tree_of(data: &[u8], parse: bool) -> Option<Option<Value>> {
    parse.then(|| serde_json::from_slice::<Value>(data).ok())
}

/// Takes the answer's events, parsed (the cache's stream assembler).
pub trait Collect {
    /// Most bytes of one event's data it takes.
    fn limit(&self) -> usize;
    /// False once it gave up: nothing more is parsed for it.
    fn wants(&self) -> bool;
    /// The next piece of the answer.
    fn take(&mut self, piece: Piece);
}

/// One piece of the answer, as a collector gets it.
#[derive(Debug)]
pub enum Piece {
    /// An event's data.
    Chunk(Value),
    /// An event whose data is not JSON.
    NotJson,
    /// An event longer than the collector's limit.
    TooLarge,
    /// The stream's final event: the answer is all there.
    End,
}

/// One response's stream, read as it passes.
#[derive(Debug, Default)]
pub struct Stream<G> {
    reader: Reader,
    grammar: G,
    strip: Option<Strip>,
    /// Events with data read so far.
    events: u64,
}

/// Holds back the bytes of the event under way until its end shows whether
/// it is the usage-only event to remove.
#[derive(Debug, Default)]
struct Strip {
    held: Vec<u8>,
    /// An event outgrew [`MAX_HELD_EVENT`]: everything passes from there on.
    off: bool,
    removed: u32,
}

impl<G: Grammar + Default> Stream<G> {
    /// A stream at its start.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<G: Grammar> Stream<G> {
    /// A stream at its start, read with `grammar`.
    pub fn with_grammar(grammar: G) -> Self {
        Self {
            reader: Reader::default(),
            grammar,
            strip: None,
            events: 0,
        }
    }
}

impl<G: Grammar> Stream<G> {
    /// From now on, removes the usage-only event the filter asked the
    /// provider for on behalf of a client that did not: that client must see
    /// the stream it would have seen. Events pass whole; the bytes of an
    /// incomplete one wait for its end (bounded by [`MAX_HELD_EVENT`]).
    pub fn strip_usage(&mut self) {
        self.strip.get_or_insert_with(Strip::default);
    }

    /// Usage-only events removed.
    pub fn removed(&self) -> u32 {
        self.strip.as_ref().map_or(0, |s| s.removed)
    }

    /// The tokens the stream reported so far.
    pub fn usage(&self) -> Option<Usage> {
        self.grammar.usage()
    }

    /// Events with data read so far (about one output token each, for the
    /// providers' streams).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes the reader holds for the event under way.
    pub fn pending(&self) -> usize {
        self.reader.pending()
    }

    /// What the grammar read so far.
    pub fn grammar(&self) -> &G {
        &self.grammar
    }

    /// From now on, keeps the answer's text, at most `limit` bytes.
    pub fn keep_text(&mut self, limit: usize) {
        self.grammar.keep_text(limit);
    }

    /// Reads the next piece of the stream (`end`: the last one), handing
    /// the answer's events to `collect`. Returns the bytes to pass on in its
    /// place when they differ (the strip removed or held some back).
    pub fn feed(
        &mut self,
        bytes: &[u8],
        end: bool,
        collect: Option<&mut dyn Collect>,
    ) -> Option<Vec<u8>> {
        let mut collect = collect.filter(|c| c.wants());
        // The reader holds what the collector may take, and never less than
        // the usage needs.
        let bound = collect
            .as_ref()
            .map_or(MAX_EVENT, |c| c.limit().max(MAX_EVENT));
        let Self {
            reader,
            grammar,
            strip,
            events,
        } = self;
        reader.set_bound(bound);
        let mut strip = strip.as_mut().filter(|s| !s.off);
        let mut out = strip.is_some().then(|| Vec::with_capacity(bytes.len()));
        let mut from = 0;
        let mut on = |event: Event<'_>| {
            *events += u64::from(event.data.is_some());
            let usage_only = read_event(grammar, &mut collect, &event);
            if let (Some(s), Some(out), Some(at)) = (strip.as_deref_mut(), out.as_mut(), event.end)
            {
                s.event_end(out, bytes.get(from..at).unwrap_or_default(), usage_only);
                from = at;
            }
        };
        reader.feed(bytes, &mut on);
        if end {
            reader.finish(&mut on);
        }
        if let Some(c) = collect.filter(|c| c.wants() && !grammar.ended()) {
            // An event under way already past the limit.
            if reader.pending() > c.limit() {
                c.take(Piece::TooLarge);
            }
        }
        let (Some(s), Some(mut out)) = (strip, out) else {
            return None;
        };
        s.rest(&mut out, bytes.get(from..).unwrap_or_default(), end);
        (out != bytes).then_some(out)
    }
}

impl Strip {
    /// An event ended, `tail` its bytes in this piece (the rest are held):
    /// they pass on unless it is the usage-only event.
    fn event_end(&mut self, out: &mut Vec<u8>, tail: &[u8], usage_only: bool) {
        if usage_only {
            self.removed = self.removed.saturating_add(1);
        } else {
            out.extend_from_slice(&self.held);
            out.extend_from_slice(tail);
        }
        self.held.clear();
    }

    /// The bytes of a piece after its last complete event: held back until
    /// the event ends, unless the stream ends or the event outgrows the bound.
    fn rest(&mut self, out: &mut Vec<u8>, rest: &[u8], end: bool) {
        if end || self.held.len().saturating_add(rest.len()) > MAX_HELD_EVENT {
            self.off = !end;
            out.extend_from_slice(&self.held);
            out.extend_from_slice(rest);
            self.held = Vec::new();
        } else {
            self.held.extend_from_slice(rest);
        }
    }
}

/// Reads one event with `grammar` and hands it to the collector while the
/// answer lasts; true when it is the usage-only event.
fn read_event<G: Grammar>(
    grammar: &mut G,
    collect: &mut Option<&mut dyn Collect>,
    event: &Event<'_>,
) -> bool {
    let mut taker = collect
        .as_deref_mut()
        .filter(|c| c.wants() && !grammar.ended());
    let mut parse = false;
    if let Some(c) = taker.as_deref_mut() {
        if event.oversize || event.data.is_some_and(|d| d.len() > c.limit()) {
            c.take(Piece::TooLarge);
        } else {
            parse = event.data.is_some();
        }
    }
    let reading = grammar.read(event, parse);
    if let Some(c) = taker {
        match reading.parsed {
            Parsed::Tree(tree) => c.take(Piece::Chunk(tree)),
            Parsed::NotJson => c.take(Piece::NotJson),
            Parsed::Skipped => {}
        }
        if grammar.ended() {
            c.take(Piece::End);
        }
    }
    reading.usage_only
}

#[cfg(test)]
pub(crate) mod tests;

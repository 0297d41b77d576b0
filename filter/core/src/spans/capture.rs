//! The prompt and completion of a call, captured when `tracing.capture` asks
//! (off by default: they hold what users wrote), as the OpenTelemetry GenAI
//! conventions shape them: `gen_ai.system_instructions` (`[{"type":"text",
//! "content":…}]`), `gen_ai.input.messages` and `gen_ai.output.messages`
//! (`[{"role":…,"parts":[…],"finish_reason":…}]`), each a JSON string.
//!
//! Each dialect's request and answer are read where they keep their text
//! (chat `messages`, Responses `instructions` and `input`, Messages `system`
//! and `messages`; a choice's `message`, a response's `output`, a message's
//! `content`). Every string captured is redacted ([`super::redact`]) whole
//! before anything is cut from it, so no cut leaves part of a secret that no
//! rule knows; then the whole JSON is kept within `max_bytes`: what does not
//! fit is left out, a text cut ends with [`CUT_MARK`] (never in the middle
//! of a word), and the capture says it was cut. Reading stops once the text
//! read is past the bound, so no capture holds more than about twice
//! `max_bytes`.

use serde_json::{json, Value};

use super::config::CaptureConfig;
use super::redact::{self, Rules};
use crate::dialect::answer::Hear;
use crate::dialect::prompt::Said;
use crate::dialect::Dialect;
use crate::json::Json;
use crate::sse::Transcript;

/// Bytes of a text read past what a capture can keep of it, so a secret
/// that starts in the kept part is whole when it is redacted (keys, tokens
/// and PEM blocks are a few KB; a PEM block cut short is redacted to the
/// end anyway).
const REDACT_MARGIN: usize = 64 * 1024;

/// The end of a text cut to fit.
pub const CUT_MARK: &str = "…[truncated]";

/// One captured attribute: its JSON, and whether anything was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The JSON array, at most `max_bytes`.
    pub json: String,
    /// Something did not fit.
    pub cut: bool,
}

/// What is captured of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    /// The system instructions given apart from the messages (Responses
    /// `instructions`, Messages `system`).
    pub system: Option<Captured>,
    /// The messages, in the order they were sent.
    pub messages: Option<Captured>,
}

/// A string's value.
fn text(j: &Json) -> Option<&str> {
    match j {
        Json::String(s) => Some(s),
        _ => None,
    }
}

/// An array's items; none of anything else.
fn items(j: Option<&Json>) -> &[Json] {
    match j {
        Some(Json::Array(items)) => items,
        _ => &[],
    }
}

/// The tree written back as JSON (a tool call's arguments).
fn written(j: &Json) -> String {
    let mut out = Vec::new();
    j.write(&mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    /// Text.
    Text(String),
    /// A tool call the model asked for.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    /// A tool's result handed back.
    ToolResult { id: String, response: String },
    /// Anything else (an image, a file), by its type only.
    Other(String),
}

/// One message, as the conventions shape it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    role: String,
    parts: Vec<Part>,
    finish_reason: Option<String>,
}

/// Collects messages, their strings redacted, until the text read passes
/// the bound.
struct Reader<'r> {
    limit: usize,
    read: usize,
    messages: Vec<Message>,
    /// Text was cut or left out.
    cut: bool,
    rules: Rules<'r>,
}

impl<'r> Reader<'r> {
    fn new(cfg: &'r CaptureConfig) -> Self {
        Self {
            limit: cfg.max_bytes,
            read: 0,
            messages: Vec::new(),
            cut: false,
            rules: rules(cfg),
        }
    }

    /// Past the bound: what is left is left out.
    fn full(&mut self) -> bool {
        let full = self.read > self.limit;
        self.cut |= full;
        full
    }

    /// Text of a part, redacted whole, then kept whole up to the bound;
    /// past it, cut at a word's end and marked (the writer may cut it
    /// shorter still).
    fn text(&mut self, s: &str) -> String {
        self.kept(s, false)
    }

    /// [`Reader::text`] of a text that went on past what was kept of it
    /// (`lost`): its last word is left out, it may be a secret's head.
    fn kept(&mut self, s: &str, lost: bool) -> String {
        let room = self.limit.saturating_sub(self.read);
        if room == 0 {
            self.cut = true;
            self.read = self.limit.saturating_add(1);
            return CUT_MARK.to_string();
        }
        // What can be kept, and room for the longest secret that may start
        // in it: a text past that is redacted no further (a prompt of a MB
        // would cost its whole scan for a few KB kept).
        let window = room.saturating_add(REDACT_MARGIN);
        let (s, lost) = if s.len() > window {
            let mut end = window;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            (s.get(..end).unwrap_or_default(), true)
        } else {
            (s, lost)
        };
        let mut r = redact::redact(s, &self.rules).into_owned();
        if lost {
            r.truncate(redact::whole_words(&r));
        }
        if r.len() <= room {
            self.read = self.read.saturating_add(r.len().max(1));
            if lost {
                self.cut = true;
                r.push_str(CUT_MARK);
            }
            return r;
        }
        self.cut = true;
        self.read = self.limit.saturating_add(1);
        let end = redact::word_boundary(&r, room);
        r.truncate(end);
        r.push_str(CUT_MARK);
        r
    }

    /// A short string (an id, a name, a role), redacted, then cut to
    /// `chars` characters.
    fn short(&self, s: &str, chars: usize) -> String {
        redact::redact(s, &self.rules).chars().take(chars).collect()
    }

    fn string(&self, t: Option<&Json>) -> String {
        self.short(t.and_then(text).unwrap_or_default(), 256)
    }

    fn push(&mut self, role: &str, parts: Vec<Part>, finish_reason: Option<&str>) {
        let role = self.short(role, 64);
        let finish_reason = finish_reason.map(|r| self.short(r, 64));
        self.messages.push(Message {
            role,
            parts,
            finish_reason,
        });
    }

    /// The parts of a `content`: a string, or an array of typed parts.
    fn parts(&mut self, content: Option<&Json>, parts: &mut Vec<Part>) {
        let Some(content) = content else {
            return;
        };
        if let Some(s) = text(content) {
            parts.push(Part::Text(self.text(s)));
            return;
        }
        for item in items(Some(content)) {
            if self.full() {
                return;
            }
            // Gemini's parts are keyed by what they hold, not typed.
            if let Some(call) = item.get("functionCall") {
                parts.push(self.tool_call(call.get("id"), call.get("name"), call.get("args")));
                continue;
            }
            if let Some(result) = item.get("functionResponse") {
                let response = result.get("response").map(written).unwrap_or_default();
                let id = result.get("id").or_else(|| result.get("name"));
                parts.push(Part::ToolResult {
                    id: self.string(id),
                    response: self.text(&response),
                });
                continue;
            }
            let kind = item.get("type").and_then(text).unwrap_or("text");
            let said = item.get("text").and_then(text);
            match (kind, said) {
                ("text" | "input_text" | "output_text", Some(t)) => {
                    parts.push(Part::Text(self.text(t)));
                }
                ("tool_use", _) => {
                    parts.push(self.tool_call(item.get("id"), item.get("name"), item.get("input")))
                }
                ("tool_result", _) => {
                    let mut inner = Vec::new();
                    self.parts(item.get("content"), &mut inner);
                    parts.push(Part::ToolResult {
                        id: self.string(item.get("tool_use_id")),
                        response: texts(&inner),
                    });
                }
                ("function_call", _) => parts.push(self.tool_call(
                    item.get("call_id"),
                    item.get("name"),
                    item.get("arguments"),
                )),
                ("function_call_output", _) => {
                    let output = item.get("output");
                    let response = output
                        .and_then(text)
                        .map(|t| self.text(t))
                        .unwrap_or_default();
                    parts.push(Part::ToolResult {
                        id: self.string(item.get("call_id")),
                        response,
                    });
                }
                (other, _) => parts.push(Part::Other(self.short(other, 64))),
            }
        }
    }

    fn tool_call(
        &mut self,
        id: Option<&Json>,
        name: Option<&Json>,
        arguments: Option<&Json>,
    ) -> Part {
        let arguments = match arguments {
            Some(a) => match text(a) {
                Some(t) => self.text(t),
                None => self.text(&written(a)),
            },
            None => String::new(),
        };
        Part::ToolCall {
            id: self.string(id),
            name: self.string(name),
            arguments,
        }
    }

    /// One message of a list: `role` and `content` (chat, Messages,
    /// Responses input items), its tool calls and tool results.
    fn message(&mut self, m: &Json, default_role: &str) {
        let role = m.get("role").and_then(text).unwrap_or(default_role);
        let mut parts = Vec::new();
        let kind = m.get("type").and_then(text);
        match kind {
            // A Responses input item that is no message.
            Some("function_call" | "function_call_output") => {
                self.parts_of_item(m, &mut parts);
            }
            _ => self.parts(m.get("content"), &mut parts),
        }
        for call in items(m.get("tool_calls")) {
            let f = call.get("function");
            parts.push(self.tool_call(
                call.get("id"),
                f.and_then(|f| f.get("name")),
                f.and_then(|f| f.get("arguments")),
            ));
        }
        if role == "tool" {
            let response = texts(&parts);
            parts = vec![Part::ToolResult {
                id: self.string(m.get("tool_call_id")),
                response,
            }];
        }
        self.push(role, parts, None);
    }

    fn parts_of_item(&mut self, item: &Json, parts: &mut Vec<Part>) {
        // The item is its own part: read it as a one-item content.
        let kind = item.get("type").and_then(text).unwrap_or_default();
        match kind {
            "function_call" => parts.push(self.tool_call(
                item.get("call_id"),
                item.get("name"),
                item.get("arguments"),
            )),
            _ => {
                let response = item
                    .get("output")
                    .and_then(text)
                    .map(|t| self.text(t))
                    .unwrap_or_default();
                parts.push(Part::ToolResult {
                    id: self.string(item.get("call_id")),
                    response,
                });
            }
        }
    }
}

/// The text parts of a tool result, joined.
fn texts(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `cfg` captures of a request body of `api`: `None` when it captures
/// no prompt, or the dialect has none (embeddings). The prompt is read where
/// the dialect says it is ([`crate::dialect::request::Request::prompt`]).
pub fn prompt(cfg: &CaptureConfig, api: Dialect, body: &Json) -> Option<Prompt> {
    if !cfg.prompt {
        return None;
    }
    let said = api.request().prompt(body)?;
    let mut system = Reader::new(cfg);
    let mut input = Reader::new(cfg);
    for part in said {
        match part {
            Said::System(instructions) => {
                let mut parts = Vec::new();
                system.parts(Some(instructions), &mut parts);
                if !parts.is_empty() {
                    system.push("system", parts, None);
                }
            }
            // A completions prompt (a string, or a list of strings or
            // token ids), a Responses input string: one user message.
            Said::Bare(prompt) => {
                let mut parts = Vec::new();
                match prompt {
                    Some(Json::Array(list)) => {
                        for p in list.iter().filter_map(text) {
                            parts.push(Part::Text(input.text(p)));
                        }
                    }
                    _ => input.parts(prompt, &mut parts),
                }
                input.push("user", parts, None);
            }
            Said::Turn(m) => {
                if input.full() {
                    break;
                }
                input.message(m, "user");
            }
            Said::Parts { role, parts: list } => {
                if input.full() {
                    break;
                }
                let mut parts = Vec::new();
                input.parts(list, &mut parts);
                input.push(role, parts, None);
            }
        }
    }
    let system = system
        .messages
        .first()
        .map(|m| write_parts(&system, &m.parts));
    Some(Prompt {
        system,
        messages: Some(write_messages(&input)),
    })
}

/// What `cfg` captures of a JSON answer of `api`: what the dialect reads
/// out of it, turn by turn.
pub fn completion(cfg: &CaptureConfig, api: Dialect, answer: &Json) -> Option<Captured> {
    if !cfg.completion {
        return None;
    }
    let mut heard = Heard {
        out: Reader::new(cfg),
        parts: Vec::new(),
    };
    if !api.answer().said(answer, &mut heard) {
        return None;
    }
    Some(write_messages(&heard.out))
}

/// The assistant's turns of an answer, as its dialect tells them.
struct Heard<'r> {
    out: Reader<'r>,
    /// The parts of the turn under way.
    parts: Vec<Part>,
}

impl Hear for Heard<'_> {
    fn full(&mut self) -> bool {
        self.out.full()
    }

    fn message(&mut self, message: &Json, reason: Option<&str>) {
        self.out.message(message, "assistant");
        let reason = reason.map(|r| self.out.short(r, 64));
        if let Some(last) = self.out.messages.last_mut() {
            last.finish_reason = reason;
        }
    }

    fn text(&mut self, text: &str, reason: Option<&str>) {
        let parts = vec![Part::Text(self.out.text(text))];
        self.out.push("assistant", parts, reason);
    }

    fn content(&mut self, content: Option<&Json>) {
        self.out.parts(content, &mut self.parts);
    }

    fn item(&mut self, item: &Json) {
        self.out.parts_of_item(item, &mut self.parts);
    }

    fn end_turn(&mut self, reason: Option<&str>) {
        let parts = std::mem::take(&mut self.parts);
        self.out.push("assistant", parts, reason);
    }
}

/// Bytes of text a stream keeps for the capture: one past the bound, so a
/// text cut as it was kept is cut again at a word's end.
pub fn transcript_bytes(cfg: &CaptureConfig) -> usize {
    cfg.max_bytes.saturating_add(1)
}

/// What `cfg` captures of a streamed answer: the text of each choice as
/// the stream's reading kept it (the deltas joined, so a secret sent in
/// pieces is redacted whole), with the finish reasons in order.
pub fn streamed(cfg: &CaptureConfig, kept: &Transcript, reasons: &[&str]) -> Option<Captured> {
    if !cfg.completion {
        return None;
    }
    let mut out = Reader::new(cfg);
    out.cut = kept.cut;
    for (i, (text, lost)) in kept.kept().enumerate() {
        let part = Part::Text(out.kept(text, lost));
        out.push("assistant", vec![part], reasons.get(i).copied());
    }
    Some(write_messages(&out))
}

fn rules(cfg: &CaptureConfig) -> Rules<'_> {
    Rules {
        globs: &cfg.redact,
        builtins: cfg.redact_builtins,
        guarded: cfg.guarded.as_ref(),
    }
}

/// A part as the conventions write it (its strings redacted as read).
fn part_json(part: &Part) -> Value {
    match part {
        Part::Text(t) => json!({"type": "text", "content": t}),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => json!({"type": "tool_call", "id": id, "name": name, "arguments": arguments}),
        Part::ToolResult { id, response } => {
            json!({"type": "tool_call_response", "id": id, "response": response})
        }
        Part::Other(kind) => json!({ "type": kind }),
    }
}

/// Writes items into a JSON array of at most `max` bytes: whole items
/// while they fit, then the one that does not cut to fit (its longest
/// string shortened, ending with [`CUT_MARK`]) when it can be.
struct Capped {
    out: String,
    max: usize,
    cut: bool,
}

impl Capped {
    fn new(max: usize) -> Self {
        Self {
            out: String::from("["),
            max,
            cut: false,
        }
    }

    /// Room left for one more item, its separator and the closing `]`.
    fn room(&self) -> usize {
        let sep = usize::from(self.out.len() > 1);
        self.max
            .saturating_sub(self.out.len())
            .saturating_sub(sep + 1)
    }

    /// Adds `item`, cut to fit; false once nothing more fits.
    fn add(&mut self, mut item: Value) -> bool {
        if self.cut {
            return false;
        }
        let mut written = item.to_string();
        let room = self.room();
        if written.len() > room {
            self.cut = true;
            // Shorten the item's longest string by what does not fit,
            // until it fits (escapes make a shorter string shorter still).
            for _ in 0..4 {
                let over = written.len().saturating_sub(room);
                if !shorten(&mut item, over) {
                    return false;
                }
                written = item.to_string();
                if written.len() <= room {
                    break;
                }
            }
            if written.len() > room {
                return false;
            }
        }
        if self.out.len() > 1 {
            self.out.push(',');
        }
        self.out.push_str(&written);
        !self.cut
    }

    fn finish(mut self) -> Captured {
        self.out.push(']');
        Captured {
            json: self.out,
            cut: self.cut,
        }
    }
}

/// Shortens the longest string in `v` by at least `over` bytes (and the
/// mark), never leaving half a word; false when there is none to shorten.
fn shorten(v: &mut Value, over: usize) -> bool {
    fn longest(v: &mut Value) -> Option<&mut String> {
        match v {
            Value::String(s) => Some(s),
            Value::Array(items) => items.iter_mut().filter_map(longest).max_by_key(|s| s.len()),
            Value::Object(map) => map
                .iter_mut()
                .filter(|(k, _)| k.as_str() != "type" && k.as_str() != "role")
                .filter_map(|(_, v)| longest(v))
                .max_by_key(|s| s.len()),
            _ => None,
        }
    }
    let Some(s) = longest(v) else {
        return false;
    };
    let had_mark = s.ends_with(CUT_MARK);
    let body = if had_mark {
        s.len() - CUT_MARK.len()
    } else {
        s.len()
    };
    let want = body.saturating_sub(over.saturating_add(if had_mark { 0 } else { CUT_MARK.len() }));
    if body == 0 {
        return false;
    }
    let end = redact::word_boundary(s, want);
    s.truncate(end);
    s.push_str(CUT_MARK);
    true
}

/// Messages as `gen_ai.input.messages` / `gen_ai.output.messages`.
fn write_messages(read: &Reader<'_>) -> Captured {
    let (messages, max) = (&read.messages, read.limit);
    let mut c = Capped::new(max);
    let mut all = true;
    for m in messages {
        let parts: Vec<Value> = m.parts.iter().map(part_json).collect();
        let mut item = json!({"role": m.role, "parts": parts});
        if let (Some(r), Some(obj)) = (&m.finish_reason, item.as_object_mut()) {
            obj.insert("finish_reason".to_string(), Value::from(r.as_str()));
        }
        if !c.add(item) {
            all = false;
            break;
        }
    }
    let mut done = c.finish();
    done.cut |= !all || read.cut;
    done
}

/// Parts as `gen_ai.system_instructions`.
fn write_parts(read: &Reader<'_>, parts: &[Part]) -> Captured {
    let mut c = Capped::new(read.limit);
    for p in parts {
        if !c.add(part_json(p)) {
            break;
        }
    }
    let mut done = c.finish();
    done.cut |= read.cut;
    done
}

#[cfg(test)]
mod tests;

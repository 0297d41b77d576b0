//! The guard step on the way back (see [`crate::guard::policy`]): the
//! answer is checked by the rules that look at answers, through its
//! dialect's view of what it said (a JSON answer's texts, a stream's text
//! deltas), and the prompt's values a rule restores are put back. A JSON
//! answer is held to its end (within `max_body_bytes`) and passes checked;
//! a stream passes event by event, each text held back through a bounded
//! window ([`Window`]) from where a value may still be under way. A `block`
//! replaces a JSON answer by a 502 in the caller's API shape, and ends a
//! stream with the dialect's error event; nothing blocked is stored.

use crate::budget::reply;
use crate::dialect::answer::{Answer, ReplyKind};
use crate::guard::policy::{Guardrails, Side, Unchecked, Verdict};
use crate::guard::window::{Out, Window};
use crate::guard::Vault;
use crate::host::Metrics;
use crate::json::Json;
use crate::metrics::internal_error;
use crate::metrics::{self as names};
use crate::sse::{Event, Reader, MAX_EVENT};

use super::{set_response, Call, Env, Host, Step};

/// Most texts of one stream held through a window (choices, blocks, parts).
const MAX_TEXTS: usize = 64;

/// The answer's check for one call.
#[derive(Debug, Default)]
pub(super) struct AnswerGuard {
    /// The rules that fired on the answer.
    pub(super) verdict: Verdict,
    /// The stream's reading, for a stream.
    stream: Option<StreamGuard>,
    /// The answer was refused: nothing more of it passes.
    pub(super) blocked: bool,
    /// The answer passes unchecked (past the bounds, and allowed).
    pub(super) off: bool,
    /// Why the answer could not be checked whole, when it could not.
    pub(super) unread: Option<Unread>,
    /// What was noted of the check (metrics, the record's names).
    noted: bool,
    /// The guardrail service's part in a JSON answer's check.
    pub(super) ask: Ask,
}

/// Where the guardrail service is in the check of a JSON answer.
#[derive(Debug, Default)]
pub(super) enum Ask {
    /// Not asked (none asks about answers, or not yet).
    #[default]
    No,
    /// Asked about the answer of `size` bytes, `tree` as the rules checked
    /// it (masked, nothing put back; `changed` when they changed it),
    /// `sent` texts at `sent_ms`.
    Asking {
        size: usize,
        tree: Json,
        changed: bool,
        sent: usize,
        sent_ms: u64,
    },
    /// Read and checked by the rules once, as in `Asking`, and let through
    /// by the service (passed, flagged with `log`, unjudged and `on_error:
    /// allow`) or not asked (nothing to ask about, or the rules settle it).
    Read { tree: Json, changed: bool },
    /// Masked: the answer's tree with the service's texts, nothing put back.
    Masked(Json),
    /// Refused: flagged (true) or unjudged with `on_error: refuse`.
    Refused(bool),
}

impl Ask {
    /// The service was asked (or could not be).
    pub(super) fn is_asked(&self) -> bool {
        !matches!(self, Self::No)
    }
}

/// What a whole answer comes out as.
#[derive(Debug)]
pub(super) enum Checked {
    /// As it is.
    Pass,
    /// In these bytes.
    Body(Vec<u8>),
    /// Refused by this rule, or unread (`None`) and refused.
    Blocked(Option<usize>),
}

/// Why an answer could not be checked.
#[derive(Debug, Clone, Copy)]
pub(super) enum Unread {
    /// Longer than the filter holds.
    TooLong,
    /// No JSON, or an event no JSON.
    NotJson,
}

impl Unread {
    fn as_str(self) -> &'static str {
        match self {
            Self::TooLong => "too_long",
            Self::NotJson => "not_json",
        }
    }
}

impl AnswerGuard {
    /// The check of an answer, a stream or JSON.
    pub(super) fn new(stream: bool) -> Self {
        Self {
            stream: stream.then(StreamGuard::default),
            ..Self::default()
        }
    }

    /// A JSON answer held to its end.
    pub(super) fn holds_json(&self) -> bool {
        self.stream.is_none() && !self.off && !self.blocked
    }

    /// Checks a whole JSON answer.
    pub(super) fn check_json(
        &mut self,
        rules: &Guardrails,
        answer: &dyn Answer,
        vault: &mut Vault,
        body: &[u8],
    ) -> Result<Checked, Unread> {
        let mut tree = Json::parse(body).ok_or(Unread::NotJson)?;
        let changed = check_said(rules, answer, &mut tree, vault, &mut self.verdict, true);
        self.checked(&tree, changed, body.len())
    }

    /// What a JSON answer the rules checked (`tree`, `changed` by them;
    /// `len` bytes as it came) comes out as.
    fn checked(&mut self, tree: &Json, changed: bool, len: usize) -> Result<Checked, Unread> {
        if let Some(k) = self.verdict.blocked_by() {
            self.blocked = true;
            return Ok(Checked::Blocked(Some(k)));
        }
        if self.verdict.truncated {
            return Err(Unread::TooLong);
        }
        if !changed {
            return Ok(Checked::Pass);
        }
        let mut out = Vec::with_capacity(len);
        tree.write(&mut out);
        Ok(Checked::Body(out))
    }

    /// Checks the next piece of a stream (`end`: the last); the bytes to
    /// pass in its place when they differ.
    pub(super) fn check_stream(
        &mut self,
        rules: &Guardrails,
        answer: &dyn Answer,
        vault: &mut Vault,
        bytes: &[u8],
        end: bool,
    ) -> Option<Vec<u8>> {
        if self.blocked {
            return Some(Vec::new());
        }
        let s = self.stream.as_mut()?;
        if self.off {
            return None;
        }
        let mut out = Vec::with_capacity(bytes.len() + 64);
        let mut from = 0;
        let verdict = &mut self.verdict;
        let mut blocked = None;
        let mut unread = None;
        let StreamGuard {
            reader,
            raw,
            windows,
        } = s;
        let mut on = |e: Event<'_>| {
            if blocked.is_some() || unread.is_some() {
                return;
            }
            let at = e.end.unwrap_or(bytes.len());
            raw.extend_from_slice(bytes.get(from..at).unwrap_or_default());
            from = at;
            let mut one = Texts {
                rules,
                answer,
                vault: &mut *vault,
                verdict: &mut *verdict,
                windows: &mut *windows,
            };
            match one.event(&e, raw, &mut out) {
                Ok(()) => {}
                Err(Some(k)) => blocked = Some(k),
                Err(None) => unread = Some(Unread::NotJson),
            }
            raw.clear();
        };
        reader.feed(bytes, &mut on);
        if end {
            reader.finish(&mut on);
        }
        if blocked.is_none() && unread.is_none() {
            raw.extend_from_slice(bytes.get(from..).unwrap_or_default());
            if end {
                let mut one = Texts {
                    rules,
                    answer,
                    vault,
                    verdict: &mut self.verdict,
                    windows,
                };
                match one.flush(&mut out) {
                    Some(k) => blocked = Some(k),
                    None => out.append(raw),
                }
            } else if raw.len() > MAX_EVENT {
                unread = Some(Unread::TooLong);
            }
        }
        if let Some(why) = unread {
            // An event the rules cannot read: refused or let through as
            // `unchecked` says; what is held passes unchecked.
            if rules.unchecked == Unchecked::Allow {
                self.off = true;
                let s = self.stream.as_mut()?;
                out.append(&mut s.raw);
                out.extend_from_slice(bytes.get(from..).unwrap_or_default());
                self.unread = Some(why);
                return Some(out);
            }
            self.unread = Some(why);
            blocked = Some(usize::MAX);
        }
        if let Some(k) = blocked {
            self.blocked = true;
            let name = rules.rules.get(k).map(|r| r.name.as_str());
            out.extend_from_slice(&error_event(answer, name.map(By::Rule)));
        }
        (out != bytes).then_some(out)
    }
}

/// Checks the members of a JSON answer `tree` that hold what it said, in
/// place (with `restore`, the prompt's values put back); true when a
/// string changed.
pub(super) fn check_said(
    rules: &Guardrails,
    answer: &dyn Answer,
    tree: &mut Json,
    vault: &mut Vault,
    verdict: &mut Verdict,
    restore: bool,
) -> bool {
    let mut changed = false;
    each_said(answer, tree, &mut |value| {
        changed |= rules.check_answer(value, vault, verdict, restore);
    });
    changed
}

/// Puts the prompt's values back in the members of a JSON answer `tree`
/// that hold what it said, once checked without (see [`check_said`]);
/// true when a string changed.
fn restore_said(
    rules: &Guardrails,
    answer: &dyn Answer,
    tree: &mut Json,
    vault: &mut Vault,
) -> bool {
    let mut changed = false;
    if vault.restores() {
        each_said(answer, tree, &mut |value| {
            changed |= rules.restore_answer(value, vault);
        });
    }
    changed
}

/// Each member of a JSON answer `tree` that holds what it said.
fn each_said(answer: &dyn Answer, tree: &mut Json, f: &mut dyn FnMut(&mut Json)) {
    if let Json::Object(members) = tree {
        for (name, value) in members.iter_mut() {
            if answer.said_fields().contains(&name.as_str()) {
                f(value);
            }
        }
    }
}

/// A stream's reading for its check.
#[derive(Debug, Default)]
struct StreamGuard {
    reader: Reader,
    /// The bytes of the event under way.
    raw: Vec<u8>,
    /// Each text under way: its key, its window, and its last event (its
    /// `event:` name and data, texts emptied) to carry what is held when
    /// the text ends.
    windows: Vec<(u32, Window, Option<Template>)>,
}

/// An event to write held text in: its name and its data.
type Template = (Option<Vec<u8>>, Json);

/// The check of one event's texts.
struct Texts<'a> {
    rules: &'a Guardrails,
    answer: &'a dyn Answer,
    vault: &'a mut Vault,
    verdict: &'a mut Verdict,
    windows: &'a mut Vec<(u32, Window, Option<Template>)>,
}

impl Texts<'_> {
    /// Passes one event (`raw`, its bytes), or what it becomes, to `out`;
    /// `Err` with the rule that blocks, or `None` when it cannot be read.
    fn event(&mut self, e: &Event<'_>, raw: &[u8], out: &mut Vec<u8>) -> Result<(), Option<usize>> {
        if e.oversize {
            return Err(None);
        }
        let tree = e.data.and_then(Json::parse);
        let Some(mut tree) = tree else {
            // No data, or words (`[DONE]`): no text of the answer; what is
            // held goes before it.
            if e.data.is_some() {
                self.flush(out).map_or(Ok(()), |k| Err(Some(k)))?;
            }
            out.extend_from_slice(raw);
            return Ok(());
        };
        let mut texts: Vec<(u32, String)> = Vec::new();
        self.answer
            .deltas(&mut tree, &mut |k, s| texts.push((k, std::mem::take(s))));
        // The rest of the event is read whole (a Responses `*.done` event,
        // the final response).
        let changed = self
            .rules
            .check_answer(&mut tree, self.vault, self.verdict, true);
        if let Some(k) = self.verdict.blocked_by() {
            return Err(Some(k));
        }
        if texts.is_empty() {
            self.flush(out).map_or(Ok(()), |k| Err(Some(k)))?;
            match changed {
                true => write_event(e.kind, &tree, out),
                false => out.extend_from_slice(raw),
            }
            return Ok(());
        }
        let mut passed = Vec::with_capacity(texts.len());
        for (k, text) in &texts {
            let Some((_, w, template)) = window_of(self.windows, *k) else {
                passed.push(text.clone());
                continue;
            };
            match w.push(self.rules, self.vault, self.verdict, text, false) {
                Out::Pass(p) => passed.push(p),
                Out::Blocked(r) => return Err(Some(r)),
            }
            if w.held() > 0 {
                // This event carries what the text holds if it ends here.
                *template = Some((e.kind.map(<[u8]>::to_vec), tree.clone()));
            }
        }
        if !changed && passed.iter().zip(&texts).all(|(p, (_, t))| p == t) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let mut it = passed.into_iter();
        self.answer
            .deltas(&mut tree, &mut |_, s| *s = it.next().unwrap_or_default());
        write_event(e.kind, &tree, out);
        Ok(())
    }

    /// The texts end: what each holds passes, checked, in its last event;
    /// the rule that blocks it, if one does.
    fn flush(&mut self, out: &mut Vec<u8>) -> Option<usize> {
        for (key, w, template) in self.windows.iter_mut() {
            if w.held() == 0 {
                continue;
            }
            let p = match w.push(self.rules, self.vault, self.verdict, "", true) {
                Out::Pass(p) => p,
                Out::Blocked(r) => return Some(r),
            };
            let Some((kind, tree)) = template.as_mut() else {
                continue;
            };
            let mut p = Some(p);
            self.answer.deltas(tree, &mut |k, s| {
                *s = match k == *key {
                    true => p.take().unwrap_or_default(),
                    false => String::new(),
                }
            });
            write_event(kind.as_deref(), tree, out);
        }
        None
    }
}

/// The window of text `key`, new when there is room, else the last one.
fn window_of(
    windows: &mut Vec<(u32, Window, Option<Template>)>,
    key: u32,
) -> Option<&mut (u32, Window, Option<Template>)> {
    let known = windows.iter().position(|(k, _, _)| *k == key);
    if known.is_none() && windows.len() < MAX_TEXTS {
        windows.push((key, Window::default(), None));
    }
    let at = known.unwrap_or(windows.len().saturating_sub(1));
    windows.get_mut(at)
}

/// Writes an event: its name when it had one, its data.
fn write_event(kind: Option<&[u8]>, data: &Json, out: &mut Vec<u8>) {
    event_head(kind, out);
    data.write(out);
    out.extend_from_slice(b"\n\n");
}

/// An event's name when it has one, and the start of its data.
fn event_head(kind: Option<&[u8]>, out: &mut Vec<u8>) {
    if let Some(kind) = kind {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind);
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
}

/// Who refused an answer: a rule, or the guardrail service, by name.
#[derive(Debug, Clone, Copy)]
pub(super) enum By<'a> {
    Rule(&'a str),
    Service(&'a str),
}

/// The words of a refused answer: who refused it, never what it found;
/// `None` when it could not be checked.
fn refusal(by: Option<By<'_>>, stream: bool) -> String {
    let rest = match stream {
        true => "the rest of it was not sent",
        false => "nothing of it was sent",
    };
    match by {
        Some(By::Rule(name)) => {
            format!("The answer was blocked by the guardrail rule `{name}`; {rest}.")
        }
        Some(By::Service(name)) => {
            format!("The answer was blocked by the guardrail service `{name}`; {rest}.")
        }
        None => format!("The answer could not be checked by the guardrails; {rest}."),
    }
}

/// The error event that ends a refused stream (`by` a rule or the
/// service, or unread): the dialect's error body, named as its streams
/// name an error.
pub(super) fn error_event(answer: &dyn Answer, by: Option<By<'_>>) -> Vec<u8> {
    let (_, body) = answer.local_error(ReplyKind::AnswerBlocked, &refusal(by, true));
    let mut out = Vec::with_capacity(body.len() + 24);
    event_head(answer.error_event().map(str::as_bytes), &mut out);
    out.extend_from_slice(&body);
    out.extend_from_slice(b"\n\n");
    out
}

/// The reply that takes a refused JSON answer's place.
pub(super) fn blocked_reply(by: Option<By<'_>>) -> reply::LocalReply {
    reply::with_message(ReplyKind::AnswerBlocked, &refusal(by, false), None)
}

/// Rule `rule` of `rules`, as who refused an answer.
pub(super) fn by_rule(rules: &Guardrails, rule: Option<usize>) -> Option<By<'_>> {
    rule.and_then(|k| rules.rules.get(k))
        .map(|r| By::Rule(r.name.as_str()))
}

impl AnswerGuard {
    /// Counts what the check found, once: each rule that fired on the
    /// answer, and an answer that could not be read whole; the rules'
    /// names added to `named` for the span and the record.
    pub(super) fn note(
        &mut self,
        rules: &Guardrails,
        m: &mut dyn Metrics,
        api: &str,
        named: &mut String,
    ) {
        if std::mem::replace(&mut self.noted, true) {
            return;
        }
        for rule in self
            .verdict
            .fired
            .iter()
            .filter_map(|k| rules.rules.get(*k))
        {
            let action = rule.action.as_str();
            let labels = [
                ("rule", rule.name.as_str()),
                ("action", action),
                ("api", api),
            ];
            m.counter(&names::name(names::GUARDRAIL_ANSWER_FIRED, &labels), 1);
            for part in [",", &rule.name, ":", action, ":answer"] {
                named.push_str(part);
            }
        }
        if let Some(why) = self.unread.filter(|_| rules.enforces(Side::Answer)) {
            let refused = rules.unchecked == Unchecked::Refuse;
            let labels = [
                ("reason", why.as_str()),
                ("result", if refused { "refused" } else { "allowed" }),
                ("api", api),
            ];
            m.counter(&names::name(names::GUARDRAIL_ANSWER_UNCHECKED, &labels), 1);
        }
    }

    /// What an answer that could not be read becomes, by `unchecked`.
    fn unread(&mut self, rules: &Guardrails, why: Unread) -> Checked {
        self.unread = Some(why);
        match rules.unchecked {
            Unchecked::Allow => Checked::Pass,
            Unchecked::Refuse => Checked::Blocked(None),
        }
    }
}

/// An answer is checked for this call: a rule reads answers, or a value
/// masked in its prompt is to be put back; and its answers say text (an
/// embeddings answer, vectors, has nothing to check).
pub(super) fn checks_answers(rules: &Guardrails, vault: &Vault, answer: &dyn Answer) -> bool {
    (rules.rules_read(Side::Answer) || vault.restores()) && !answer.said_fields().is_empty()
}

impl Call {
    /// Response headers of an answer to check: its check set up and its
    /// length removed (the answer may change). True when a JSON answer is
    /// to be held to its end.
    pub(super) fn guard_answer_headers(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        end_of_stream: bool,
        stream: bool,
    ) -> bool {
        let Some(response) = self.response.as_mut() else {
            return false;
        };
        let ok = response.status.is_some_and(|s| (200..300).contains(&s))
            && response.envoy.is_none()
            && response.replacement.is_none();
        let answer = self.request.dialect.answer();
        let rules = &env.config.guardrails;
        // The service is asked about a JSON answer that says something.
        let asked = rules.asks(Side::Answer).is_some() && !answer.said_fields().is_empty();
        if !ok || end_of_stream {
            return false;
        }
        if stream && asked && self.stream_unasked(env, host) {
            return false;
        }
        if !(checks_answers(rules, &self.decided.vault, answer) || asked && !stream) {
            return false;
        }
        if let Some(response) = self.response.as_mut() {
            response.guard = Some(AnswerGuard::new(stream));
        }
        set_response(env, host, "content-length", None);
        !stream
    }

    /// A body callback of a JSON answer held for its check: `Some` step
    /// while it is held (or refused, or past what is held), `None` when
    /// the walk reads it as usual.
    pub(super) fn guard_held_json(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Option<Step> {
        let g = self.response.as_mut()?.guard.as_mut()?;
        if g.blocked {
            // The refusal went out; nothing more of the answer does.
            if size > 0 && !host.set_response_body(size, &[]) {
                internal_error(env.metrics, "set_response_body");
            }
            return Some(Step::Continue);
        }
        if !g.holds_json() {
            return None;
        }
        if end_of_stream {
            // The guardrail service is asked about it, when it is.
            return self.ask_about_answer(env, host, size);
        }
        if size <= env.config.max_body_bytes {
            return Some(Step::Pause);
        }
        // Past what the proxy holds: unchecked.
        g.unread = Some(Unread::TooLong);
        if env.config.guardrails.unchecked == Unchecked::Allow {
            g.off = true;
            self.note_answer(env);
            return None;
        }
        self.refuse_answer(env, host, size, None);
        Some(Step::Continue)
    }

    /// The end of a JSON answer held for its check, `body` all of it: it
    /// passes, changed or not, or is refused.
    pub(super) fn guard_json_end(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        body: &[u8],
    ) {
        let rules = &env.config.guardrails;
        let answer = self.request.dialect.answer();
        let vault = &mut self.decided.vault;
        let Some(g) = self.response.as_mut().and_then(|r| r.guard.as_mut()) else {
            return;
        };
        if !g.holds_json() {
            return;
        }
        let checked = match std::mem::take(&mut g.ask) {
            Ask::Refused(flagged) => {
                let name = rules.asks(Side::Answer).map(|s| s.name.as_str());
                Err(name.filter(|_| flagged).map(By::Service))
            }
            Ask::Masked(mut tree) => {
                // The service's texts, the prompt's values put back.
                check_said(rules, answer, &mut tree, vault, &mut g.verdict, true);
                let mut out = Vec::with_capacity(body.len());
                tree.write(&mut out);
                // What the service flagged is not stored.
                self.forget_answer(env);
                Ok(Checked::Body(out))
            }
            // Read once, when the service was asked: the prompt's values
            // put back now.
            Ask::Read { mut tree, changed } => {
                let restored = restore_said(rules, answer, &mut tree, vault);
                Ok(g.checked(&tree, changed || restored, body.len())
                    .unwrap_or_else(|why| g.unread(rules, why)))
            }
            Ask::No | Ask::Asking { .. } => Ok(g
                .check_json(rules, answer, vault, body)
                .unwrap_or_else(|why| g.unread(rules, why))),
        };
        match checked {
            Ok(Checked::Pass) => {}
            Ok(Checked::Body(b)) => {
                if !host.set_response_body(size, &b) {
                    internal_error(env.metrics, "set_response_body");
                }
            }
            Ok(Checked::Blocked(rule)) => {
                self.refuse_answer(env, host, size, by_rule(rules, rule));
            }
            Err(by) => self.refuse_answer(env, host, size, by),
        }
        self.note_answer(env);
    }

    /// Puts the refusal of the answer (`by` a rule or the service, or
    /// unread) in its place: status, headers and body; nothing of it is
    /// stored.
    fn refuse_answer(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        by: Option<By<'_>>,
    ) {
        let r = blocked_reply(by).in_dialect(self.request.dialect);
        set_response(env, host, ":status", Some(&r.status.to_string()));
        for (name, value) in &r.headers {
            set_response(env, host, name, Some(value));
        }
        if !host.set_response_body(size, &r.body) {
            internal_error(env.metrics, "set_response_body");
        }
        if let Some(g) = self.response.as_mut().and_then(|r| r.guard.as_mut()) {
            g.blocked = true;
        }
        self.forget_answer(env);
    }

    /// Nothing of a refused answer is stored, and calls waiting for it go on.
    pub(super) fn forget_answer(&mut self, env: &mut Env<'_>) {
        self.cache.fill = None;
        self.release_lease(env);
    }

    /// The next piece of a stream whose answer is checked, `bytes` as they
    /// are to pass so far: what passes in their place when it differs.
    pub(super) fn guard_stream(
        &mut self,
        env: &mut Env<'_>,
        bytes: &[u8],
        end: bool,
    ) -> Option<Vec<u8>> {
        let answer = self.request.dialect.answer();
        let g = self.response.as_mut()?.guard.as_mut()?;
        let was = g.blocked;
        let out = g.check_stream(
            &env.config.guardrails,
            answer,
            &mut self.decided.vault,
            bytes,
            end,
        );
        let blocked = g.blocked && !was;
        if blocked {
            self.forget_answer(env);
        }
        if blocked || end {
            self.note_answer(env);
        }
        out
    }

    /// A whole answer the filter sends itself (a cache entry, another
    /// backend's answer), checked: what to send.
    pub(super) fn check_whole(&mut self, env: &mut Env<'_>, stream: bool, body: &[u8]) -> Checked {
        let rules = &env.config.guardrails;
        let answer = self.request.dialect.answer();
        if !checks_answers(rules, &self.decided.vault, answer) {
            return Checked::Pass;
        }
        let mut g = AnswerGuard::new(stream);
        let vault = &mut self.decided.vault;
        let checked = match stream {
            true => g
                .check_stream(rules, answer, vault, body, true)
                .map_or(Checked::Pass, Checked::Body),
            false => g
                .check_json(rules, answer, vault, body)
                .unwrap_or_else(|why| g.unread(rules, why)),
        };
        self.note_guard(env, &mut g);
        checked
    }

    /// Counts the answer's check once it is done.
    fn note_answer(&mut self, env: &mut Env<'_>) {
        if let Some(mut g) = self.response.as_mut().and_then(|r| r.guard.take()) {
            self.note_guard(env, &mut g);
            if let Some(r) = self.response.as_mut() {
                r.guard = Some(g);
            }
        }
    }

    fn note_guard(&mut self, env: &mut Env<'_>, g: &mut AnswerGuard) {
        let api = self.request.dialect.api();
        let mut named = self.decided.guardrails.take().unwrap_or_default();
        g.note(&env.config.guardrails, env.metrics, api, &mut named);
        if named.starts_with(',') {
            named.remove(0);
        }
        self.decided.guardrails = (!named.is_empty()).then_some(named);
    }
}

#[cfg(test)]
mod tests;

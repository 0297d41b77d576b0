//! The shape of one call's state — what the request said, what the filter
//! decided and tells the client, where the call stands, what was decided for
//! the trip upstream, what came back, and the cache's part — and the one place
//! where the call moves from one phase to the next.
//!
//! ```text
//!  request headers ──► Holding ──(body complete)──┐        (a body that streams
//!        │               │                        │         through, or none)
//!        │               └─(watchdog / answered   │
//!        │                  while held)──────────►├──────────────► Forwarded ◄──────────┐
//!        └───────────────────────────────────────►┘  decide        │  │  │              │
//!                                                                   │  │  └─(failure)─► FailingOver
//!   decide ─► Coalescing ─(entry / wait over)─► Forwarded           │  │                 │     │
//!   decide ─► Embedding ──(answered, no hit)──► Forwarded           │  │   (no answer)───┘     │
//!   decide ─► Guarding ──(verdict: go on)──► Forwarded              │  │                       │
//!                                                                   │  └─(hedge won)──┐        │ (answered)
//!   Forwarded ─(4xx a fallback chain names)─► ErrorHeld ─(its class: the
//!     next model asked)─► FailingOver; ─(no class)─► Forwarded
//!   FailingOver ─(that backend failed too: the next one not asked yet)─► FailingOver
//!   any step ─► Answered(status): the filter's own reply            │                 ▼        ▼
//!                                                                   └──────────────► FailedOver ◄┘
//!
//!  hedge: Off ─(armed)─► Armed ─(due)─► Done ─(sent)─► Sent ─(answered / settled)─► Done
//!                          └─(answered first)─► Off
//!
//!  verdict (`guardrails.service.mode: parallel`): Off ─(asked)─► Awaited ─(in)─► Off;
//!    while Awaited the answer's headers and body, and the filter's own
//!    answer, are held (see [`Held`]); an answer outgrowing what is held is
//!    released but for its end, which the verdict lets go or cuts
//! ```
//!
//! Steps ask [`Progress`] for a transition; none assigns a phase itself.

use crate::cache::{CacheStatus, Cacheable, Key, Lease, Seen, StreamAssembler};
use crate::dialect::answer::ErrorClass;
use crate::dialect::request::View;
use crate::dialect::AnyGrammar;
use crate::dialect::Dialect;
use crate::json::Json;
use crate::limits::Admitted;
use crate::priority::Priority;
use crate::routing::affinity;
use crate::routing::hedge::HedgeResult;
use crate::routing::Health;
use crate::shaping::Changes;
use crate::spans::capture;
use crate::spans::{CaptureConfig, Captured, Prompt};
use crate::sse::{self, Collect, Grammar};
use crate::summary::EnvoyReply;
use crate::trace_context::SpanIds;
use crate::usage::{self, Usage};

use std::cell::OnceCell;

use super::answer::AnswerGuard;
use super::body::{BodyCopy, HeldBody};
use crate::guard::Vault;

/// What the request said: its headers, fixed once read, and what its body
/// says, read once when the body is.
#[derive(Debug)]
pub(super) struct Request {
    pub(super) dialect: Dialect,
    pub(super) priority: Priority,
    pub(super) started_ms: u64,
    /// The caller's whole budget, ms.
    pub(super) budget_ms: u64,
    /// The `:path` as received.
    pub(super) path: String,
    /// What the request says, as its dialect reads it: from the path on
    /// request headers, from the held body once it is complete (the model,
    /// the stream, the output cap and temperature for the call's span, the
    /// state it continues, its own `prompt_cache_key`).
    pub(super) view: View,
    /// Copy of a body that streams through, for the model label.
    pub(super) copy: Option<BodyCopy>,
    /// The call's affinity key (see [`crate::routing::affinity`]), read from
    /// the body as the client sent it.
    pub(super) affinity: Option<affinity::Key>,
    /// The prompt as the client sent it, when captured (`tracing.capture`).
    pub(super) prompt: Option<Prompt>,
    /// The host never delivered the body the call waited for.
    pub(super) body_not_delivered: bool,
    /// Who the caller is (see [`crate::identity`]), found on request headers.
    pub(super) tenant: Option<String>,
}

impl Request {
    /// What the held body says (`features`: `None` when it is no request
    /// object); read once, when the body is complete.
    pub(super) fn read_body(&mut self, body: &HeldBody) {
        self.view = View::read(
            self.dialect,
            &self.path,
            body.tree(),
            body.features.as_ref(),
        );
    }

    /// The body streams through the filter: a bounded copy is kept of it.
    pub(super) fn streams_through(&mut self) {
        self.copy = Some(BodyCopy::default());
    }
}

/// The output token cap a request body of `dialect` names, when a whole number.
pub(super) fn token_cap(dialect: Dialect, tree: &Json) -> Option<u64> {
    dialect.request().output_cap(tree)
}

/// The limits' part in one call (see `walk::limits`).
#[derive(Debug, Default)]
pub(super) struct LimitsCall {
    /// What it reserved, and what is left.
    pub(super) admitted: Admitted,
    /// Its prompt's estimated tokens.
    pub(super) prompt_tokens: u64,
    /// The output tokens it reserved.
    pub(super) reserved_output: u64,
    /// When the reservation was made, ms.
    pub(super) at_ms: u64,
    /// Whom it counts under: the tenant's id and label, the user; a move to
    /// another model reserves under its rules for the same.
    pub(super) tenant: Option<String>,
    pub(super) tenant_label: String,
    pub(super) user: Option<String>,
    /// The output cap it names.
    pub(super) max_tokens: Option<u64>,
}

/// What the filter decided for the call and tells the client about it (see
/// [`super::Call::client_headers`]).
#[derive(Debug, Default)]
pub(super) struct Decided {
    /// The trace id that went upstream.
    pub(super) trace_id: Option<String>,
    /// The index of the call's A/B group, once it joined one.
    pub(super) group: Option<usize>,
    /// What shaping changed in the body sent.
    pub(super) shaped: Changes,
    /// The prompt-cache markers the filter put on the body sent.
    pub(super) cache_markers: u32,
    /// The degrade level an action of which changed the call.
    pub(super) degraded: Option<u8>,
    /// The cache answered in place of the backend (`x-downgrade: cache`).
    pub(super) downgraded: bool,
    /// The model degrade switched the call to, in place of the requested one.
    pub(super) fallback_model: Option<String>,
    /// The `:path` with that model, for a dialect naming it there.
    pub(super) path: Option<String>,
    /// The filter asked the provider for the stream's usage on the client's
    /// behalf: the usage-only chunk is removed again on the way back.
    pub(super) usage_asked: bool,
    /// The ids of the span the filter's `traceparent` names.
    pub(super) span: Option<SpanIds>,
    /// How the call's hedge ended, when one was sent.
    pub(super) hedge: Option<HedgeResult>,
    /// What the call reserved under the limits.
    pub(super) limits: Option<LimitsCall>,
    /// The prompt-token estimate's calibration, once read, and the estimate
    /// of the body sent.
    pub(super) estimate: super::estimate::Estimate,
    /// The guardrail rules that fired, as `rule:action` joined by commas
    /// (`rule:action:answer` for those that fired on the answer).
    pub(super) guardrails: Option<String>,
    /// When the guardrail service was asked, ms, and about how many texts.
    pub(super) verdict: Option<(u64, usize)>,
    /// The values masked in the prompt, by placeholder.
    pub(super) vault: Vault,
}

/// Where a call stands. The phases with nothing but a timer to wake them are
/// the parked ones (see [`Progress::is_parked`]).
#[derive(Debug)]
pub(super) enum Phase {
    /// The body is held until its end to decide on it. Until the first body
    /// callback shows the host delivers bodies, a watchdog runs from
    /// `watchdog_since_ms`: without `allow_on_headers_stop_iteration` Envoy
    /// never does, and the request then goes on untouched.
    Holding { watchdog_since_ms: Option<u64> },
    /// Waiting for an identical call in flight to store its answer, until
    /// `deadline_ms` at the latest (see [`crate::cache::coalesce`]); the held
    /// body is kept to route the call if the wait ends without an answer.
    Coalescing { deadline_ms: u64, body: HeldBody },
    /// Waiting for the embedding of the question, asked after an exact
    /// miss (see [`crate::cache::semantic`]); the callout's own timeout ends
    /// the wait, and the held body goes upstream if nothing matches.
    Embedding { body: HeldBody },
    /// Waiting for the guardrail service's verdict on the prompt (see
    /// [`crate::guard::service`]); the callout's own timeout ends the wait.
    Guarding { body: HeldBody },
    /// Decided (or streaming through): the request goes on to the upstream.
    Forwarded,
    /// The chosen backend failed the call retriably; its response is held
    /// while another backend of the model is asked (see [`crate::routing::failover`]).
    FailingOver,
    /// The chosen backend refused the call with an error a fallback chain
    /// may answer; its response is held to its end to read the error's class
    /// (see [`crate::routing::fallback`]).
    ErrorHeld,
    /// Another backend answered the call in place of the one that failed it;
    /// the response is that backend's.
    FailedOver,
    /// The filter answered the call itself with this status.
    Answered(u16),
}

/// Where the hedge of a slow call stands (see [`crate::routing::hedge`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Hedge {
    /// The call is not hedged.
    #[default]
    Off,
    /// Sent to another backend at this time unless the backend answered.
    Armed { at_ms: u64 },
    /// Sent to this cluster; its answer is not in yet.
    Sent { cluster: String },
    /// Settled: won, lost or given up.
    Done,
}

/// What a parked call waits for the timer for: each tick goes on by it (a
/// new kind of timed wait is one more variant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// The first body callback, since `since_ms` (see [`Phase::Holding`]).
    BodyWatchdog { since_ms: u64 },
    /// An identical call's answer, until `deadline_ms`.
    Coalescing { deadline_ms: u64 },
    /// The hedge's time, `at_ms`.
    Hedge { at_ms: u64 },
}

/// What of a call's answer is held while a verdict asked in parallel is
/// awaited: it goes on, or is refused, when the verdict is in.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// The response's headers came (with the end of the stream: `true`).
    pub(super) headers: Option<bool>,
    /// The body Envoy buffered meanwhile: its size, and whether it ended.
    pub(super) body: Option<(usize, bool)>,
    /// The filter's own answer (a cache entry's): status, headers, body
    /// and the cache's result it tells.
    pub(super) reply: Option<HeldReply>,
    /// The answer outgrew what the proxy holds before the verdict came: it
    /// goes on as it comes, but for its end. (A build without guardrails
    /// awaits no verdict.)
    #[cfg(feature = "guardrails")]
    pub(super) released: bool,
    /// The end of a released answer, held until the verdict: its size.
    #[cfg(feature = "guardrails")]
    pub(super) end: Option<usize>,
}

/// A local answer held for the verdict.
pub(super) type HeldReply = (u32, Vec<(String, String)>, Vec<u8>, Option<CacheStatus>);

/// Where the call and its hedge stand; every transition of the diagram above
/// is one method here, and checks the phase it starts from.
#[derive(Debug)]
pub(super) struct Progress {
    phase: Phase,
    hedge: Hedge,
    /// A verdict asked in parallel with the trip upstream, while awaited.
    verdict: Option<Held>,
    /// Transitions asked from a phase the diagram has none from (see
    /// [`Progress::check`]).
    strays: u32,
}

impl Progress {
    /// A call that goes on as it came (until it holds its body).
    pub(super) fn new() -> Self {
        Self {
            phase: Phase::Forwarded,
            hedge: Hedge::Off,
            verdict: None,
            strays: 0,
        }
    }

    /// A transition to `to` from where the call stands, allowed (`ok`) by
    /// the diagram or not: one that is not is a bug of the walk. A test
    /// fails on it; in production the transition is made all the same (as
    /// the walk asked) and counted, see [`Progress::strays`].
    fn check(&mut self, ok: bool, to: &str) {
        if ok {
            return;
        }
        #[cfg(test)]
        panic!(
            "no transition to {to} from {:?} (hedge {:?})",
            self.phase, self.hedge
        );
        #[cfg(not(test))]
        {
            let _ = to;
            self.strays = self.strays.saturating_add(1);
        }
    }

    /// Transitions asked from a phase the diagram has none from, for the
    /// call's end to count (`llm_filter_internal_errors_total{reason="phase"}`).
    pub(super) fn strays(&self) -> u32 {
        self.strays
    }

    /// Where the call stands.
    pub(super) fn phase(&self) -> &Phase {
        &self.phase
    }

    /// True while the call waits for a timer rather than for Envoy.
    pub(super) fn is_parked(&self) -> bool {
        self.timer().is_some()
    }

    /// What the call waits for the timer for, if anything: the phase's
    /// wait first, then the hedge's.
    pub(super) fn timer(&self) -> Option<Timer> {
        match self.phase {
            Phase::Holding {
                watchdog_since_ms: Some(since_ms),
            } => Some(Timer::BodyWatchdog { since_ms }),
            Phase::Coalescing { deadline_ms, .. } => Some(Timer::Coalescing { deadline_ms }),
            _ => match self.hedge {
                Hedge::Armed { at_ms } => Some(Timer::Hedge { at_ms }),
                _ => None,
            },
        }
    }

    /// The body is held from `now_ms`, under the watchdog.
    pub(super) fn hold(&mut self, now_ms: u64) {
        self.check(matches!(self.phase, Phase::Forwarded), "Holding");
        self.phase = Phase::Holding {
            watchdog_since_ms: Some(now_ms),
        };
    }

    /// A body callback came: the host delivers bodies, the watchdog stops.
    /// True while the body is held.
    pub(super) fn body_seen(&mut self) -> bool {
        match &mut self.phase {
            Phase::Holding { watchdog_since_ms } => {
                *watchdog_since_ms = None;
                true
            }
            _ => false,
        }
    }

    /// The request goes on to the upstream: decided, given up on holding,
    /// or back from a failover no other backend answered.
    pub(super) fn forward(&mut self) {
        let ok = matches!(
            self.phase,
            Phase::Holding { .. } | Phase::Forwarded | Phase::ErrorHeld | Phase::FailingOver
        );
        self.check(ok, "Forwarded");
        self.phase = Phase::Forwarded;
    }

    /// The call waits for an identical one in flight, until `deadline_ms`.
    pub(super) fn coalesce(&mut self, deadline_ms: u64, body: HeldBody) {
        self.check(matches!(self.phase, Phase::Forwarded), "Coalescing");
        self.phase = Phase::Coalescing { deadline_ms, body };
    }

    /// The call waits for its question's embedding.
    pub(super) fn embed(&mut self, body: HeldBody) {
        self.check(matches!(self.phase, Phase::Forwarded), "Embedding");
        self.phase = Phase::Embedding { body };
    }

    /// The call waits for the guardrail service's verdict.
    pub(super) fn guard(&mut self, body: HeldBody) {
        self.check(matches!(self.phase, Phase::Forwarded), "Guarding");
        self.phase = Phase::Guarding { body };
    }

    /// A wait (coalescing, embedding, a verdict) is over: the call goes on, with the
    /// body it kept; `None` when it was not waiting.
    pub(super) fn stop_waiting(&mut self) -> Option<HeldBody> {
        match std::mem::replace(&mut self.phase, Phase::Forwarded) {
            Phase::Coalescing { body, .. }
            | Phase::Embedding { body }
            | Phase::Guarding { body } => Some(body),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// The call goes upstream while its verdict is awaited.
    pub(super) fn await_verdict(&mut self) {
        self.check(self.verdict.is_none(), "verdict Awaited");
        self.verdict = Some(Held::default());
    }

    /// A verdict asked in parallel is awaited.
    pub(super) fn awaits_verdict(&self) -> bool {
        // A build without guardrails asks none: its hooks compile away.
        cfg!(feature = "guardrails") && self.verdict.is_some()
    }

    /// What is held for the awaited verdict, to add to; `None` when none
    /// is awaited, or the answer was released before it.
    pub(super) fn held(&mut self) -> Option<&mut Held> {
        // A build without guardrails asks none: its hooks compile away.
        #[cfg(not(feature = "guardrails"))]
        return None;
        #[cfg(feature = "guardrails")]
        self.verdict.as_mut().filter(|h| !h.released)
    }

    /// What is held of an answer released before its verdict (its end).
    #[cfg(feature = "guardrails")]
    pub(super) fn released(&mut self) -> Option<&mut Held> {
        self.verdict.as_mut().filter(|h| h.released)
    }

    /// The verdict is in: what was held for it.
    pub(super) fn verdict_in(&mut self) -> Option<Held> {
        self.verdict.take()
    }

    /// The backend refused the call; its error is held to be read.
    pub(super) fn hold_error(&mut self) {
        self.check(matches!(self.phase, Phase::Forwarded), "ErrorHeld");
        self.phase = Phase::ErrorHeld;
    }

    /// The backend failed the call; its response is held while another is asked.
    pub(super) fn fail_over(&mut self) {
        // From a failure just read, a held error, or a fallback's answer
        // that the chain moves on from.
        let ok = matches!(
            self.phase,
            Phase::Forwarded | Phase::ErrorHeld | Phase::FailingOver
        );
        self.check(ok, "FailingOver");
        self.phase = Phase::FailingOver;
    }

    /// Another backend's answer reached the client.
    pub(super) fn failed_over(&mut self) {
        // The other backend's answer, or a hedge's that beat the backend.
        let ok = matches!(self.phase, Phase::FailingOver | Phase::Forwarded);
        self.check(ok, "FailedOver");
        self.phase = Phase::FailedOver;
    }

    /// Another backend's answer went out (`Call::reply_with`), or the
    /// guardrails' refusal in its place, which answered the call already.
    pub(super) fn answered_elsewhere(&mut self) {
        if !matches!(self.phase, Phase::Answered(_)) {
            self.failed_over();
        }
    }

    /// The filter answered the call with `status`.
    pub(super) fn answered(&mut self, status: u32) {
        // Never twice, nor once another backend's answer went out.
        let ok = !matches!(self.phase, Phase::Answered(_) | Phase::FailedOver);
        self.check(ok, "Answered");
        self.phase = Phase::Answered(u16::try_from(status).unwrap_or(u16::MAX));
    }

    /// The hedge goes out at `at_ms` unless the backend answers first.
    pub(super) fn arm_hedge(&mut self, at_ms: u64) {
        self.check(self.hedge == Hedge::Off, "hedge Armed");
        self.hedge = Hedge::Armed { at_ms };
    }

    /// The backend answered before the hedge was due: no hedge.
    pub(super) fn disarm_hedge(&mut self) {
        self.check(matches!(self.hedge, Hedge::Armed { .. }), "hedge Off");
        self.hedge = Hedge::Off;
    }

    /// The hedge was due: it is sent now (see [`Self::hedge_sent`]) or never.
    pub(super) fn hedge_due(&mut self) {
        self.check(matches!(self.hedge, Hedge::Armed { .. }), "hedge Done");
        self.hedge = Hedge::Done;
    }

    /// The hedge went to `cluster`.
    pub(super) fn hedge_sent(&mut self, cluster: String) {
        self.check(self.hedge == Hedge::Done, "hedge Sent");
        self.hedge = Hedge::Sent { cluster };
    }

    /// The cluster the hedge went to, while its answer is not in.
    pub(super) fn hedge_out(&self) -> Option<&str> {
        match &self.hedge {
            Hedge::Sent { cluster } => Some(cluster),
            _ => None,
        }
    }

    /// Settles the hedge: the cluster it went to, when it was out.
    pub(super) fn settle_hedge(&mut self) -> Option<String> {
        match std::mem::replace(&mut self.hedge, Hedge::Done) {
            Hedge::Sent { cluster } => Some(cluster),
            _ => None,
        }
    }
}

/// What was decided for the trip upstream.
#[derive(Debug, Default)]
pub(super) struct Dispatch {
    /// The cluster routing chose.
    pub(super) cluster: Option<String>,
    /// The breaker the call went under, once admitted with a budget plan.
    pub(super) breaker: Option<String>,
    /// Retries the plan let Envoy make (`x-envoy-max-retries` as sent).
    pub(super) planned_retries: u32,
    /// The model routing chose (a rule's pick or the requested one).
    pub(super) model: Option<String>,
    /// The routed model has more than one backend.
    pub(super) alternatives: bool,
    /// The health of the backend a hedge would go to, as routing read it.
    pub(super) elsewhere: Option<Health>,
    /// The call moved along its model's fallback chain.
    pub(super) fallback: Option<FellBack>,
    /// The request body, kept while another backend could still be asked.
    pub(super) held: Option<HeldBody>,
    /// The clusters the call asked besides the one it is on (those it
    /// failed over from, a hedge's that lost, a model's it fell back from):
    /// never asked again for the same model. At most `budget.max_retries` +
    /// 1 + the chain's models (see `walk::failover`).
    pub(super) asked: Vec<String>,
    /// The load record the call is counted in flight in: its model's label,
    /// or the overflow record's (see [`crate::load::started`]); it leaves
    /// that count at the call's end.
    pub(super) load_model: Option<String>,
    /// The client's credentials were taken off the request: its first
    /// backend is mesh-credentialed.
    pub(super) keyless: bool,
}

/// Where a call stands on its model's fallback chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FellBack {
    /// The model whose chain it is: the one the call was first routed to.
    pub(super) from: String,
    /// Why it last moved on.
    pub(super) class: ErrorClass,
    /// Models of the chain asked so far.
    pub(super) step: usize,
    /// How many clusters the call had asked when it reached this model:
    /// those after are this model's walk's (see `walk::failover`).
    pub(super) asked: usize,
}

/// The response of a call that went upstream.
#[derive(Debug)]
pub(super) struct Response {
    /// Its status, when it parsed.
    pub(super) status: Option<u16>,
    /// When its headers arrived, ms.
    pub(super) headers_ms: u64,
    /// When its first body byte passed, ms.
    pub(super) first_byte_ms: Option<u64>,
    /// Envoy's attempt count (`x-envoy-attempt-count`).
    pub(super) attempts: Option<u32>,
    /// The backend's `x-should-retry`, when it said `true` or `false`.
    pub(super) should_retry: Option<bool>,
    /// Why Envoy itself answered, if it did.
    pub(super) envoy: Option<EnvoyReply>,
    /// The answer as it passes.
    pub(super) answer: Answer,
    /// A body to put in place of the response's (Envoy's timeout page, a
    /// stale cache entry).
    pub(super) replacement: Option<Vec<u8>>,
    /// The response's end passed (its last body chunk, or headers alone).
    pub(super) ended: bool,
    /// The completion as captured, once asked for (`tracing.capture`).
    pub(super) completion: OnceCell<Option<Captured>>,
    /// The answer's check by the guardrails, when the call has one.
    pub(super) guard: Option<AnswerGuard>,
    /// What of an answer released before its verdict was kept back from
    /// the client: its last event or byte so far (see `Call::keep_back`).
    pub(super) kept: Vec<u8>,
}

/// The answer as it passes.
#[derive(Debug)]
pub(super) enum Answer {
    /// An SSE stream, read as it passes (usage, the strip of the usage-only
    /// chunk the client did not ask for, the cache's assembler).
    Stream(sse::Stream<AnyGrammar>),
    /// Any other body, copied aside up to a bound; its usage and id read at
    /// its end.
    Json { copy: BodyCopy, head: usage::Head },
}

impl Response {
    /// The answer of another backend that a callout brought back at `now_ms`,
    /// and the body the client gets in its place when that differs (`strip`:
    /// without the usage-only chunk of a stream).
    pub(super) fn from_callout(
        dialect: Dialect,
        status: u16,
        stream: bool,
        strip: bool,
        capture: &CaptureConfig,
        body: &[u8],
        now_ms: u64,
    ) -> (Self, Option<Vec<u8>>) {
        let mut stripped = None;
        let answer = if stream {
            let mut sse = sse::Stream::with_grammar(dialect.answer().grammar());
            if strip {
                sse.strip_usage();
            }
            if capture.completion {
                sse.keep_text(capture::transcript_bytes(capture));
            }
            stripped = sse.feed(body, true, None);
            Answer::Stream(sse)
        } else {
            let mut copy = BodyCopy::default();
            copy.append(body);
            Answer::Json {
                copy,
                head: dialect.answer().head(body),
            }
        };
        let response = Self {
            status: Some(status),
            headers_ms: now_ms,
            first_byte_ms: (!body.is_empty()).then_some(now_ms),
            attempts: None,
            should_retry: None,
            envoy: None,
            answer,
            replacement: None,
            ended: true,
            completion: OnceCell::new(),
            guard: None,
            kept: Vec::new(),
        };
        (response, stripped)
    }

    /// The completion, captured once when `cfg` asks (a 2xx answer only):
    /// from the stream's kept text, or from the JSON answer's copy.
    pub(super) fn completion(&self, dialect: Dialect, cfg: &CaptureConfig) -> Option<&Captured> {
        if !cfg.completion || !self.status.is_some_and(|s| (200..300).contains(&s)) {
            return None;
        }
        self.completion
            .get_or_init(|| match &self.answer {
                Answer::Stream(sse) => {
                    let g = sse.grammar();
                    let t = g.transcript()?;
                    capture::streamed(cfg, t, &g.finish_reasons().as_strs())
                }
                Answer::Json { copy, .. } => {
                    let tree = crate::json::Json::parse(copy.bytes()?)?;
                    capture::completion(cfg, dialect, &tree)
                }
            })
            .as_ref()
    }

    /// Tokens the provider reported.
    pub(super) fn usage(&self) -> Option<Usage> {
        match &self.answer {
            Answer::Stream(sse) => sse.usage(),
            Answer::Json { head, .. } => head.usage,
        }
    }

    /// The id of the response, when the answer gave one.
    pub(super) fn id(&self) -> Option<&str> {
        match &self.answer {
            Answer::Stream(sse) => sse.grammar().response_id(),
            Answer::Json { head, .. } => head.id.as_deref(),
        }
    }

    /// Why the answer ended, when it said.
    pub(super) fn finish_reasons(&self) -> Vec<&str> {
        match &self.answer {
            Answer::Stream(sse) => sse.grammar().finish_reasons().as_strs(),
            Answer::Json { head, .. } => head.finish_reasons(),
        }
    }

    /// The model that answered, when a JSON answer named it.
    pub(super) fn model(&self) -> Option<&str> {
        match &self.answer {
            Answer::Stream(_) => None,
            Answer::Json { head, .. } => head.model.as_deref(),
        }
    }

    /// Data events of a streamed answer so far; 0 for any other.
    pub(super) fn events(&self) -> u64 {
        match &self.answer {
            Answer::Stream(sse) => sse.events(),
            Answer::Json { .. } => 0,
        }
    }

    /// The answer is an SSE stream.
    pub(super) fn is_stream(&self) -> bool {
        matches!(self.answer, Answer::Stream(_))
    }

    /// The JSON answer copied so far; `None` for a stream or a copy past its bound.
    pub(super) fn json(&self) -> Option<&[u8]> {
        match &self.answer {
            Answer::Json { copy, .. } => copy.bytes(),
            Answer::Stream(_) => None,
        }
    }

    /// The answer is a stream whose grammar saw it complete.
    pub(super) fn finished(&self) -> bool {
        match &self.answer {
            Answer::Stream(sse) => sse.grammar().finished(),
            Answer::Json { .. } => false,
        }
    }

    /// The upstream failed the call (5xx, or Envoy's timeout).
    pub(super) fn failed(&self) -> bool {
        self.envoy == Some(EnvoyReply::Timeout)
            || self.status.is_some_and(|s| (500..=599).contains(&s))
    }
}

/// The cache's part in one call.
#[derive(Debug, Default)]
pub(super) struct CacheCall {
    /// How the cache served the call; `None` when the cache is off.
    pub(super) status: Option<CacheStatus>,
    /// Key and delivery of a cacheable call.
    pub(super) cacheable: Option<Cacheable>,
    /// The lead on the key's in-flight marker, held until the answer is
    /// stored or given up.
    pub(super) lease: Option<Lease>,
    /// The key's slots as the missed lookup read them, for the insert.
    pub(super) seen: Seen,
    /// The answer being collected to store.
    pub(super) fill: Option<Fill>,
    /// The semantic cache's part, when the call takes part.
    pub(super) semantic: Option<SemanticCall>,
    /// The shard header the request came with (removed from it), checked
    /// against the key this filter computes in `local` mode.
    pub(super) shard_key: Option<String>,
    /// The call's A/B group turned the cache off.
    pub(super) group_off: bool,
}

/// A call's part in the semantic cache.
#[derive(Debug)]
pub(super) struct SemanticCall {
    /// The call's context key.
    pub(super) context: Key,
    /// When the embeddings callout was sent, ms.
    pub(super) sent_ms: u64,
    /// The question's unit vector, once it came: added to the index with
    /// the answer.
    pub(super) vector: Option<Vec<f32>>,
}

/// How an answer is collected to store.
#[derive(Debug)]
pub(super) enum Fill {
    /// A non-streamed answer, bounded by `cache.max_entry_bytes`; the bytes
    /// are the response's own copy (see [`Response::json`]).
    Json,
    /// A streamed answer, rebuilt event by event.
    Sse(StreamAssembler),
    /// A streamed answer kept as the upstream sent it (Responses, Messages):
    /// its bytes, bounded by `cache.max_entry_bytes`.
    Verbatim(BodyCopy),
}

impl Fill {
    /// What takes a streamed answer's events as they are read.
    pub(super) fn collector(&mut self) -> Option<&mut dyn Collect> {
        match self {
            // A build without the cache fills none (its assembler is then
            // not in the module).
            Fill::Sse(asm) if crate::build::CACHE => Some(asm),
            Fill::Json | Fill::Verbatim(_) | Fill::Sse(_) => None,
        }
    }
}

impl CacheCall {
    /// A call's cache state: `BYPASS` until the body says otherwise, nothing
    /// at all when this proxy keeps no cache (off, or `shard` mode, where the
    /// next tier's `x-cache` reaches the client unchanged). `shard_key`: the
    /// shard header the request came with.
    pub(super) fn new(local: bool, shard_key: Option<String>) -> Self {
        Self {
            status: local.then_some(CacheStatus::Bypass),
            shard_key,
            ..Self::default()
        }
    }

    /// A JSON answer is being collected to store.
    pub(super) fn stores_json(&self) -> bool {
        matches!(self.fill, Some(Fill::Json))
    }
}

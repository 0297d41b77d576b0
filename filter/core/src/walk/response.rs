//! What came back for a call that went upstream: status, timings and the
//! answer as it passes (an SSE stream scanned event by event, or a JSON body
//! copied aside and parsed once at its end), with Envoy's own timeout page
//! put in OpenAI's shape.

use serde_json::Value;

use crate::budget::reply::{self, LocalReply};
use crate::cache::entry::SSE_CONTENT_TYPE;
use crate::dialect::answer::ReplyKind;
use crate::dialect::{provider, Dialect};
use crate::metrics::internal_error;
use crate::routing::failover;
use crate::spans::capture;
use crate::sse;
use crate::summary::EnvoyReply;
use crate::usage;

use super::credentials::credential_unavailable;
use super::state::{Answer, Fill, Response};
use super::{set_response, BodyCopy, Call, Env, Host, Phase, Step};

impl Call {
    /// Response headers callback; `end_of_stream` when no body follows.
    pub fn on_response_headers(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        end_of_stream: bool,
    ) -> Step {
        match self.progress.phase() {
            // The filter's own answer passing through.
            Phase::Answered(_) | Phase::FailedOver => return Step::Continue,
            // Answered while its body was still held (Envoy refused it): no
            // body callback is to come, and nothing waits for one.
            Phase::Holding { .. } => self.progress.forward(),
            _ => {}
        }
        if let Some(held) = self.progress.held() {
            // The guardrail service's verdict is not in: read when it is.
            held.headers = Some(end_of_stream);
            return Step::Pause;
        }
        let dialect = self.request.dialect;
        let keyless = self.dispatch.keyless;
        let mut response = Response::read(host, dialect, env.now_ms, end_of_stream, keyless);
        if let (Answer::Stream(sse), true) = (&mut response.answer, env.config.capture.completion) {
            sse.keep_text(capture::transcript_bytes(&env.config.capture));
        }
        if response.envoy == Some(EnvoyReply::NoCredential) {
            credential_unavailable(env, self.dispatch.cluster.as_deref());
        }
        response.replacement = rewrite_envoy_reply(env, host, dialect, response.envoy);
        if self.decided.usage_asked {
            if let Answer::Stream(sse) = &mut response.answer {
                sse.strip_usage();
                // The stream the client gets is shorter than the one sent.
                set_response(env, host, "content-length", None);
            }
        }
        let stream = matches!(response.answer, Answer::Stream(_));
        self.response = Some(response);
        let hold = self.guard_answer_headers(env, host, end_of_stream, stream);
        let told = self.client_headers(
            env.config,
            self.dispatch.cluster.as_deref(),
            self.cache.status,
        );
        for (name, value) in &told {
            set_response(env, host, name, Some(value));
        }
        self.cache_on_response_headers(env, host);
        if end_of_stream {
            self.write_record(env, host, None);
        }
        match self.fail_over(env, host) {
            // A JSON answer the guardrails check is held to its end.
            Step::Continue if hold => Step::Pause,
            Step::Continue => self.hold_error(env, end_of_stream),
            step => step,
        }
    }

    /// Response body callback (called again when a verdict on the answer
    /// comes: kept whole once, not inlined there).
    #[inline(never)]
    pub fn on_response_body(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        size: usize,
        end_of_stream: bool,
    ) -> Step {
        match self.progress.phase() {
            Phase::Answered(_) | Phase::FailedOver => return Step::Continue,
            // The failed answer must not reach the client while another
            // backend is asked.
            Phase::FailingOver => return Step::Pause,
            _ => {}
        }
        if let Some(step) = self.hold_for_verdict(env, host, size, end_of_stream) {
            return step;
        }
        let Some(response) = self.response.as_mut() else {
            return Step::Continue;
        };
        if size > 0 && response.first_byte_ms.is_none() {
            response.first_byte_ms = Some(env.now_ms);
        }
        response.ended |= end_of_stream;
        if matches!(self.progress.phase(), Phase::ErrorHeld) {
            // An error a fallback chain may answer, read whole at its end.
            return self.error_body(env, host, size, end_of_stream);
        }
        if let Some(step) = self.guard_held_json(env, host, size, end_of_stream) {
            return step;
        }
        let Some(response) = self.response.as_mut() else {
            return Step::Continue;
        };
        if let Some(new_body) = response.replacement.as_ref() {
            if !end_of_stream {
                return Step::Pause;
            }
            if !host.set_response_body(size, new_body) {
                internal_error(env.metrics, "set_response_body");
            }
            return Step::Continue;
        }
        let chunk = if size == 0 {
            None
        } else {
            host.response_body(size)
        };
        let outgoing = match &mut response.answer {
            Answer::Stream(sse) => {
                // One reading of the stream: usage, strip and cache assembler.
                let original = chunk.as_deref().unwrap_or_default();
                let collect = self.cache.fill.as_mut().and_then(Fill::collector);
                let stripped = sse.feed(original, end_of_stream, collect);
                let passing = stripped.as_deref().unwrap_or(original);
                let checked = match response.guard.is_some() {
                    true => self.guard_stream(env, passing, end_of_stream),
                    false => None,
                };
                checked.or(stripped)
            }
            Answer::Json { copy, .. } => {
                if let Some(chunk) = &chunk {
                    copy.append(chunk);
                }
                None
            }
        };
        let original = chunk.as_deref().unwrap_or_default();
        if let Some(out) = self.keep_back(outgoing, original, end_of_stream) {
            if !host.set_response_body(size, &out) {
                internal_error(env.metrics, "set_response_body");
            }
        }
        // The JSON answer is parsed once at its end, for its usage and, when
        // it is to be stored, for its entry.
        let tree = end_of_stream.then(|| self.finish_json()).flatten();
        if end_of_stream {
            self.guard_json_end(env, host, size, chunk.as_deref().unwrap_or_default());
        }
        self.cache_on_response_body(env, size, chunk.as_deref(), end_of_stream, tree.as_ref());
        if end_of_stream {
            self.write_record(env, host, None);
        }
        Step::Continue
    }

    /// Reads the usage and id of a complete JSON answer; returns the parsed answer
    /// when the cache will store it.
    fn finish_json(&mut self) -> Option<Value> {
        let for_cache = self.cache.stores_json();
        let dialect = self.request.dialect.answer();
        let response = self.response.as_mut()?;
        let Answer::Json { copy, head } = &mut response.answer else {
            return None;
        };
        let bytes = copy.bytes()?;
        // The usage is read from the bytes even when the tree is parsed too:
        // reading it from the tree as well would compile a second reader of
        // the answer's head into the module (some 6 KB) for a parse that
        // only answers the cache stores pay.
        *head = dialect.head(bytes);
        for_cache
            .then(|| serde_json::from_slice::<Value>(bytes).ok())
            .flatten()
    }
}

impl Response {
    /// The response whose headers `host` holds, read at `now_ms`, of a
    /// call that left `keyless` (with the mesh's credential alone).
    fn read(
        host: &dyn Host,
        dialect: Dialect,
        now_ms: u64,
        end_of_stream: bool,
        keyless: bool,
    ) -> Self {
        let status = host
            .response_header(":status")
            .and_then(|s| s.parse::<u16>().ok());
        let stream = host
            .response_header("content-type")
            .is_some_and(|c| c.contains(SSE_CONTENT_TYPE));
        // Envoy's own replies that the walk reads the reason of are 5xx, 413
        // and the credential injector's 401. A provider's 401 to a keyless
        // call refused the mesh's credential, the only one it carried (an
        // OAuth2 token Envoy holds past its expiry while its token endpoint
        // fails): the gateway's fault as much as a missing one.
        let envoy = status
            .filter(|s| *s >= 500 || *s == 413 || *s == 401)
            .and_then(|s| EnvoyReply::of(s, host.response_code_details().as_deref()))
            .or_else(|| (keyless && status == Some(401)).then_some(EnvoyReply::NoCredential));
        Self {
            // What the client gets: a missing mesh credential is the
            // gateway's fault, never a 401 blamed on the app's key.
            status: match envoy {
                Some(EnvoyReply::NoCredential) => Some(503),
                _ => status,
            },
            headers_ms: now_ms,
            first_byte_ms: None,
            attempts: host
                .response_header("x-envoy-attempt-count")
                .and_then(|s| s.trim().parse().ok()),
            should_retry: failover::told(
                host.response_header(reply::SHOULD_RETRY).as_deref(),
                host.response_header(provider::ERROR_TYPE).as_deref(),
            ),
            envoy,
            answer: if stream {
                Answer::Stream(sse::Stream::with_grammar(dialect.answer().grammar()))
            } else {
                Answer::Json {
                    copy: BodyCopy::default(),
                    head: usage::Head::default(),
                }
            },
            replacement: None,
            ended: end_of_stream,
            completion: std::cell::OnceCell::new(),
            guard: None,
            kept: Vec::new(),
        }
    }
}

/// Envoy's plain-text pages the client gets in its dialect's error shape
/// instead (its timeout, its 413, the credential injector's 401): sets that
/// reply's headers and status and returns its body.
fn rewrite_envoy_reply(
    env: &mut Env<'_>,
    host: &mut dyn Host,
    dialect: Dialect,
    envoy: Option<EnvoyReply>,
) -> Option<Vec<u8>> {
    let kind = match envoy? {
        EnvoyReply::Timeout => ReplyKind::UpstreamTimeout,
        EnvoyReply::TooLarge => ReplyKind::TooLarge,
        EnvoyReply::NoCredential => ReplyKind::NoCredential,
        EnvoyReply::Reset => return None,
    };
    let r = reply::local_reply(kind, None).in_dialect(dialect);
    Some(reply_in_place(env, host, r))
}

/// Puts the head of `r` in place of the upstream's (its status and headers,
/// no length: its body replaces the upstream's as it streams) and returns
/// its body.
pub(super) fn reply_in_place(env: &mut Env<'_>, host: &mut dyn Host, r: LocalReply) -> Vec<u8> {
    for (name, value) in &r.headers {
        set_response(env, host, name, Some(value));
    }
    set_response(env, host, ":status", Some(&r.status.to_string()));
    set_response(env, host, "content-length", None);
    r.body
}

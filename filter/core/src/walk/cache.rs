//! The cache's steps in the request walk: answer from an entry before routing
//! and admission, let identical calls in flight wait for one another, store
//! what comes back as it passes (a stream still reaches the client chunk by
//! chunk), and answer an upstream failure with an expired entry when allowed.

use std::ops::ControlFlow;

use serde_json::Value;

use crate::cache::entry::SSE_CONTENT_TYPE;
use crate::cache::{
    self as policy, coalesce, kept_as_sent, key_hex, BypassReason, CacheRequest, CacheStatus,
    Cacheable, Claim, Decision, Delivery, Entry, EntryError, Lookup, Mode, Poll, Reply, Store,
    StreamAssembler, AGE_HEADER, X_CACHE,
};
use crate::host::Metrics;
use crate::json::Json;
use crate::metrics::{self as names, internal_error};
use crate::summary::EnvoyReply;

use super::answer::{blocked_reply, by_rule, Checked};
use super::state::{Answer, Fill, Response};
use super::{set_request, set_response, BodyCopy, Call, Env, Flow, HeldBody, Host, Step, Wake};

impl Call {
    /// The cache step of the walk, on the whole request body (`None`: not
    /// held): settled when the call was answered from an entry or waits for
    /// an identical call in flight (which keeps the body); else on upstream.
    pub(super) fn cache_request(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        let config = env.config;
        let cfg = &config.cache;
        // Off for this call: the top-level switch, or its A/B group's.
        if !cfg.enabled || self.cache.group_off {
            return ControlFlow::Continue(body);
        }
        let decision = match &body {
            None => Decision::Bypass(BypassReason::Unbuffered),
            Some(b) => self.cache_decision(env, host, b.tree()),
        };
        if cfg.mode == Mode::Shard {
            // The replica that owns the key does the rest; this proxy only
            // tells the load balancer which one that is. No route refresh:
            // the router hashes the header when it picks the host.
            if let Decision::Cacheable(c) = decision {
                set_request(env, host, &cfg.shard_header, Some(&key_hex(&c.key)));
                count_shard_key(env.metrics, "written");
            }
            return ControlFlow::Continue(body);
        }
        self.check_shard_key(env, &decision);
        let c = match decision {
            Decision::Bypass(reason) => {
                log::debug!("llm-filter: cache bypass ({})", reason.as_str());
                self.cache.status = Some(CacheStatus::Bypass);
                return ControlFlow::Continue(body);
            }
            Decision::Cacheable(c) => c,
        };
        self.cache.cacheable = Some(c);
        self.cache.status = Some(CacheStatus::Miss);
        // The answer is stored as it passes; a compressed one could not be.
        set_request(env, host, "accept-encoding", None);
        if !c.read {
            // `no-cache`: a fresh answer, stored for the next caller.
            return ControlFlow::Continue(body);
        }
        let store = Store::new(env.store, cfg);
        let (lookup, seen) = store.lookup_seen(&c.key, env.now_ms);
        self.cache.seen = seen;
        if let Lookup::Hit { entry, age_s } = lookup {
            if self.reply_from_entry(env, host, &entry, age_s, CacheStatus::Hit, None) {
                return ControlFlow::Break(Step::Pause);
            }
        }
        // A reworded repeat: the call waits for its question's embedding.
        let body = self.ask_embedding(env, host, body)?;
        self.cache_claim(env, body)
    }

    /// The lead on a missed key, or a wait for the identical call in flight
    /// that has it: settled while the call waits (keeping the body), else on
    /// upstream.
    pub(super) fn cache_claim(&mut self, env: &mut Env<'_>, body: Option<HeldBody>) -> Flow {
        let cfg = &env.config.cache;
        let Some(c) = self.cache.cacheable else {
            return ControlFlow::Continue(body);
        };
        if !cfg.coalesce {
            return ControlFlow::Continue(body);
        }
        let store = Store::new(env.store, cfg);
        match coalesce::claim(
            &store,
            &c.key,
            env.now_ms,
            self.coalesce_wait_ms(env),
            env.rng.next_u64(),
        ) {
            Claim::Leader(lease) => self.cache.lease = Some(lease),
            Claim::Follower { deadline_ms } => {
                if let Some(mut body) = body {
                    // Routing needs only the bytes and the features later.
                    body.drop_tree();
                    self.progress.coalesce(deadline_ms, body);
                    return ControlFlow::Break(Step::Pause);
                }
            }
            Claim::Unavailable => {}
        }
        ControlFlow::Continue(body)
    }

    /// A degraded call answered from its entry, even one past expiry while
    /// it is still in its slot (`x-cache: STALE`, `x-downgrade: cache`).
    /// False when the call is not cacheable or no entry is there.
    pub(super) fn answer_downgraded(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        body: &HeldBody,
        level: u8,
    ) -> bool {
        if self.cache.status.is_none() {
            return false;
        }
        let Decision::Cacheable(c) = self.cache_decision(env, host, body.tree()) else {
            return false;
        };
        if !c.read {
            return false;
        }
        let store = Store::new(env.store, &env.config.cache).with_stale_ms(u64::MAX);
        let (entry, age_s, status) = match store.lookup(&c.key, env.now_ms) {
            Lookup::Hit { entry, age_s } => (entry, age_s, CacheStatus::Hit),
            Lookup::Stale { entry, age_s } => (entry, age_s, CacheStatus::Stale),
            Lookup::Miss => return false,
        };
        let before = (self.cache.cacheable, self.decided.degraded);
        self.cache.cacheable = Some(c);
        self.decided.degraded = Some(level);
        self.decided.downgraded = true;
        if self.reply_from_entry(env, host, &entry, age_s, status, None) {
            return true;
        }
        (self.cache.cacheable, self.decided.degraded) = before;
        self.decided.downgraded = false;
        false
    }

    /// Compares the shard header the request came with to the key computed
    /// here. Only counted: the lookup always uses the computed key, so a
    /// forged header can neither read nor fill another key's entry.
    fn check_shard_key(&mut self, env: &mut Env<'_>, decision: &Decision) {
        let Some(sent) = self.cache.shard_key.take() else {
            return;
        };
        let matched = match decision {
            Decision::Cacheable(c) => key_hex(&c.key).eq_ignore_ascii_case(sent.trim()),
            Decision::Bypass(_) => false,
        };
        if !matched {
            log::debug!("llm-filter: shard header does not match the computed cache key");
        }
        count_shard_key(env.metrics, if matched { "matched" } else { "mismatched" });
    }

    /// Cacheability and key of a held body, from the headers that take part.
    fn cache_decision(&self, env: &Env<'_>, host: &dyn Host, body: Option<&Json>) -> Decision {
        self.with_cache_request(env, host, body, |req| {
            policy::decide(&env.config.cache, req)
        })
    }

    /// The values of the headers that tell tenants apart (see
    /// [`crate::cache::config::CacheConfig::tenant_headers_of`]), in order;
    /// where the mesh verifies who calls (`tenant.from` other than
    /// `credential`), the caller's tenant alone, so two keys of one tenant
    /// share its entries and two tenants never do. A newline starts it,
    /// which no header value holds.
    pub(super) fn credentials(&self, env: &Env<'_>, host: &dyn Host) -> Vec<Option<String>> {
        if env.config.tenant.from.verified() {
            let tagged = self.request.tenant.as_ref().map(|t| {
                let mut v = String::from("\n");
                v.push_str(t);
                v
            });
            return vec![tagged];
        }
        env.config
            .cache
            .tenant_headers_of(self.request.dialect)
            .map(|name| host.request_header(name))
            .collect()
    }

    /// Runs `f` on what the cache reads of the request: the path as
    /// received, the headers that take part and the parsed body.
    pub(super) fn with_cache_request<T>(
        &self,
        env: &Env<'_>,
        host: &dyn Host,
        body: Option<&Json>,
        f: impl FnOnce(&CacheRequest<'_>) -> T,
    ) -> T {
        let cache_control = host.request_header("cache-control");
        let values = self.credentials(env, host);
        let credentials: Vec<Option<&str>> = values.iter().map(Option::as_deref).collect();
        f(&CacheRequest {
            dialect: self.request.dialect,
            path: &self.request.path,
            body,
            cache_control: cache_control.as_deref(),
            credentials: &credentials,
        })
    }

    /// How long a marker stands or a twin waits: the configured wait, never
    /// past the caller's own budget.
    fn coalesce_wait_ms(&self, env: &Env<'_>) -> u64 {
        let remaining = self.request.remaining_ms(env.now_ms);
        env.config.cache.coalesce_wait_ms.min(remaining).max(1)
    }

    /// A timer tick of a call waiting for an identical one: answer from its
    /// entry once stored, or go upstream when it failed or the wait is over.
    pub(super) fn cache_on_tick(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        deadline_ms: u64,
    ) -> Wake {
        let cfg = &env.config.cache;
        let store = Store::new(env.store, cfg);
        if let Some(c) = self.cache.cacheable {
            match coalesce::poll(&store, &c.key, env.now_ms, deadline_ms) {
                Poll::KeepWaiting => return Wake::Wait,
                Poll::Ready { entry, age_s } => {
                    let status = CacheStatus::Coalesced;
                    if self.reply_from_entry(env, host, &entry, age_s, status, None) {
                        count_wait(env.metrics, "served");
                        return Wake::Answered;
                    }
                }
                Poll::GoUpstream => {}
            }
            // This call now goes upstream itself, and leads the next twins
            // when it can; it never waits a second time.
            let token = env.rng.next_u64();
            if let Claim::Leader(lease) = coalesce::claim(
                &store,
                &c.key,
                env.now_ms,
                self.coalesce_wait_ms(env),
                token,
            ) {
                self.cache.lease = Some(lease);
            }
        }
        count_wait(env.metrics, "upstream");
        let Some(body) = self.progress.stop_waiting() else {
            return Wake::Resume;
        };
        // Routing and admission happen now, with the health and budget of now.
        match self.go_upstream(env, host, Some(body)) {
            Step::Continue => Wake::Resume,
            Step::Pause => Wake::Answered,
        }
    }

    /// Answers the call locally from `entry`, as JSON or as an SSE stream per
    /// the request. False when it cannot (the entry is older than the
    /// caller's `max-age`, does not replay, the host refused): the call then
    /// goes on as a miss.
    /// `extra` is one more header to send (the similarity of a semantic hit).
    pub(super) fn reply_from_entry(
        &mut self,
        env: &mut Env<'_>,
        host: &mut dyn Host,
        entry: &Entry,
        age_s: u64,
        status: CacheStatus,
        extra: Option<(&str, &str)>,
    ) -> bool {
        let Some(c) = self.cache.cacheable else {
            return false;
        };
        let Some(mut reply) = entry_reply(env, &c, entry) else {
            return false;
        };
        // The entry keeps the placeholders: the caller's own values are
        // put back, and the answer's rules read it.
        let stream = reply.content_type == SSE_CONTENT_TYPE;
        match self.check_whole(env, stream, &reply.body) {
            Checked::Pass => {}
            Checked::Body(b) => reply.body = b,
            Checked::Blocked(rule) => {
                let r = blocked_reply(by_rule(&env.config.guardrails, rule));
                self.reply_locally(env, host, r);
                return true;
            }
        }
        let age = age_s.to_string();
        let mut headers = vec![
            ("content-type", reply.content_type),
            (AGE_HEADER, age.as_str()),
        ];
        headers.extend(extra);
        // The reply tells the client this status (`x-cache`).
        self.send_local_reply(env, host, 200, &headers, &reply.body, Some(status))
    }

    /// Response headers of a call that went upstream: `x-cache`, an expired
    /// entry in place of an upstream failure, and what to collect to store.
    pub(super) fn cache_on_response_headers(&mut self, env: &mut Env<'_>, host: &mut dyn Host) {
        let Some(status) = self.cache.status else {
            return;
        };
        let Some(c) = self.cache.cacheable else {
            set_response(env, host, X_CACHE, Some(status.header()));
            return;
        };
        let failed = self.response.as_ref().is_some_and(Response::failed);
        if failed && c.read && self.serve_stale(env, host, c) {
            // The client gets the old answer; nothing new to store.
        } else {
            set_response(env, host, X_CACHE, Some(CacheStatus::Miss.header()));
            if c.store {
                self.cache.fill = self.start_fill(env, host, c);
            }
        }
        if self.cache.fill.is_none() {
            // Nothing will be stored: twins waiting for this call go now.
            self.release_lease(env);
        }
    }

    /// Where to collect a successful answer of `c`, `None` (counted) when it
    /// cannot be stored.
    fn start_fill(&mut self, env: &mut Env<'_>, host: &dyn Host, c: Cacheable) -> Option<Fill> {
        let response = self.response.as_mut()?;
        if response.status != Some(200) {
            count_store(env.metrics, "status");
            return None;
        }
        let kept_as_sent = kept_as_sent(self.request.dialect, c.stream);
        if kept_as_sent.is_some_and(|d| d != Delivery::of(response.is_stream())) {
            count_store(env.metrics, EntryError::Delivery.as_str());
            return None;
        }
        let encoded = host
            .response_header("content-encoding")
            .is_some_and(|e| !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case("identity"));
        if encoded {
            count_store(env.metrics, "encoded");
            return None;
        }
        let limit = env.config.cache.max_entry_bytes;
        if let Answer::Json { copy, .. } = &mut response.answer {
            copy.raise_limit(limit as usize);
            return Some(Fill::Json);
        }
        if kept_as_sent.is_some() {
            return Some(Fill::Verbatim(BodyCopy::with_limit(limit as usize)));
        }
        match StreamAssembler::new(self.request.dialect, limit) {
            Some(a) => Some(Fill::Sse(a)),
            None => {
                count_store(env.metrics, "endpoint");
                None
            }
        }
    }

    /// Puts the entry of `c` in place of an upstream failure (`x-cache:
    /// STALE`), fresh or within `cache.stale_if_error_s` of expiry. Only when
    /// the failure has a body, which the body callback then replaces: a
    /// bodyless one has no callback to carry the entry. Envoy's own timeout
    /// reply always has one (the walk already replaces it).
    fn serve_stale(&mut self, env: &mut Env<'_>, host: &mut dyn Host, c: Cacheable) -> bool {
        let envoy_timeout = self
            .response
            .as_ref()
            .is_some_and(|r| r.envoy == Some(EnvoyReply::Timeout));
        if env.config.cache.stale_if_error_ms == 0 || !(envoy_timeout || declares_body(host)) {
            return false;
        }
        let store = Store::new(env.store, &env.config.cache);
        let (entry, age_s) = match store.lookup(&c.key, env.now_ms) {
            Lookup::Hit { entry, age_s } | Lookup::Stale { entry, age_s } => (entry, age_s),
            Lookup::Miss => return false,
        };
        let Some(mut reply) = entry_reply(env, &c, &entry) else {
            return false;
        };
        let stream = reply.content_type == SSE_CONTENT_TYPE;
        match self.check_whole(env, stream, &reply.body) {
            Checked::Pass => {}
            Checked::Body(b) => reply.body = b,
            // Not served: the upstream's failure goes on.
            Checked::Blocked(_) => return false,
        }
        set_response(env, host, ":status", Some("200"));
        set_response(env, host, "content-type", Some(reply.content_type));
        set_response(env, host, "content-length", None);
        set_response(env, host, "retry-after", None);
        set_response(env, host, X_CACHE, Some(CacheStatus::Stale.header()));
        set_response(env, host, AGE_HEADER, Some(&age_s.to_string()));
        if let Some(response) = self.response.as_mut() {
            response.replacement = Some(reply.body);
        }
        self.cache.status = Some(CacheStatus::Stale);
        true
    }

    /// A response body chunk of `size` bytes (`chunk`, as read; `None` when
    /// empty or unreadable) of a call whose answer is being collected; stores
    /// the entry at the end of the stream. `answer` is the JSON answer,
    /// parsed once at its end.
    pub(super) fn cache_on_response_body(
        &mut self,
        env: &mut Env<'_>,
        size: usize,
        chunk: Option<&[u8]>,
        end_of_stream: bool,
        answer: Option<&Value>,
    ) {
        let limit = env.config.cache.max_entry_bytes;
        let Some(fill) = self.cache.fill.as_mut() else {
            return;
        };
        if size > 0 && chunk.is_none() {
            // A piece of the answer was not seen: what was collected is not it.
            self.cache.fill = None;
            internal_error(env.metrics, "cache_body_read");
            self.release_lease(env);
            return;
        }
        let json = self.response.as_ref().and_then(Response::json);
        let gave_up = match fill {
            // The response's copy outgrew the entry (or its own bound).
            Fill::Json => json.is_none_or(|b| b.len() > limit as usize),
            // Fed by the stream's reading (see `on_response_body`).
            Fill::Sse(asm) => asm.gave_up(),
            // Fed here, every byte as it came.
            Fill::Verbatim(copy) => {
                copy.append(chunk.unwrap_or_default());
                !copy.is_open()
            }
        };
        if !end_of_stream && !gave_up {
            return;
        }
        let Some(fill) = self.cache.fill.take() else {
            return;
        };
        let stamp = env.config.cache.stamp(env.now_ms, env.rng.next_f64());
        let dialect = self.request.dialect;
        let entry = match (fill, json) {
            (Fill::Json, Some(body)) if !gave_up => {
                Entry::from_answer(dialect, 200, body, answer, stamp, limit)
            }
            (Fill::Json, _) => Err(EntryError::TooLarge),
            (Fill::Sse(asm), _) => asm.finish(stamp),
            (Fill::Verbatim(copy), _) => {
                let finished = self.response.as_ref().is_some_and(Response::finished);
                Entry::from_stream(dialect, copy.bytes(), finished, stamp, limit)
            }
        };
        match entry {
            Ok(entry) => self.store_entry(env, &entry),
            Err(e) => count_store(env.metrics, e.as_str()),
        }
        // Stored or not, the twins waiting for it go now.
        self.release_lease(env);
    }

    fn store_entry(&self, env: &mut Env<'_>, entry: &Entry) {
        let Some(c) = self.cache.cacheable else {
            return;
        };
        let store = Store::new(env.store, &env.config.cache);
        match store.insert_after(&c.key, entry, env.now_ms, &self.cache.seen) {
            Ok(inserted) => {
                count_store(env.metrics, "stored");
                if inserted.evicted() {
                    env.metrics.counter(names::CACHE_EVICTIONS, 1);
                }
                if let Some(t) = inserted.totals {
                    t.set_gauges(env.metrics);
                }
                self.index_vector(env, &c.key, entry);
            }
            Err(e) => count_store(env.metrics, e.as_str()),
        }
    }

    pub(super) fn release_lease(&mut self, env: &mut Env<'_>) {
        if let Some(lease) = self.cache.lease.take() {
            coalesce::release(&Store::new(env.store, &env.config.cache), &lease);
        }
    }

    /// End of the call: the lead is given up whatever happened, an answer
    /// still being collected never got to its end (counted, not stored), and
    /// the lookup is counted with its final result.
    pub(super) fn cache_on_log(&self, env: &mut Env<'_>) {
        if let Some(lease) = &self.cache.lease {
            coalesce::release(&Store::new(env.store, &env.config.cache), lease);
        }
        if self.cache.fill.is_some() {
            count_store(env.metrics, EntryError::Incomplete.as_str());
        }
        if let Some(status) = self.cache.status {
            let result = [("result", status.label())];
            env.metrics.counter_with(names::CACHE_LOOKUPS, &result, 1);
        }
    }
}

/// Reads and removes the shard header of a request: the upstream never sees
/// a client's value; a filter in `shard` mode writes its own once it has the
/// key. The value is kept only where a `local` cache checks it.
pub(super) fn take_shard_header(env: &mut Env<'_>, host: &mut dyn Host) -> Option<String> {
    let config = env.config;
    let header = &config.cache.shard_header;
    let sent = host.request_header(header)?;
    set_request(env, host, header, None);
    config.cache.keeps_entries().then_some(sent)
}

/// What `entry` answers call `c` with; `None` when the caller's `max-age`
/// refuses an entry that old, or the entry does not replay (counted).
fn entry_reply(env: &mut Env<'_>, c: &Cacheable, entry: &Entry) -> Option<Reply> {
    if !c.accepts(entry, env.now_ms) {
        return None;
    }
    let reply = entry.reply(c.stream, c.include_usage);
    if reply.is_err() {
        internal_error(env.metrics, "cache_replay");
    }
    reply.ok()
}

/// True when a response says a body follows (`content-length` above 0, or
/// chunked): only then does a body callback come to replace it.
fn declares_body(host: &dyn Host) -> bool {
    let length = host
        .response_header("content-length")
        .and_then(|v| v.trim().parse::<u64>().ok());
    let chunked = host
        .response_header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    length.is_some_and(|n| n > 0) || chunked
}

fn count_store(m: &mut dyn Metrics, result: &str) {
    m.counter(&names::name(names::CACHE_STORES, &[("result", result)]), 1);
}

fn count_shard_key(m: &mut dyn Metrics, result: &str) {
    m.counter(
        &names::name(names::CACHE_SHARD_KEYS, &[("result", result)]),
        1,
    );
}

fn count_wait(m: &mut dyn Metrics, outcome: &str) {
    m.counter(
        &names::name(names::CACHE_COALESCED_WAITS, &[("outcome", outcome)]),
        1,
    );
}

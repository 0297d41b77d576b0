//! The cache's steps in a build without the response cache (the sidecar
//! build: the cache lives at the gateway tier): the same interface as
//! `cache.rs`, and no call is ever answered, parked or stored by it. A
//! configuration with a `cache` section is refused at load (`crate::build`).

use std::ops::ControlFlow;

use serde_json::Value;

use super::{Call, Env, Flow, HeldBody, Host, Wake};

impl Call {
    /// Goes on: there is no cache to answer from.
    pub(super) fn cache_request(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        body: Option<HeldBody>,
    ) -> Flow {
        ControlFlow::Continue(body)
    }

    /// No entry answers a degraded call.
    pub(super) fn answer_downgraded(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _body: &HeldBody,
        _level: u8,
    ) -> bool {
        false
    }

    /// No call waits for an identical one.
    pub(super) fn cache_on_tick(
        &mut self,
        _env: &mut Env<'_>,
        _host: &mut dyn Host,
        _deadline_ms: u64,
    ) -> Wake {
        Wake::Resume
    }

    /// Nothing is stored.
    pub(super) fn cache_on_response_headers(&mut self, _env: &mut Env<'_>, _host: &mut dyn Host) {}

    /// Nothing is stored.
    pub(super) fn cache_on_response_body(
        &mut self,
        _env: &mut Env<'_>,
        _size: usize,
        _chunk: Option<&[u8]>,
        _end_of_stream: bool,
        _answer: Option<&Value>,
    ) {
    }

    /// No lease to release.
    pub(super) fn cache_on_log(&self, _env: &mut Env<'_>) {}
}

/// The shard header is the gateway tier's: a client's value is removed
/// all the same, so no upstream sees one.
pub(super) fn take_shard_header(env: &mut Env<'_>, host: &mut dyn Host) -> Option<String> {
    let header = &env.config.cache.shard_header;
    host.request_header(header)?;
    super::set_request(env, host, header, None);
    None
}

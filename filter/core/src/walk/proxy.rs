//! What the walk needs from the proxy for one HTTP stream: its headers and
//! bodies, local replies, the route cache and callouts. The plugin implements
//! it over Envoy's host calls; the core's tests, over a fake.

/// Stream operations the walk needs from the proxy.
pub trait Host {
    /// A request header (first value), lossily decoded.
    fn request_header(&self, name: &str) -> Option<String>;
    /// Every value of a request header, in order.
    fn request_header_all(&self, name: &str) -> Vec<String>;
    /// Sets (`Some`) or removes (`None`) a request header; false if refused.
    fn set_request_header(&mut self, name: &str, value: Option<&str>) -> bool;
    /// The request body received so far (`size` bytes of the current buffer).
    fn request_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Replaces the buffered request body; false if refused.
    fn set_request_body(&mut self, size: usize, body: &[u8]) -> bool;
    /// A response header.
    fn response_header(&self, name: &str) -> Option<String>;
    /// Sets or removes a response header; false if refused.
    fn set_response_header(&mut self, name: &str, value: Option<&str>) -> bool;
    /// The current response body chunk (or buffer).
    fn response_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Replaces the response body buffer; false if refused.
    fn set_response_body(&mut self, size: usize, body: &[u8]) -> bool;
    /// Resets the response stream, so the client sees its answer end
    /// unfinished; false if refused. (Only the guardrail service cuts an
    /// answer: a build without guardrails has no use for it.)
    #[cfg(feature = "guardrails")]
    fn reset_response(&mut self) -> bool;
    /// Envoy's `response.code_details` (why Envoy itself answered).
    fn response_code_details(&self) -> Option<String>;
    /// Answers the client locally; false if refused.
    fn send_local_reply(&mut self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> bool;
    /// Sets a property of the stream (Envoy: filter state `wasm.<path>`,
    /// which the access loggers read).
    fn set_property(&mut self, path: &str, value: &[u8]) -> bool;
    /// A property of the stream or its connection (Envoy attributes, e.g.
    /// `connection.uri_san_peer_certificate`).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// Makes Envoy pick the route again after a routing header changed.
    fn clear_route_cache(&mut self) -> bool;
    /// Every request header, in order, as the upstream saw them.
    fn request_headers(&self) -> Vec<(String, String)>;
    /// Sends a request to `cluster` on the side (an HTTP callout), whose
    /// answer comes back through [`super::Call::on_callout_response`] with `then`
    /// (the host registers it under the callout's token in the `wait`
    /// module's registry, which depends on the walk, not the other way);
    /// false if refused.
    fn dispatch_call(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
        then: CallWait,
    ) -> bool;
}

/// The answer to a callout of the walk; `status` is `None` when none came in
/// time (or the connection failed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CalloutAnswer {
    /// The answer's status.
    pub status: Option<u16>,
    /// The answer's headers, `:status` included.
    pub headers: Vec<(String, String)>,
    /// The answer's body.
    pub body: Vec<u8>,
}

impl CalloutAnswer {
    /// The value of its header `name` (any case), the first one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What a call does with the answer to one of its callouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallWait {
    /// The question's embedding, for the semantic cache.
    Embedding,
    /// The guardrail service's verdict on the prompt.
    Guardrail,
    /// Another backend of the model, asked in place of one that failed.
    Failover,
    /// Another backend of the model, asked because the first is slow; it
    /// becomes the failover when the first then fails.
    Hedge,
    /// The next model of a fallback chain.
    Fallback,
}

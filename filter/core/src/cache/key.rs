//! Which calls may be answered from the cache, and under which key. Only
//! deterministic calls are cacheable, and the key covers everything that changes
//! the answer, including who asks, so no caller is ever served an answer meant
//! for another request or another tenant.

use sha2::{Digest, Sha256};

use super::answer::kept_as_sent;
use super::config::{CacheConfig, Scope};
use super::entry::Entry;
use crate::dialect::request::Continues;
use crate::dialect::Dialect;
use crate::json::Json;

/// A cache key: SHA-256 of the canonical request and its tenant.
pub type Key = [u8; 32];

/// The key as the shard header carries it: 64 lowercase hex digits.
pub fn key_hex(key: &Key) -> String {
    crate::trace_context::hex(key)
}

/// Bumped whenever the canonical form changes, so old entries are never
/// mistaken for new ones.
const KEY_VERSION: &[u8] = b"llm-filter/cache-key/v1";

/// Body fields that change how the answer is delivered, not what it says:
/// out of the key of an answer kept in canonical form. An answer kept as the
/// upstream sent it (Responses, Messages) echoes them or differs by them, so
/// its key leaves nothing out.
const IGNORED_FIELDS: [&str; 3] = ["stream", "stream_options", "user"];

/// What a request to the cache looks like, read by the glue from the headers
/// and the buffered body.
#[derive(Debug, Clone, Copy)]
pub struct CacheRequest<'a> {
    /// The call's dialect, from [`crate::dialect::classify`].
    pub dialect: Dialect,
    /// The `:path` as received, query included (a query such as Azure's
    /// `api-version` can change the answer).
    pub path: &'a str,
    /// The complete request body, parsed (`None`: not strict JSON).
    pub body: Option<&'a Json>,
    /// The client's `cache-control` header, if any.
    pub cache_control: Option<&'a str>,
    /// The value of each of [`CacheConfig::tenant_headers_of`] the
    /// dialect, in that order, `None` where the header is absent.
    pub credentials: &'a [Option<&'a str>],
}

/// Why a call does not use the cache (logged and counted as `bypass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BypassReason {
    /// `cache.enabled` is false.
    Disabled,
    /// A call of a dialect the cache does not keep (`other`).
    Dialect,
    /// The client sent `cache-control: no-store`.
    NoStore,
    /// The body is not a strict JSON object (or has a malformed `stream`).
    InvalidBody,
    /// Some object in the body names a key twice: the upstream may read
    /// another value than the one the filter reads, so no entry may answer it.
    DuplicateKey,
    /// `temperature` above `cache.max_temperature` (or absent, meaning 1.0),
    /// and neither opt-in (`cache-control: max-age`, a model of
    /// `cache.deterministic_models`).
    Temperature,
    /// The prompt contains one of `cache.dynamic_markers`.
    DynamicMarker,
    /// A Responses call that continues state the backend keeps
    /// (`previous_response_id`, `conversation`, `background`): its answer
    /// depends on more than the request.
    State,
    /// The body was not held whole (too large, no declared length, or the host
    /// does not deliver bodies to a held request), so there is nothing to key.
    Unbuffered,
}

impl BypassReason {
    /// A short name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Dialect => "endpoint",
            Self::NoStore => "no_store",
            Self::InvalidBody => "invalid_body",
            Self::DuplicateKey => "duplicate_key",
            Self::Temperature => "temperature",
            Self::DynamicMarker => "dynamic_marker",
            Self::State => "state",
            Self::Unbuffered => "unbuffered",
        }
    }
}

/// The cache's verdict on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Leave the cache out: `x-cache: BYPASS`.
    Bypass(BypassReason),
    /// The call may use the cache.
    Cacheable(Cacheable),
}

/// How a cacheable call uses the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cacheable {
    /// The entry's key.
    pub key: Key,
    /// The client asked for an SSE stream (`"stream": true`); never for
    /// embeddings.
    pub stream: bool,
    /// The client asked for the final usage chunk
    /// (`stream_options.include_usage`).
    pub include_usage: bool,
    /// An entry may answer the call (false under `cache-control: no-cache`).
    pub read: bool,
    /// The fresh answer may be stored.
    pub store: bool,
    /// Oldest entry the caller accepts (`cache-control: max-age`), ms.
    pub max_age_ms: Option<u64>,
}

impl Cacheable {
    /// True when `entry` may answer the call at `now_ms`: an entry older
    /// than the caller's `max-age` is a miss for it.
    pub fn accepts(&self, entry: &Entry, now_ms: u64) -> bool {
        self.max_age_ms
            .is_none_or(|max| now_ms.saturating_sub(entry.stored_at_ms()) <= max)
    }
}

/// Decides whether a call is cacheable and computes its key.
pub fn decide(cfg: &CacheConfig, req: &CacheRequest<'_>) -> Decision {
    if !cfg.enabled {
        return Decision::Bypass(BypassReason::Disabled);
    }
    if req.dialect.answer().stored().is_none() {
        return Decision::Bypass(BypassReason::Dialect);
    }
    let control = CacheControl::parse(req.cache_control.unwrap_or(""));
    if control.no_store {
        return Decision::Bypass(BypassReason::NoStore);
    }
    let Some(body) = req.body.filter(|b| matches!(b, Json::Object(_))) else {
        return Decision::Bypass(BypassReason::InvalidBody);
    };
    if body.repeats_a_key() {
        return Decision::Bypass(BypassReason::DuplicateKey);
    }
    let (stream, include_usage) = match delivery(body) {
        Some(d) => d,
        None => return Decision::Bypass(BypassReason::InvalidBody),
    };
    if Continues::of(req.dialect, body).state {
        return Decision::Bypass(BypassReason::State);
    }
    let api = req.dialect.request();
    // A call that samples nothing (embeddings) is as deterministic as its input.
    if api.samples() {
        if !deterministic(cfg, req.dialect, req.path, body, &control) {
            return Decision::Bypass(BypassReason::Temperature);
        }
        if has_marker(body, api.prompt_fields(), &cfg.dynamic_markers) {
            return Decision::Bypass(BypassReason::DynamicMarker);
        }
    }
    Decision::Cacheable(Cacheable {
        key: digest(KEY_VERSION, cfg, req, body),
        // Embeddings are never streamed, whatever the body says; an API
        // that asks for a stream in its path asks there alone.
        stream: api.stream_in_path(req.path).unwrap_or(stream) && api.streams(),
        include_usage,
        read: !control.no_cache,
        store: true,
        max_age_ms: control.max_age_s.map(|s| s.saturating_mul(1000)),
    })
}

/// The key of `body` as sent by `req`'s caller to its path, under
/// `version`: what the exact cache keys on, and what the semantic index keys
/// its contexts on (with another version and a body without the question).
pub(crate) fn digest(
    version: &[u8],
    cfg: &CacheConfig,
    req: &CacheRequest<'_>,
    body: &Json,
) -> Key {
    let ignored: &[&str] = match kept_as_sent(req.dialect, false) {
        None => &IGNORED_FIELDS,
        Some(_) => &[],
    };
    let mut canonical = Vec::new();
    body.write_without(ignored, &mut canonical);
    let tenant = match cfg.scope {
        Scope::Global => Vec::new(),
        Scope::Tenant => tenant_hash(cfg.tenant_headers_of(req.dialect), req.credentials).to_vec(),
    };
    let mut h = Sha256::new();
    for part in [version, req.path.as_bytes(), &tenant, &canonical] {
        // Length prefixes keep the parts from sliding into each other.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The client's `cache-control` request directives the cache honours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheControl {
    /// `no-store`: neither read nor store.
    pub no_store: bool,
    /// `no-cache`: do not answer from the cache, but store the fresh answer.
    pub no_cache: bool,
    /// `max-age=<s>`: the caller accepts a stored answer no older than `s`
    /// seconds, which makes the call cacheable whatever its sampling.
    pub max_age_s: Option<u64>,
}

impl CacheControl {
    /// Reads comma-separated directives, case-insensitive; arguments are
    /// ignored but `max-age`'s (the smallest when repeated; one that is not
    /// a number of seconds is no directive).
    pub fn parse(header: &str) -> Self {
        let mut out = Self::default();
        for directive in header.split(',') {
            let (name, argument) = directive.split_once('=').unwrap_or((directive, ""));
            let name = name.trim();
            if name.eq_ignore_ascii_case("no-store") {
                out.no_store = true;
            } else if name.eq_ignore_ascii_case("no-cache") {
                out.no_cache = true;
            } else if name.eq_ignore_ascii_case("max-age") {
                if let Some(s) = delta_seconds(argument) {
                    out.max_age_s = Some(out.max_age_s.map_or(s, |m| m.min(s)));
                }
            }
        }
        out
    }
}

/// HTTP's delta-seconds, quoted or not; a number past `u64` is as good as
/// forever.
fn delta_seconds(argument: &str) -> Option<u64> {
    let a = argument.trim();
    let a = a
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(a);
    if a.is_empty() || !a.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(a.parse().unwrap_or(u64::MAX))
}

/// `(stream, include_usage)`, or `None` when those fields are malformed: a
/// request the provider would refuse must not be answered from an entry.
fn delivery(body: &Json) -> Option<(bool, bool)> {
    let stream = match body.get("stream") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => return None,
    };
    let include_usage = match body.get("stream_options") {
        None | Some(Json::Null) => false,
        Some(o @ Json::Object(_)) => match o.get("include_usage") {
            None | Some(Json::Null) => false,
            Some(Json::Bool(b)) => *b,
            Some(_) => return None,
        },
        Some(_) => return None,
    };
    Some((stream, include_usage))
}

/// True when the call's answer may be reused: the caller accepts a stored
/// answer (`max-age`), the operator declared the model deterministic, or its
/// sampling is (see [`temperature_ok`]). A chat or completions call without a
/// temperature samples at the providers' default of 1.0; a Responses or
/// Messages call often has none to send (Anthropic's SDK 2.x has no such
/// parameter, OpenAI's reasoning models refuse it), so only one sent counts.
fn deterministic(
    cfg: &CacheConfig,
    dialect: Dialect,
    path: &str,
    body: &Json,
    control: &CacheControl,
) -> bool {
    let api = dialect.request();
    let declared = || match (api.model_in_path(path), body.get("model")) {
        (Some(m), _) => cfg.deterministic_models.iter().any(|d| d == m),
        (None, Some(Json::String(m))) => cfg.deterministic_models.contains(m),
        _ => false,
    };
    let absent_is_default = api.absent_temperature_is_default();
    control.max_age_s.is_some()
        || declared()
        || api
            .sampling(body)
            .is_some_and(|s| temperature_ok(s, cfg.max_temperature, absent_is_default))
}

/// True when the call's sampling is deterministic enough to cache. A null
/// temperature is the providers' default of 1.0, and so is an absent one when
/// `absent_is_default` (else an absent one fails). A repeated field must pass
/// every time: readers disagree on which one counts.
fn temperature_ok(body: &Json, max: f64, absent_is_default: bool) -> bool {
    let mut seen = false;
    let all_ok = body.members("temperature").all(|v| {
        seen = true;
        let t = match v {
            Json::Null => 1.0,
            Json::Number(n) => n.parse::<f64>().unwrap_or(f64::INFINITY),
            _ => f64::INFINITY,
        };
        t <= max
    });
    all_ok && (seen || (absent_is_default && 1.0 <= max))
}

/// True when any prompt string (in `fields`, each time one appears) contains
/// a marker. Decoded strings are searched, so an escape cannot hide a marker.
fn has_marker(body: &Json, fields: &[&str], markers: &[String]) -> bool {
    if markers.is_empty() {
        return false;
    }
    fields.iter().any(|field| {
        body.members(field)
            .any(|v| v.any_string(&mut |s| markers.iter().any(|m| s.contains(m.as_str()))))
    })
}

/// A digest of the credential header values, so the key separates tenants
/// without carrying a credential.
pub(crate) fn tenant_hash<'a>(
    names: impl Iterator<Item = &'a str>,
    values: &[Option<&str>],
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tenant");
    for (i, name) in names.enumerate() {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        match values.get(i).copied().flatten() {
            Some(v) => {
                h.update([1]);
                h.update((v.len() as u64).to_le_bytes());
                h.update(v.as_bytes());
            }
            None => h.update([0]),
        }
    }
    h.finalize().into()
}

#[cfg(all(test, feature = "cache"))]
mod tests {
    use super::*;

    const CHAT: &str = "/v1/chat/completions";

    fn cfg() -> CacheConfig {
        CacheConfig::default()
    }

    fn decide_with(
        cfg: &CacheConfig,
        dialect: Dialect,
        body: &str,
        cc: Option<&str>,
        cred: Option<&str>,
    ) -> Decision {
        let creds = [cred, None];
        let body = Json::parse(body.as_bytes());
        decide(
            cfg,
            &CacheRequest {
                dialect,
                path: CHAT,
                body: body.as_ref(),
                cache_control: cc,
                credentials: &creds,
            },
        )
    }

    fn chat(body: &str) -> Decision {
        decide_with(&cfg(), Dialect::Chat, body, None, Some("Bearer a"))
    }

    fn key(body: &str) -> Key {
        match chat(body) {
            Decision::Cacheable(Cacheable { key, .. }) => key,
            d => panic!("{body}: {d:?}"),
        }
    }

    const BASE: &str = r#"{"model":"gpt-4o","temperature":0,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#;

    #[test]
    fn formatting_does_not_change_the_key() {
        let k = key(BASE);
        for same in [
            r#"{"messages":[{"content":"be brief","role":"system"},{"role":"user","content":"hi"}],"temperature":0,"model":"gpt-4o"}"#,
            "{ \"model\" : \"gpt-4o\",\n \"temperature\": 0.0,\t\"messages\": [ {\"role\":\"system\",\"content\":\"be brief\"}, {\"role\":\"user\",\"content\":\"hi\"} ] }",
            r#"{"model":"gpt-4o","temperature":0e0,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"\u0068i"}]}"#,
            r#"{"model":"gpt-4o","temperature":-0.00,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"user":"u1"}"#,
            r#"{"model":"gpt-4o","temperature":0,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#,
        ] {
            assert_eq!(key(same), k, "{same}");
        }
    }

    #[test]
    fn every_parameter_changes_the_key() {
        let k = key(BASE);
        let with = |extra: &str| {
            let mut b = BASE.trim_end_matches('}').to_string();
            b.push(',');
            b.push_str(extra);
            b.push('}');
            key(&b)
        };
        let mut seen = vec![k];
        for extra in [
            r#""seed":1"#,
            r#""seed":2"#,
            r#""n":2"#,
            r#""max_tokens":10"#,
            r#""top_p":0.5"#,
            r#""frequency_penalty":0.1"#,
            r#""presence_penalty":0.1"#,
            r#""stop":["x"]"#,
            r#""logprobs":true"#,
            r#""tools":[{"type":"function","function":{"name":"f"}}]"#,
            r#""tool_choice":"none""#,
            r#""response_format":{"type":"json_object"}"#,
            r#""logit_bias":{"1":2}"#,
            r#""big":12345678901234567891"#,
            r#""big":12345678901234567892"#,
        ] {
            let k2 = with(extra);
            assert!(!seen.contains(&k2), "{extra}");
            seen.push(k2);
        }
        for other in [
            BASE.replace("gpt-4o", "gpt-4o-mini"),
            BASE.replace("be brief", "be long"),
            BASE.replace(r#"{"role":"system","content":"be brief"},"#, ""),
            BASE.replace("\"hi\"", "\"Hi\""),
        ] {
            assert_ne!(key(&other), k, "{other}");
        }
    }

    #[test]
    fn path_and_tenant_change_the_key() {
        let c = cfg();
        let k = |path: &str, cred: Option<&str>, c: &CacheConfig| {
            let creds = [cred];
            match decide(
                c,
                &CacheRequest {
                    dialect: Dialect::Chat,
                    path,
                    body: Json::parse(BASE.as_bytes()).as_ref(),
                    cache_control: None,
                    credentials: &creds,
                },
            ) {
                Decision::Cacheable(Cacheable { key, .. }) => key,
                d => panic!("{d:?}"),
            }
        };
        assert_ne!(k(CHAT, Some("a"), &c), k(CHAT, Some("b"), &c));
        assert_ne!(k(CHAT, Some("a"), &c), k(CHAT, None, &c));
        assert_ne!(
            k(CHAT, Some("a"), &c),
            k("/v2/chat/completions", Some("a"), &c)
        );
        // The credential moving to the other header is another tenant.
        let moved = match decide(
            &c,
            &CacheRequest {
                dialect: Dialect::Chat,
                path: CHAT,
                body: Json::parse(BASE.as_bytes()).as_ref(),
                cache_control: None,
                credentials: &[None, Some("a")],
            },
        ) {
            Decision::Cacheable(Cacheable { key, .. }) => key,
            d => panic!("{d:?}"),
        };
        assert_ne!(moved, k(CHAT, Some("a"), &c));
        let global = CacheConfig {
            scope: Scope::Global,
            ..cfg()
        };
        assert_eq!(k(CHAT, Some("a"), &global), k(CHAT, Some("b"), &global));
        assert_ne!(k(CHAT, Some("a"), &global), k(CHAT, Some("a"), &c));
    }

    /// Anthropic's `x-api-key` is a Messages call's tenant whatever
    /// `tenant_headers` lists; the key carries only its digest.
    #[test]
    fn a_messages_tenant_is_its_x_api_key() {
        let body = Json::parse(br#"{"model":"claude","messages":[]}"#).unwrap();
        let key = |c: &CacheConfig, dialect, creds: &[Option<&str>]| {
            let req = CacheRequest {
                dialect,
                path: "/v1/messages",
                body: Some(&body),
                cache_control: None,
                credentials: creds,
            };
            digest(KEY_VERSION, c, &req, &body)
        };
        let (a, b) = (Some("sk-ant-a"), Some("sk-ant-b"));
        for c in [
            cfg(),
            CacheConfig {
                tenant_headers: vec!["x-tenant".into()],
                ..cfg()
            },
        ] {
            let n = c.tenant_headers.len();
            let with = |k| {
                let mut creds = vec![None; n];
                creds.push(k);
                key(&c, Dialect::Messages, &creds)
            };
            assert_ne!(with(a), with(b));
            assert_ne!(with(a), with(None));
            assert_eq!(with(a), with(a));
        }
        // Chat keeps its tenant: the configured headers alone.
        let chat_key = key(&cfg(), Dialect::Chat, &[Some("Bearer t"), None]);
        assert_eq!(
            chat_key,
            key(&cfg(), Dialect::Chat, &[Some("Bearer t"), None, a])
        );
        let global = CacheConfig {
            scope: Scope::Global,
            ..cfg()
        };
        assert_eq!(
            key(&global, Dialect::Messages, &[None, None, a]),
            key(&global, Dialect::Messages, &[None, None, b])
        );
    }

    #[test]
    fn stream_and_plain_share_the_key() {
        let plain = chat(BASE);
        let streamed = chat(&BASE.replace(
            "\"temperature\"",
            "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\"",
        ));
        match (plain, streamed) {
            (
                Decision::Cacheable(Cacheable {
                    key: a,
                    stream: false,
                    include_usage: false,
                    read: true,
                    store: true,
                    max_age_ms: None,
                }),
                Decision::Cacheable(Cacheable {
                    key: b,
                    stream: true,
                    include_usage: true,
                    read: true,
                    store: true,
                    max_age_ms: None,
                }),
            ) => assert_eq!(a, b),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bypasses() {
        let c = cfg();
        let b = |dialect, body: &str, cc| decide_with(&c, dialect, body, cc, None);
        let bypass = Decision::Bypass;
        assert_eq!(b(Dialect::Other, BASE, None), bypass(BypassReason::Dialect));
        assert_eq!(
            b(Dialect::Chat, BASE, Some("No-Store")),
            bypass(BypassReason::NoStore)
        );
        assert_eq!(
            b(Dialect::Chat, BASE, Some("max-age=0, no-store")),
            bypass(BypassReason::NoStore)
        );
        assert_eq!(
            b(Dialect::Chat, "not json", None),
            bypass(BypassReason::InvalidBody)
        );
        assert_eq!(
            b(Dialect::Chat, "[1]", None),
            bypass(BypassReason::InvalidBody)
        );
        assert_eq!(
            b(Dialect::Chat, r#"{"stream":"yes","temperature":0}"#, None),
            bypass(BypassReason::InvalidBody)
        );
        assert_eq!(
            b(
                Dialect::Chat,
                r#"{"stream_options":1,"temperature":0}"#,
                None
            ),
            bypass(BypassReason::InvalidBody)
        );
        assert_eq!(
            b(Dialect::Chat, r#"{"model":"m"}"#, None),
            bypass(BypassReason::Temperature)
        );
        assert_eq!(
            b(Dialect::Chat, r#"{"temperature":null}"#, None),
            bypass(BypassReason::Temperature)
        );
        assert_eq!(
            b(Dialect::Chat, r#"{"temperature":0.2}"#, None),
            bypass(BypassReason::Temperature)
        );
        assert_eq!(
            b(Dialect::Chat, r#"{"temperature":"0"}"#, None),
            bypass(BypassReason::Temperature)
        );
        assert_eq!(
            b(Dialect::Completions, r#"{"prompt":"x"}"#, None),
            bypass(BypassReason::Temperature)
        );
        for twice in [
            r#"{"temperature":0,"temperature":1}"#,
            r#"{"temperature":1,"temperature":0}"#,
        ] {
            assert_eq!(
                b(Dialect::Chat, twice, None),
                bypass(BypassReason::DuplicateKey)
            );
        }
        assert!(matches!(
            b(Dialect::Embeddings, r#"{"input":"x","stream":true}"#, None),
            Decision::Cacheable(Cacheable { stream: false, .. })
        ));
        let off = CacheConfig {
            enabled: false,
            ..cfg()
        };
        assert_eq!(
            decide_with(&off, Dialect::Chat, BASE, None, None),
            bypass(BypassReason::Disabled)
        );
        let warm = CacheConfig {
            max_temperature: 1.0,
            ..cfg()
        };
        assert!(matches!(
            decide_with(&warm, Dialect::Chat, r#"{"model":"m"}"#, None, None),
            Decision::Cacheable(Cacheable { .. })
        ));
        assert!(matches!(
            decide_with(&warm, Dialect::Chat, r#"{"temperature":1.5}"#, None, None),
            Decision::Bypass(_)
        ));
    }

    #[test]
    fn no_cache_stores_without_reading() {
        for cc in [
            "no-cache",
            "NO-CACHE",
            " max-age=5 ,no-cache",
            "no-cache=\"x\"",
        ] {
            assert!(
                matches!(
                    decide_with(&cfg(), Dialect::Chat, BASE, Some(cc), None),
                    Decision::Cacheable(Cacheable {
                        read: false,
                        store: true,
                        ..
                    })
                ),
                "{cc}"
            );
        }
        assert!(matches!(
            decide_with(
                &cfg(),
                Dialect::Chat,
                BASE,
                Some("max-age=0, private"),
                None
            ),
            Decision::Cacheable(Cacheable {
                read: true,
                store: true,
                ..
            })
        ));
    }

    #[test]
    fn max_age_is_read_in_seconds() {
        for (header, want) in [
            ("max-age=60", Some(60)),
            ("Max-Age = 60 ", Some(60)),
            ("max-age=\"5\"", Some(5)),
            ("no-cache, max-age=0", Some(0)),
            ("max-age=30, max-age=10", Some(10)),
            ("max-age=99999999999999999999999", Some(u64::MAX)),
            ("max-age", None),
            ("max-age=", None),
            ("max-age=-1", None),
            ("max-age=1.5", None),
            ("max-stale=60", None),
            ("", None),
        ] {
            assert_eq!(CacheControl::parse(header).max_age_s, want, "{header}");
        }
    }

    #[test]
    fn either_opt_in_makes_any_sampling_cacheable() {
        let warm = r#"{"model":"gpt-4o","temperature":1.2,"messages":[]}"#;
        assert_eq!(chat(warm), Decision::Bypass(BypassReason::Temperature));
        let opted = decide_with(&cfg(), Dialect::Chat, warm, Some("max-age=60"), None);
        let Decision::Cacheable(c) = opted else {
            panic!("{opted:?}");
        };
        assert_eq!(c.max_age_ms, Some(60_000));
        let declared = CacheConfig {
            deterministic_models: vec!["gpt-4o".into()],
            ..cfg()
        };
        let d = |body: &str| decide_with(&declared, Dialect::Chat, body, None, None);
        let Decision::Cacheable(by_model) = d(warm) else {
            panic!("cacheable by its model");
        };
        assert_eq!(by_model.max_age_ms, None);
        assert_eq!(
            by_model.key, c.key,
            "how it became cacheable is no part of the key"
        );
        assert_eq!(
            d(&warm.replace("gpt-4o", "gpt-4o-mini")),
            Decision::Bypass(BypassReason::Temperature)
        );
        // Markers still say the answer depends on more than the request.
        let marked = CacheConfig {
            dynamic_markers: vec!["{{now}}".into()],
            ..declared
        };
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"{{now}}"}]}"#;
        assert_eq!(
            decide_with(&marked, Dialect::Chat, body, Some("max-age=5"), None),
            Decision::Bypass(BypassReason::DynamicMarker)
        );
    }

    #[test]
    fn max_age_caps_the_age_of_an_entry_served() {
        let Decision::Cacheable(c) =
            decide_with(&cfg(), Dialect::Chat, BASE, Some("max-age=10"), None)
        else {
            panic!("cacheable");
        };
        let answer = r#"{"choices":[{"message":{},"finish_reason":"stop"}]}"#;
        let stamp = crate::cache::Stamp {
            stored_at_ms: 1_000,
            expires_at_ms: 1_000_000,
        };
        let entry = Entry::from_json(Dialect::Chat, 200, answer.as_bytes(), stamp, 4096).unwrap();
        assert!(c.accepts(&entry, 11_000));
        assert!(!c.accepts(&entry, 11_001));
        let any = Cacheable {
            max_age_ms: None,
            ..c
        };
        assert!(any.accepts(&entry, u64::MAX));
    }

    #[test]
    fn responses_and_messages_need_a_temperature_sent_or_an_opt_in() {
        let warm = CacheConfig {
            max_temperature: 1.0,
            ..cfg()
        };
        let d = |c: &CacheConfig, dialect, body: &str, cc| decide_with(c, dialect, body, cc, None);
        let temperature = Decision::Bypass(BypassReason::Temperature);
        for (dialect, cold) in [
            (
                Dialect::Messages,
                r#"{"model":"claude","max_tokens":9,"messages":[]}"#,
            ),
            (Dialect::Responses, r#"{"model":"gpt-5","input":"x"}"#),
        ] {
            let sent = |t: &str| cold.replacen('{', &format!("{{\"temperature\":{t},"), 1);
            assert!(matches!(
                d(&cfg(), dialect, &sent("0"), None),
                Decision::Cacheable(_)
            ));
            assert_eq!(d(&cfg(), dialect, &sent("0.5"), None), temperature);
            assert!(matches!(
                d(&warm, dialect, &sent("0.5"), None),
                Decision::Cacheable(_)
            ));
            // No temperature is no default to compare: only an opt-in helps.
            assert_eq!(d(&cfg(), dialect, cold, None), temperature, "{dialect:?}");
            assert_eq!(d(&warm, dialect, cold, None), temperature, "{dialect:?}");
            assert!(matches!(
                d(&cfg(), dialect, cold, Some("max-age=5")),
                Decision::Cacheable(_)
            ));
        }
        // Chat keeps its rule: no temperature is the default of 1.0.
        assert!(matches!(
            d(&warm, Dialect::Chat, r#"{"model":"m"}"#, None),
            Decision::Cacheable(_)
        ));
    }

    #[test]
    fn a_responses_call_that_continues_state_bypasses() {
        let d = |body: &str| decide_with(&cfg(), Dialect::Responses, body, None, None);
        for body in [
            r#"{"temperature":0,"input":"x","previous_response_id":"resp_1"}"#,
            r#"{"temperature":0,"input":"x","conversation":"conv_1"}"#,
            r#"{"temperature":0,"input":"x","conversation":{"id":"conv_1"}}"#,
            r#"{"temperature":0,"input":"x","background":true}"#,
        ] {
            assert_eq!(d(body), Decision::Bypass(BypassReason::State), "{body}");
        }
        for body in [
            r#"{"temperature":0,"input":"x","store":false}"#,
            r#"{"temperature":0,"input":"x","store":true}"#,
            r#"{"temperature":0,"input":"x","background":false,"previous_response_id":null}"#,
        ] {
            assert!(matches!(d(body), Decision::Cacheable(_)), "{body}");
        }
        // The field means nothing to another dialect.
        let messages = r#"{"temperature":0,"messages":[],"previous_response_id":"resp_1"}"#;
        assert!(matches!(
            decide_with(&cfg(), Dialect::Messages, messages, None, None),
            Decision::Cacheable(_)
        ));
        assert_eq!(BypassReason::State.as_str(), "state");
    }

    /// An answer kept as the upstream sent it echoes the request and differs
    /// by delivery: nothing of the body stays out of its key.
    #[test]
    fn a_kept_as_sent_answer_is_keyed_on_its_whole_body() {
        let k = |dialect, body: &str| match decide_with(&cfg(), dialect, body, None, None) {
            Decision::Cacheable(c) => (c.key, c.stream),
            d => panic!("{body}: {d:?}"),
        };
        for (dialect, base) in [
            (Dialect::Messages, r#"{"temperature":0,"messages":[]}"#),
            (Dialect::Responses, r#"{"temperature":0,"input":"x"}"#),
        ] {
            let with = |f: &str| k(dialect, &base.replacen('{', &format!("{{{f},"), 1));
            let (plain, stream) = (k(dialect, base), with(r#""stream":true"#));
            assert!(!plain.1 && stream.1);
            assert_ne!(plain.0, stream.0, "{dialect:?}");
            for f in [
                r#""user":"u1""#,
                r#""metadata":{"user_id":"u1"}"#,
                r#""stream":false"#,
                r#""stream_options":{"include_obfuscation":false}"#,
            ] {
                assert_ne!(with(f).0, plain.0, "{f}");
            }
            assert_eq!(k(dialect, &base.replace(':', " : ")), plain, "spelling");
        }
    }

    #[test]
    fn dynamic_markers_are_sought_in_each_dialects_prompt() {
        let c = CacheConfig {
            dynamic_markers: vec!["{{now}}".into()],
            ..cfg()
        };
        let marker = Decision::Bypass(BypassReason::DynamicMarker);
        for (dialect, body) in [
            (
                Dialect::Messages,
                r#"{"temperature":0,"system":"at {{now}}","messages":[]}"#,
            ),
            (
                Dialect::Messages,
                r#"{"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"{{now}}"}]}]}"#,
            ),
            (
                Dialect::Responses,
                r#"{"temperature":0,"instructions":"{{now}}","input":"x"}"#,
            ),
            (
                Dialect::Responses,
                r#"{"temperature":0,"input":[{"role":"user","content":"{{now}}"}]}"#,
            ),
        ] {
            assert_eq!(decide_with(&c, dialect, body, None, None), marker, "{body}");
        }
        let elsewhere = r#"{"temperature":0,"metadata":{"x":"{{now}}"},"input":"x"}"#;
        assert!(matches!(
            decide_with(&c, Dialect::Responses, elsewhere, None, None),
            Decision::Cacheable(_)
        ));
    }

    #[test]
    fn dynamic_markers_bypass_chat_and_completions_only() {
        let c = CacheConfig {
            dynamic_markers: vec!["{{now}}".into()],
            ..cfg()
        };
        let d = |dialect, body: &str| decide_with(&c, dialect, body, None, None);
        let marked = r#"{"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"time: {{now}}"}]}]}"#;
        assert_eq!(
            d(Dialect::Chat, marked),
            Decision::Bypass(BypassReason::DynamicMarker)
        );
        let escaped = r#"{"temperature":0,"messages":[{"role":"user","content":"\u007b{now}}"}]}"#;
        assert_eq!(
            d(Dialect::Chat, escaped),
            Decision::Bypass(BypassReason::DynamicMarker)
        );
        assert_eq!(
            d(
                Dialect::Completions,
                r#"{"temperature":0,"prompt":["a","{{now}}"]}"#
            ),
            Decision::Bypass(BypassReason::DynamicMarker)
        );
        // The marker outside the prompt (a model name) does not count.
        assert!(matches!(
            d(
                Dialect::Chat,
                r#"{"temperature":0,"model":"{{now}}","messages":[]}"#
            ),
            Decision::Cacheable(Cacheable { .. })
        ));
        assert!(matches!(
            d(Dialect::Embeddings, r#"{"input":"{{now}}"}"#),
            Decision::Cacheable(Cacheable { .. })
        ));
    }

    /// A body another reader may resolve differently must never meet an entry.
    #[test]
    fn a_repeated_key_anywhere_is_never_cacheable() {
        for body in [
            r#"{"model":"a","model":"b","temperature":0}"#,
            r#"{"model":"a","temperature":0,"model":"a"}"#,
            r#"{"model":"a","mod\u0065l":"b","temperature":0}"#,
            r#"{"temperature":0,"messages":[{"role":"user","content":"a","content":"b"}]}"#,
            r#"{"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
            r#"{"temperature":0,"tools":[{"type":"function","function":{"name":"f","parameters":{"a":1,"a":2}}}]}"#,
            // Fields kept out of the key still decide how the answer is delivered.
            r#"{"temperature":0,"stream":true,"stream":false}"#,
            r#"{"temperature":0,"stream_options":{"include_usage":true,"include_usage":false}}"#,
            r#"{"temperature":0,"user":"a","user":"b"}"#,
        ] {
            assert_eq!(
                chat(body),
                Decision::Bypass(BypassReason::DuplicateKey),
                "{body}"
            );
        }
        assert_eq!(BypassReason::DuplicateKey.as_str(), "duplicate_key");
        // The same key in different objects is no repeat.
        assert!(matches!(
            chat(
                r#"{"temperature":0,"a":{"x":1},"b":{"x":1},"messages":[{"role":"user"},{"role":"user"}]}"#
            ),
            Decision::Cacheable(_)
        ));
    }

    /// Numbers are keyed by their exact value: distinct values beyond `f64`
    /// (which a reader rounding to `f64` would confuse) keep distinct keys,
    /// and the same value however spelled shares one.
    #[test]
    fn numbers_beyond_f64_are_keyed_exactly() {
        let seed = |n: &str| {
            key(&BASE.replace(
                "\"temperature\":0",
                &format!("\"temperature\":0,\"seed\":{n}"),
            ))
        };
        for (a, b) in [
            ("9007199254740993", "9007199254740992"),
            (
                "123456789012345678901234567890",
                "123456789012345678901234567891",
            ),
            ("1e400", "1e401"),
            ("-1e400", "1e400"),
            ("1e-400", "0"),
            ("1e-400", "2e-400"),
            ("1e99999999999999999999", "1e99999999999999999998"),
        ] {
            assert_ne!(seed(a), seed(b), "{a} vs {b}");
        }
        for (a, b) in [
            ("1e400", "10e399"),
            ("1e400", "0.1E+401"),
            (
                "123456789012345678901234567890",
                "1.2345678901234567890123456789e29",
            ),
            ("0", "-0.0e-999"),
        ] {
            assert_eq!(seed(a), seed(b), "{a} vs {b}");
        }
    }

    /// What is not strict JSON text is refused, whatever a lenient reader
    /// would make of it; an escaped NUL is valid JSON and keyed exactly.
    #[test]
    fn invalid_text_is_refused_and_nul_is_exact() {
        let invalid = Decision::Bypass(BypassReason::InvalidBody);
        let with_content = |c: &[u8]| {
            let mut b = br#"{"temperature":0,"messages":[{"role":"user","content":""#.to_vec();
            b.extend_from_slice(c);
            b.extend_from_slice(br#""}]}"#);
            b
        };
        let decide_bytes = |b: &[u8]| {
            let body = Json::parse(b);
            decide(
                &cfg(),
                &CacheRequest {
                    dialect: Dialect::Chat,
                    path: CHAT,
                    body: body.as_ref(),
                    cache_control: None,
                    credentials: &[],
                },
            )
        };
        for bad in [
            &b"hi\xff"[..],
            b"\xc3",
            b"\xed\xa0\x80",  // a surrogate encoded as UTF-8
            b"\xc0\xaf",      // overlong `/`
            br"\ud800",       // lone high surrogate
            br"\udc00",       // lone low surrogate
            br"\ud800\u0041", // high surrogate without its low half
            br"\udc00\ud800", // the pair the wrong way round
            b"a\x00b",        // a raw control character
        ] {
            assert_eq!(decide_bytes(&with_content(bad)), invalid, "{bad:?}");
        }
        let k = |c: &[u8]| match decide_bytes(&with_content(c)) {
            Decision::Cacheable(c) => c.key,
            d => panic!("{d:?}"),
        };
        assert_eq!(k(br"hi\u0000"), k(br"hi\u0000"));
        assert_ne!(k(br"hi\u0000"), k(b"hi"));
        assert_ne!(k(br"hi\u0000"), k(br"hi\u0001"));
        assert_ne!(k(br"hi\u0000x"), k(br"hi\u0000"));
        assert_eq!(k(br"\ud83d\ude00"), k("😀".as_bytes()));
    }

    /// Nesting far past the limit is refused, not recursed into: the whole
    /// decision runs within the wasm stack (1 MiB).
    #[test]
    fn deep_nesting_is_refused_within_the_wasm_stack() {
        let run = || {
            for (open, close) in [("[", "]"), ("{\"a\":", "}"), ("[{\"a\":", "}]")] {
                for depth in [200, 10_000] {
                    let body = format!(
                        r#"{{"temperature":0,"messages":{}1{}}}"#,
                        open.repeat(depth),
                        close.repeat(depth)
                    );
                    assert_eq!(chat(&body), Decision::Bypass(BypassReason::InvalidBody));
                }
            }
            // The deepest document allowed is read, keyed and its features taken.
            let mut body =
                String::from(r#"{"temperature":0,"messages":[{"role":"user","content":"#);
            let inner = crate::json::MAX_DEPTH - 4;
            body.push_str(&"[{\"a\":".repeat(inner / 2));
            body.push('1');
            body.push_str(&"}]".repeat(inner / 2));
            body.push_str("}]}");
            let tree = Json::parse(body.as_bytes()).expect("within the limit");
            assert!(crate::dialect::features::Features::from_json(
                crate::dialect::Dialect::Chat,
                &tree
            )
            .is_some());
            assert!(matches!(chat(&body), Decision::Cacheable(_)));
        };
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_gemini_call_is_read_from_its_path_and_generation_config() {
        let decide_on = |path: &str, body: &str, cc: Option<&str>| {
            let creds = [Some("k"), None];
            let body = Json::parse(body.as_bytes());
            decide(
                &cfg(),
                &CacheRequest {
                    dialect: Dialect::Gemini,
                    path,
                    body: body.as_ref(),
                    cache_control: cc,
                    credentials: &creds,
                },
            )
        };
        let plain = "/v1beta/models/g:generateContent";
        let stream = "/v1beta/models/g:streamGenerateContent?alt=sse";
        let cold = r#"{"contents":[],"generationConfig":{"temperature":0}}"#;
        let Decision::Cacheable(c) = decide_on(plain, cold, None) else {
            panic!("a temperature of 0 in generationConfig is deterministic");
        };
        assert!(!c.stream);
        let Decision::Cacheable(s) = decide_on(stream, cold, None) else {
            panic!("streamed alike");
        };
        assert!(s.stream, "the stream is the path's");
        assert_ne!(c.key, s.key, "each path its own entry");
        let hot = r#"{"contents":[],"generationConfig":{"temperature":1.5}}"#;
        assert_eq!(
            decide_on(plain, hot, None),
            Decision::Bypass(BypassReason::Temperature)
        );
        assert!(matches!(
            decide_on(plain, hot, Some("max-age=60")),
            Decision::Cacheable(_)
        ));
        // A top-level temperature is no Gemini field: it counts for nothing.
        assert_eq!(
            decide_on(plain, r#"{"contents":[],"temperature":0}"#, None),
            Decision::Bypass(BypassReason::Temperature)
        );
        // The model of `deterministic_models` is the path's.
        let c = CacheConfig {
            deterministic_models: vec!["g".into()],
            ..cfg()
        };
        let creds = [None, None];
        let body = Json::parse(hot.as_bytes());
        let by_model = decide(
            &c,
            &CacheRequest {
                dialect: Dialect::Gemini,
                path: plain,
                body: body.as_ref(),
                cache_control: None,
                credentials: &creds,
            },
        );
        assert!(matches!(by_model, Decision::Cacheable(_)));
    }
}

#[cfg(all(test, feature = "cache"))]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz::{self, Doc, Num};

    /// A cacheable chat request: model, zero temperature, messages and some
    /// arbitrary extra parameters.
    fn request() -> impl Strategy<Value = Doc> {
        let message = (
            prop::sample::select(vec!["system", "user", "assistant"]),
            fuzz::text(),
        )
            .prop_map(|(role, content)| {
                Doc::Obj(vec![
                    ("role".into(), Doc::Str(role.into())),
                    ("content".into(), Doc::Str(content)),
                ])
            });
        (
            fuzz::text(),
            prop::collection::vec(message, 0..4),
            prop::collection::btree_map("x_[a-z]{1,4}", fuzz::doc(true), 0..3),
        )
            .prop_map(|(model, messages, extra)| {
                let zero = Num {
                    negative: false,
                    digits: String::new(),
                    exp: 0,
                };
                let mut m = vec![
                    ("model".to_string(), Doc::Str(model)),
                    ("temperature".to_string(), Doc::Num(zero)),
                    ("messages".to_string(), Doc::Arr(messages)),
                ];
                m.extend(extra);
                Doc::Obj(m)
            })
    }

    fn decide_text(body: &str) -> Decision {
        let tree = Json::parse(body.as_bytes());
        decide(
            &CacheConfig::default(),
            &CacheRequest {
                dialect: Dialect::Chat,
                path: "/v1/chat/completions",
                body: tree.as_ref(),
                cache_control: None,
                credentials: &[Some("Bearer t")],
            },
        )
    }

    fn key_of(body: &str) -> Option<Key> {
        match decide_text(body) {
            Decision::Cacheable(c) => Some(c.key),
            Decision::Bypass(_) => None,
        }
    }

    /// Puts a second member named like an existing one into some object of
    /// the document (chosen by `at`); `false` when it has no non-empty object.
    fn repeat_a_key(doc: &mut Doc, at: &mut usize) -> bool {
        match doc {
            Doc::Arr(items) => items.iter_mut().any(|i| repeat_a_key(i, at)),
            Doc::Obj(members) => {
                if !members.is_empty() {
                    if *at == 0 {
                        let k = members[members.len() / 2].0.clone();
                        members.push((k, Doc::Null));
                        return true;
                    }
                    *at -= 1;
                }
                members.iter_mut().any(|(_, v)| repeat_a_key(v, at))
            }
            _ => false,
        }
    }

    proptest! {
        #![proptest_config(fuzz::config(128))]

        /// The key is the same for every spelling of a request, and another
        /// model is another key.
        #[test]
        fn the_key_is_stable_under_reformatting(req in request(), a: u64, b: u64, other in fuzz::text()) {
            let k = key_of(&req.spell(a));
            prop_assert!(k.is_some());
            prop_assert_eq!(key_of(&req.spell(b)), k);
            let mut moved = req.clone();
            if let Doc::Obj(m) = &mut moved {
                if m[0].1 != Doc::Str(other.clone()) {
                    m[0].1 = Doc::Str(other);
                    prop_assert_ne!(key_of(&moved.spell(a)), k);
                }
            }
        }

        /// A key repeated in any object, at any depth, makes the body not
        /// cacheable; a body without repeats never reads as one.
        #[test]
        fn a_repeated_key_always_bypasses(req in request(), at in 0usize..8, seed: u64) {
            prop_assert!(!matches!(decide_text(&req.spell(seed)), Decision::Bypass(BypassReason::DuplicateKey)));
            let mut twice = req.clone();
            let mut at = at;
            if repeat_a_key(&mut twice, &mut at) {
                prop_assert_eq!(decide_text(&twice.spell(seed)), Decision::Bypass(BypassReason::DuplicateKey));
            }
        }

        /// Any document in any dialect, under any `cache-control`, gets a
        /// decision, never a panic; one that continues state never a key.
        #[test]
        fn any_body_is_decided_in_every_dialect(doc in fuzz::doc(false), seed: u64, control in ".{0,24}") {
            let text = doc.spell(seed);
            let tree = Json::parse(text.as_bytes());
            for dialect in [Dialect::Responses, Dialect::Messages, Dialect::Embeddings, Dialect::Other] {
                let d = decide(
                    &CacheConfig::default(),
                    &CacheRequest {
                        dialect,
                        path: "/v1/x",
                        body: tree.as_ref(),
                        cache_control: Some(&control),
                        credentials: &[None, None, Some("k")],
                    },
                );
                let continues = tree.as_ref().is_some_and(|t| Continues::of(dialect, t).state);
                prop_assert!(!(continues && matches!(d, Decision::Cacheable(_))));
            }
        }

        /// Any document, broken or not, gets a decision, never a panic.
        #[test]
        fn any_body_is_decided(doc in fuzz::doc(false), seed: u64) {
            let _ = decide_text(&String::from_utf8_lossy(&fuzz::mutated(&doc, seed)));
            let tree = Json::parse(doc.spell(seed).as_bytes()).unwrap();
            if matches!(tree, Json::Object(_)) {
                let d = decide_text(&doc.spell(seed));
                prop_assert_eq!(d == Decision::Bypass(BypassReason::DuplicateKey), tree.repeats_a_key());
            }
        }
    }
}

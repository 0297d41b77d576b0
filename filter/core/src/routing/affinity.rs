//! Affinity: the calls of one conversation go to one backend while it stays
//! healthy, so the provider's prompt cache (or a model server's prefix cache)
//! holds their common prefix warm. Each call gets a key — the caller's
//! `prompt_cache_key`, a session header, or a hash of the prefix a prompt
//! cache keys on — and the backend is picked by weighted rendezvous hashing
//! over the effective weights:
//!
//! ```text
//! pick(key) = argmax over backends i with w_i > 0 of  −w_i / ln(u_i)
//!             u_i = (mix64(key ⊕ mix64(fnv1a64(cluster_i))) >> 12 + ½) / 2^52,  in (0, 1)
//! ```
//!
//! `w_i` is the effective weight [`flattened`]: weights within a quarter of
//! the best count as the best, so that equal backends whose weights jitter
//! with each latency sample keep their conversations. `u_i` is uniform and
//! independent per backend, so a key lands on backend `i` with probability
//! `w_i / Σ w_j`; a weight that changes moves only keys
//! to or from that backend, and an ejected backend (weight 0) hands its keys
//! to the backends that would have been their next choice. The same key, in
//! hex, is what a self-hosted pool's consistent hashing reads
//! ([`AffinityConfig::header`]) and what an OpenAI-compatible backend may get
//! as `prompt_cache_key`.

use serde::Deserialize;

use crate::config::check;
use crate::config::error::ConfigError;
use crate::config::setting::{List, Row, Setting};
use crate::dialect::Dialect;
use crate::json::Json;

/// Default request header carrying the key to a pool's consistent hashing.
pub const DEFAULT_HEADER: &str = "x-llm-affinity";
/// Default header a caller names its session in.
pub const DEFAULT_SESSION_HEADER: &str = "x-session-id";
/// Default bytes of each part of the prefix hashed.
pub const DEFAULT_PREFIX_BYTES: usize = 4096;
/// Most bytes of each part of the prefix hashed.
const MAX_PREFIX_BYTES: usize = 1 << 20;
/// `prefix_bytes`.
const PREFIX_BYTES: Setting<usize> =
    Setting::range("prefix_bytes", DEFAULT_PREFIX_BYTES, 1, MAX_PREFIX_BYTES);
/// `enabled`.
const ENABLED: Setting<bool> = Setting::any("enabled", true);
/// `sources`: every source, the body's key first.
const SOURCES: List<&str> = List::new("sources", &["prompt_cache_key", "header", "prefix"]);
/// The settings of `routing.affinity`.
pub const SETTINGS: &[&dyn Row] = &[
    &ENABLED,
    &SOURCES,
    &Setting::any("session_header", DEFAULT_SESSION_HEADER),
    &PREFIX_BYTES,
    &Setting::any("header", DEFAULT_HEADER),
];
/// Longest session header value or `prompt_cache_key` taken as a key; a
/// longer one is hashed up to this many bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Headers the affinity header must not be: they carry the request itself.
const RESERVED_HEADERS: [&str; 8] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "authorization",
    "cookie",
    "te",
];

/// Where a call's key comes from, tried in the configured order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The body's `prompt_cache_key` (OpenAI chat and Responses).
    PromptCacheKey,
    /// The session header ([`AffinityConfig::session_header`]).
    Header,
    /// The prefix a prompt cache keys on: tools and the system prompt (or
    /// instructions; Anthropic's, up to its first `cache_control` mark), and
    /// the conversation's first user turn, each bounded.
    Prefix,
}

impl Source {
    /// Every source, by its name in the configuration.
    pub const ALL: [(&'static str, Self); 3] = [
        ("prompt_cache_key", Self::PromptCacheKey),
        ("header", Self::Header),
        ("prefix", Self::Prefix),
    ];

    /// The tag hashed ahead of the key's material, so sources never collide.
    fn tag(self) -> &'static [u8] {
        match self {
            Self::PromptCacheKey => b"prompt_cache_key\0",
            Self::Header => b"header\0",
            Self::Prefix => b"prefix\0",
        }
    }
}

/// `routing.affinity` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawAffinity {
    /// Affinity on, default true.
    pub enabled: Option<bool>,
    /// Key sources in order (`prompt_cache_key`, `header`, `prefix`),
    /// default all three. Names, not an enum: the configuration's
    /// deserializer then needs no code of its own for them.
    pub sources: Option<Vec<String>>,
    /// Header naming the caller's session, default `x-session-id`.
    pub session_header: Option<String>,
    /// Bytes of each part of the prefix hashed, default 4096.
    pub prefix_bytes: Option<usize>,
    /// Header the key is written into, default `x-llm-affinity`; `""`: none.
    pub header: Option<String>,
}

/// The compiled `routing.affinity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityConfig {
    /// Affinity picks the backend of calls with a key.
    pub enabled: bool,
    /// Key sources in order; the first that gives a key wins.
    pub sources: Vec<Source>,
    /// Header naming the caller's session (lowercase).
    pub session_header: String,
    /// Bytes of each part of the prefix hashed.
    pub prefix_bytes: usize,
    /// Header the key is written into (lowercase), `None`: not written.
    pub header: Option<String>,
}

impl Default for AffinityConfig {
    /// The empty section, as compiling `{}` gives it (the tests check).
    fn default() -> Self {
        Self {
            enabled: ENABLED.default,
            sources: SOURCES
                .default
                .iter()
                .filter_map(|n| Source::ALL.iter().find(|(name, _)| name == n))
                .map(|&(_, s)| s)
                .collect(),
            session_header: DEFAULT_SESSION_HEADER.to_string(),
            prefix_bytes: PREFIX_BYTES.default,
            header: Some(DEFAULT_HEADER.to_string()),
        }
    }
}

impl AffinityConfig {
    /// Compiles `routing.affinity`; errors name fields relative to it.
    pub fn compile(raw: RawAffinity) -> Result<Self, ConfigError> {
        let sources = SOURCES
            .or_into(raw.sources)
            .iter()
            .map(|n| {
                Source::ALL
                    .iter()
                    .find(|(name, _)| name == n)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| {
                        ConfigError::new(
                            "sources",
                            format!("{n:?} is not one of prompt_cache_key, header, prefix"),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sources.is_empty() {
            return Err(ConfigError::new(
                "sources",
                "lists no source; set enabled to false instead",
            ));
        }
        let session_header = header_name(
            "session_header",
            raw.session_header
                .unwrap_or_else(|| DEFAULT_SESSION_HEADER.to_string()),
        )?;
        let header = match raw.header {
            None => Some(DEFAULT_HEADER.to_string()),
            Some(h) if h.is_empty() => None,
            Some(h) => Some(header_name("header", h)?),
        };
        Ok(Self {
            enabled: ENABLED.or(raw.enabled),
            sources,
            session_header,
            prefix_bytes: PREFIX_BYTES.read(raw.prefix_bytes)?,
            header,
        })
    }

    /// The key of a call to `dialect` with body `body` (when held) and
    /// session header value `session`; `None` when affinity is off or no
    /// source gives one.
    pub fn key_of(
        &self,
        dialect: Dialect,
        body: Option<&Json>,
        session: Option<&str>,
    ) -> Option<Key> {
        if !self.enabled || !keyed(dialect) {
            return None;
        }
        self.sources.iter().find_map(|source| {
            let mut h = Hasher::default();
            h.update(source.tag());
            let found = match source {
                Source::PromptCacheKey => match body?.get("prompt_cache_key") {
                    Some(Json::String(k)) if !k.is_empty() => {
                        h.update(bounded(k.as_bytes(), MAX_KEY_BYTES));
                        true
                    }
                    _ => false,
                },
                Source::Header => match session.map(str::trim) {
                    Some(s) if !s.is_empty() => {
                        h.update(bounded(s.as_bytes(), MAX_KEY_BYTES));
                        true
                    }
                    _ => false,
                },
                Source::Prefix => prefix(dialect, body?, self.prefix_bytes, &mut h),
            };
            found.then(|| Key(h.finish()))
        })
    }
}

/// A header name as configured, lowercased; refused when it is no token or
/// carries the request itself.
fn header_name(field: &str, name: String) -> Result<String, ConfigError> {
    if !check::is_token(&name) {
        return Err(ConfigError::new(
            field,
            format!("{name:?} is not a header name"),
        ));
    }
    let name = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&name.as_str())
        || name.starts_with("x-envoy-")
        || name.starts_with(':')
    {
        return Err(ConfigError::new(
            field,
            format!("{name:?} carries the request itself"),
        ));
    }
    Ok(name)
}

/// The APIs whose calls continue a conversation over a prompt cache.
fn keyed(dialect: Dialect) -> bool {
    dialect.request().converses()
}

/// The APIs that take a `prompt_cache_key` in the request body.
pub fn takes_prompt_cache_key(dialect: Dialect) -> bool {
    dialect.request().takes_prompt_cache_key()
}

/// A call's affinity key: a 64-bit hash of its source and material.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(pub u64);

/// FNV-1a over everything fed, finished by [`mix64`]: a routing key needs
/// spread, not secrecy (a caller who forges a collision only shares a
/// backend), and this costs the `.wasm` nothing.
struct Hasher(u64);

impl Default for Hasher {
    fn default() -> Self {
        Self(FNV_OFFSET)
    }
}

impl Hasher {
    fn update(&mut self, bytes: &[u8]) {
        self.0 = fnv1a64_from(self.0, bytes);
    }

    fn finish(&self) -> u64 {
        mix64(self.0)
    }
}

impl Key {
    /// The key as 16 lowercase hex digits: the header's value and the
    /// `prompt_cache_key` the filter sets.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }

    /// The key of `tenant`'s call: two tenants whose calls say the same
    /// (a session id, a prefix) never share a key, and the tenant's id is
    /// never in it, only mixed into its hash. No tenant: the key as it is.
    pub fn of_tenant(self, tenant: Option<&str>) -> Self {
        match tenant {
            Some(t) => Self(mix64(
                self.0 ^ mix64(fnv1a64_from(fnv1a64(b"tenant\0"), t.as_bytes())),
            )),
            None => self,
        }
    }

    /// The rendezvous hash of this key with `cluster`, uniform over `u64`.
    pub fn hash_with(self, cluster: &str) -> u64 {
        mix64(self.0 ^ mix64(fnv1a64(cluster.as_bytes())))
    }
}

/// The first `max` bytes of `bytes`.
fn bounded(bytes: &[u8], max: usize) -> &[u8] {
    bytes.get(..max).unwrap_or(bytes)
}

/// Feeds `h` the canonical bytes of `items`, one after the other, bounded to
/// `max` in all, length first; false for none.
fn feed_items(h: &mut Hasher, items: &[Json], max: usize) -> bool {
    let mut out = Vec::new();
    for item in items {
        item.write(&mut out);
        if out.len() >= max {
            break;
        }
    }
    let part = bounded(&out, max);
    h.update(&(part.len() as u64).to_le_bytes());
    h.update(part);
    !items.is_empty()
}

/// Feeds `h` the prefix a prompt cache keys on, where the dialect says it
/// is: the shared parts (tools, the system prompt or instructions) and the
/// first user turn, each bounded to `max` bytes, so a conversation keeps its
/// key as its history grows while conversations that share a long system
/// prompt still differ. False when the body has neither.
fn prefix(dialect: Dialect, body: &Json, max: usize, h: &mut Hasher) -> bool {
    let Some(prefix) = dialect.request().prefix(body) else {
        return false;
    };
    let mut shared = false;
    for part in prefix.shared.into_iter().flatten() {
        shared |= feed_items(h, part, max);
    }
    feed_items(h, prefix.turn, max) || shared
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64 bits: a cluster name's seed (then mixed).
fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_from(FNV_OFFSET, bytes)
}

fn fnv1a64_from(start: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(start, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// SplitMix64's finalizer: every input bit moves every output bit.
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rendezvous score of a backend of weight `weight` whose hash with the
/// key is `hash`: `−w / ln(u)`, `u` in (0, 1) from the hash's top 52 bits.
/// 0 for a weight that is not finite and positive.
pub fn score(weight: f64, hash: u64) -> f64 {
    if !(weight.is_finite() && weight > 0.0) {
        return 0.0;
    }
    // 52 bits, so that u + ½ ulp never rounds up to 1.
    let u = ((hash >> 12) as f64 + 0.5) / (1u64 << 52) as f64;
    let s = -weight / ln(u);
    if s.is_finite() {
        s
    } else {
        0.0
    }
}

/// The natural logarithm of a normal, positive `x` (every `u` of [`score`]
/// is at least 2^−53): `x = m × 2^e` with `m` in [√½, √2), and
/// `ln x = e × ln 2 + 2 × atanh((m − 1) / (m + 1))` by its series, whose
/// terms past s^23 (|s| < 0.172) are below the last bit. Computed here
/// rather than by the C library's `log`, whose tables would cost the
/// `.wasm` several kilobytes, and so the same bits give the same score on
/// every platform.
fn ln(x: f64) -> f64 {
    const MANTISSA: u64 = (1 << 52) - 1;
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & MANTISSA) | (1023 << 52));
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let (mut term, mut sum) = (s, 0.0);
    for k in 0..12u32 {
        sum += term / f64::from(2 * k + 1);
        term *= s2;
    }
    e as f64 * std::f64::consts::LN_2 + 2.0 * sum
}

/// Share of the best weight within which a weight counts as the best: equal
/// backends' effective weights move with every latency sample (a single
/// slow call moves a backend's tail), and a conversation must not hop
/// between them for that. A quarter, because a warm prompt cache saves more
/// than that: cached input is billed at a half to a tenth and its time to
/// first token falls about as much.
pub const FLAT_TOP: f64 = 1.0 / 4.0;

/// `weight` as the rendezvous reads it, given the model's `best` weight:
/// `min(1, w / (best × (1 − FLAT_TOP)))`. Flat over the top quarter, so
/// jitter there moves no key; linear, hence continuous, below it, so a
/// weight that falls moves its keys a few at a time, never in a jump.
pub fn flattened(weight: f64, best: f64) -> f64 {
    if !(weight.is_finite() && weight > 0.0 && best.is_finite() && best > 0.0) {
        return 0.0;
    }
    (weight / (best * (1.0 - FLAT_TOP))).min(1.0)
}

/// The backend a key goes to: the highest [`score`] of `weights[i]`,
/// [`flattened`], with `hashes[i]` (the first on a tie); `None` when no
/// weight is positive.
pub fn pick(weights: &[f64], hashes: &[u64]) -> Option<usize> {
    let best = weights
        .iter()
        .copied()
        .filter(|w| w.is_finite())
        .fold(0.0, f64::max);
    weights
        .iter()
        .zip(hashes)
        .enumerate()
        .map(|(i, (w, h))| (i, score(flattened(*w, best), *h)))
        .filter(|(_, s)| *s > 0.0)
        .max_by(|(i, a), (j, b)| a.total_cmp(b).then(j.cmp(i)))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AffinityConfig {
        AffinityConfig::default()
    }

    fn body(s: &str) -> Json {
        Json::parse(s.as_bytes()).unwrap()
    }

    fn key(dialect: Dialect, b: &str, session: Option<&str>) -> Option<Key> {
        cfg().key_of(dialect, Some(&body(b)), session)
    }

    #[test]
    fn each_tenant_has_its_own_key_and_keeps_it() {
        let k = key(Dialect::Chat, r#"{"messages":[]}"#, Some("s1")).unwrap();
        let a = k.of_tenant(Some("team-a"));
        assert_eq!(a, k.of_tenant(Some("team-a")));
        assert_ne!(a, k.of_tenant(Some("team-b")));
        assert_ne!(a, k);
        assert_eq!(k.of_tenant(None), k);
        // The id is hashed in, never spelled out.
        assert!(!a.hex().contains("team"));
    }

    #[test]
    fn the_sources_are_tried_in_order() {
        let chat =
            r#"{"model":"m","prompt_cache_key":"k1","messages":[{"role":"user","content":"hi"}]}"#;
        let by_pck = key(Dialect::Chat, chat, Some("s1")).unwrap();
        let no_pck = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let by_session = key(Dialect::Chat, no_pck, Some("s1")).unwrap();
        let by_prefix = key(Dialect::Chat, no_pck, None).unwrap();
        assert_ne!(by_pck, by_session);
        assert_ne!(by_session, by_prefix);
        // The same key whatever else the call says.
        assert_eq!(
            key(
                Dialect::Chat,
                r#"{"prompt_cache_key":"k1","messages":[]}"#,
                None
            ),
            Some(by_pck)
        );
        assert_eq!(
            key(Dialect::Chat, r#"{"messages":[]}"#, Some(" s1 ")),
            Some(by_session)
        );
        // Empty values are no key; a body with nothing to hash has none.
        assert_eq!(key(Dialect::Chat, r#"{"messages":[]}"#, Some("")), None);
        assert_eq!(key(Dialect::Chat, r#"{"prompt_cache_key":""}"#, None), None);
        // Embeddings keep a cache of no prompt.
        assert_eq!(
            key(Dialect::Embeddings, r#"{"input":"hi"}"#, Some("s1")),
            None
        );
        let off = AffinityConfig {
            enabled: false,
            ..cfg()
        };
        assert_eq!(off.key_of(Dialect::Chat, Some(&body(chat)), None), None);
        let header_only = AffinityConfig {
            sources: vec![Source::Header],
            ..cfg()
        };
        assert_eq!(
            header_only.key_of(Dialect::Chat, Some(&body(chat)), None),
            None
        );
        assert_eq!(
            header_only.key_of(Dialect::Chat, None, Some("s1")),
            Some(by_session)
        );
    }

    #[test]
    fn a_conversation_keeps_its_prefix_key_as_it_grows() {
        let turn = |history: &str| {
            format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"be brief"}},{{"role":"user","content":"plan a trip"}}{history}]}}"#
            )
        };
        let first = key(Dialect::Chat, &turn(""), None).unwrap();
        let later = key(
            Dialect::Chat,
            &turn(
                r#",{"role":"assistant","content":"where to?"},{"role":"user","content":"Rome"}"#,
            ),
            None,
        )
        .unwrap();
        assert_eq!(first, later);
        // Another conversation under the same system prompt differs.
        let other = key(
            Dialect::Chat,
            r#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"write a poem"}]}"#,
            None,
        );
        assert_ne!(Some(first), other);
        // Another system prompt differs too.
        let other = key(
            Dialect::Chat,
            r#"{"messages":[{"role":"system","content":"be long"},{"role":"user","content":"plan a trip"}]}"#,
            None,
        );
        assert_ne!(Some(first), other);
    }

    #[test]
    fn a_long_turn_is_hashed_up_to_the_bound() {
        let c = AffinityConfig {
            prefix_bytes: 64,
            ..cfg()
        };
        let long = |tail: &str| {
            body(&format!(
                r#"{{"messages":[{{"role":"user","content":"{}{tail}"}}]}}"#,
                "a".repeat(100)
            ))
        };
        assert_eq!(
            c.key_of(Dialect::Chat, Some(&long("x")), None),
            c.key_of(Dialect::Chat, Some(&long("y")), None)
        );
        assert_ne!(
            cfg().key_of(Dialect::Chat, Some(&long("x")), None),
            cfg().key_of(Dialect::Chat, Some(&long("y")), None)
        );
    }

    #[test]
    fn each_dialect_has_its_prefix() {
        let r = |s| key(Dialect::Responses, s, None);
        assert_eq!(
            r(r#"{"instructions":"i","input":[{"role":"user","content":"a"}]}"#),
            r(
                r#"{"instructions":"i","input":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#
            )
        );
        assert_ne!(r(r#"{"input":"a"}"#), r(r#"{"input":"b"}"#));
        assert_eq!(r(r#"{"model":"m"}"#), None);
        let m = |s| key(Dialect::Messages, s, None);
        // Anthropic: what follows the first cache_control mark is not shared.
        assert_eq!(
            m(
                r#"{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}},{"type":"text","text":"today is Monday"}],"messages":[{"role":"user","content":"a"}]}"#
            ),
            m(
                r#"{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}},{"type":"text","text":"today is Tuesday"}],"messages":[{"role":"user","content":"a"}]}"#
            )
        );
        assert_ne!(
            m(r#"{"system":"s","messages":[{"role":"user","content":"a"}]}"#),
            m(r#"{"system":"t","messages":[{"role":"user","content":"a"}]}"#)
        );
        // A mark on the tools ends the shared part there.
        assert_eq!(
            m(
                r#"{"tools":[{"name":"t","cache_control":{"type":"ephemeral"}}],"system":"x","messages":[{"role":"user","content":"a"}]}"#
            ),
            m(
                r#"{"tools":[{"name":"t","cache_control":{"type":"ephemeral"}}],"system":"y","messages":[{"role":"user","content":"a"}]}"#
            )
        );
        let c = |s| key(Dialect::Completions, s, None);
        assert_ne!(c(r#"{"prompt":"a"}"#), c(r#"{"prompt":"b"}"#));
        assert!(c(r#"{"prompt":"a"}"#).is_some());
    }

    #[test]
    fn the_hex_key_is_sixteen_digits() {
        assert_eq!(Key(0xab).hex(), "00000000000000ab");
        assert_eq!(Key(u64::MAX).hex(), "ffffffffffffffff");
    }

    #[test]
    fn keys_spread_in_proportion_to_the_weights() {
        let clusters = ["a", "b", "c"];
        let weights = [3.0, 1.0, 0.0];
        let mut counts = [0usize; 3];
        for n in 0..20_000u64 {
            let k = Key(mix64(n));
            let hashes: Vec<u64> = clusters.iter().map(|c| k.hash_with(c)).collect();
            if let Some(i) = pick(&weights, &hashes) {
                counts[i] += 1;
            }
        }
        assert_eq!(counts[2], 0, "a weight of 0 gets no key");
        // b's weight, read flattened: (1/3) / (3/4) = 4/9 of a's.
        let share = counts[0] as f64 / 20_000.0;
        assert!((share - 9.0 / 13.0).abs() < 0.015, "{counts:?}");
    }

    #[test]
    fn jitter_near_the_best_moves_no_key() {
        let clusters = ["a", "b", "c"];
        let samples = [
            [1.0, 1.0, 1.0],
            [0.96, 1.0, 0.8],
            [1.0, 0.76, 0.99],
            [0.77, 0.95, 1.0],
        ];
        let (mut moved, mut spread) = (0, [0usize; 3]);
        for n in 0..10_000u64 {
            let k = Key(mix64(n ^ 0xa5));
            let hashes: Vec<u64> = clusters.iter().map(|c| k.hash_with(c)).collect();
            let first = pick(&samples[0], &hashes);
            if let Some(i) = first {
                spread[i] += 1;
            }
            moved += samples[1..]
                .iter()
                .filter(|w| pick(&w[..], &hashes) != first)
                .count();
        }
        assert_eq!(moved, 0);
        assert!(
            spread.iter().all(|c| (3_100..3_600).contains(c)),
            "{spread:?}"
        );
    }

    #[test]
    fn a_falling_weight_moves_its_keys_gradually() {
        let clusters = ["a", "b"];
        let moved = |after: f64| {
            (0..10_000u64)
                .filter(|n| {
                    let k = Key(mix64(*n));
                    let hashes: Vec<u64> = clusters.iter().map(|c| k.hash_with(c)).collect();
                    pick(&[1.0, 1.0], &hashes) != pick(&[1.0, after], &hashes)
                })
                .count()
        };
        // b keeps all its keys down to 3/4 of a, then hands them over in
        // proportion: at 0.6 its share is 0.8 / 1.8.
        assert_eq!(moved(0.76), 0);
        let expected = 10_000.0 * (0.5 - 0.8 / 1.8);
        assert!(
            (moved(0.6) as f64 - expected).abs() < 100.0,
            "{}",
            moved(0.6)
        );
        assert!(moved(0.73) < 100, "{}", moved(0.73));
    }

    #[test]
    fn a_weight_change_moves_only_keys_to_or_from_its_backend() {
        let clusters = ["a", "b", "c", "d"];
        let before = [1.0, 1.0, 1.0, 1.0];
        let after = [1.0, 1.0, 0.5, 1.0];
        let (mut moved, mut moved_elsewhere) = (0, 0);
        for n in 0..10_000u64 {
            let k = Key(mix64(n ^ 0x55));
            let hashes: Vec<u64> = clusters.iter().map(|c| k.hash_with(c)).collect();
            let (x, y) = (pick(&before, &hashes), pick(&after, &hashes));
            if x != y {
                moved += 1;
                if x != Some(2) {
                    moved_elsewhere += 1;
                }
            }
        }
        assert_eq!(moved_elsewhere, 0, "only c's keys move");
        // c's weight, read flattened, falls to 2/3: its share from 1/4 to
        // (2/3) / (3 + 2/3) = 2/11, so 7 % of the keys move.
        assert!((500..900).contains(&moved), "{moved}");
    }

    #[test]
    fn ln_matches_the_library_s() {
        let mut x = 2f64.powi(-53);
        while x < 1.0 {
            for f in [1.0, 1.1, 1.337, 1.414, 1.5, 1.9] {
                let v = x * f;
                let (mine, lib) = (ln(v), v.ln());
                assert!(
                    (mine - lib).abs() <= 1e-13 * lib.abs().max(1.0),
                    "{v}: {mine} vs {lib}"
                );
            }
            x *= 2.0;
        }
        assert_eq!(ln(1.0), 0.0);
        let near_one = 1.0 - 2f64.powi(-53);
        assert!((ln(near_one) - near_one.ln()).abs() < 1e-25);
    }

    #[test]
    fn the_score_never_fails() {
        for h in [0, 1, u64::MAX, 1 << 63] {
            let s = score(1.0, h);
            assert!(s.is_finite() && s > 0.0, "{h}: {s}");
        }
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(score(w, 7), 0.0);
        }
        assert_eq!(pick(&[0.0, f64::NAN], &[1, 2]), None);
        assert_eq!(pick(&[], &[]), None);
        // Fewer hashes than weights: only those paired count.
        assert_eq!(pick(&[1.0, 1.0], &[5]), Some(0));
    }

    #[test]
    fn the_config_names_its_fields() {
        let c = |raw: &str| AffinityConfig::compile(serde_json::from_str(raw).unwrap());
        let d = c("{}").unwrap();
        assert!(d.enabled);
        assert_eq!(d.header.as_deref(), Some(DEFAULT_HEADER));
        assert_eq!(d.session_header, DEFAULT_SESSION_HEADER);
        assert_eq!(c(r#"{"header":""}"#).unwrap().header, None);
        assert_eq!(
            c(r#"{"session_header":"X-Conversation"}"#)
                .unwrap()
                .session_header,
            "x-conversation"
        );
        for (raw, field) in [
            (r#"{"sources":[]}"#, "sources"),
            (r#"{"header":"content-length"}"#, "header"),
            (r#"{"header":"x-envoy-hash"}"#, "header"),
            (r#"{"session_header":"a b"}"#, "session_header"),
            (r#"{"prefix_bytes":0}"#, "prefix_bytes"),
        ] {
            assert_eq!(c(raw).unwrap_err().field, field, "{raw}");
        }
        assert_eq!(c(r#"{"sources":["cookie"]}"#).unwrap_err().field, "sources");
        assert_eq!(
            c(r#"{"sources":["prefix","header"]}"#).unwrap().sources,
            [Source::Prefix, Source::Header]
        );
    }
}

//! W3C Trace Context: continue the caller's trace with a new span for this hop
//! (one the filter exports), pass it on as it came (a hop that exports no
//! span), or start one, so an LLM call can be followed across the mesh and
//! the client learns its trace id.

use crate::host::Random;

/// The W3C `traceparent` header.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header, dropped when a new trace starts.
pub const TRACESTATE: &str = "tracestate";
/// Response header naming the trace id that went upstream.
pub const TRACE_ID_HEADER: &str = "x-trace-id";

/// A parsed `traceparent` (version 00 layout; later versions are read by
/// their first four fields, as the spec asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 128-bit trace id, never all zero.
    pub trace_id: [u8; 16],
    /// 64-bit id of the caller's span, never all zero.
    pub parent_id: [u8; 8],
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
}

/// What to send upstream for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The `traceparent` header value.
    pub traceparent: String,
    /// The trace id as 32 lowercase hex digits, for `x-trace-id`.
    pub trace_id: String,
    /// True when the caller's trace was continued, so its `tracestate` belongs
    /// with it; false when a new trace was started and `tracestate` is orphaned.
    pub continued: bool,
    /// The ids written, for the span of this hop.
    pub span: SpanIds,
}

/// The ids of the span the filter's `traceparent` names: the span of this
/// hop, whose parent is the caller's span (none for a new trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanIds {
    /// The trace.
    pub trace_id: [u8; 16],
    /// This hop's span, the one written upstream.
    pub span_id: [u8; 8],
    /// The caller's span, when its trace was continued.
    pub parent_id: Option<[u8; 8]>,
    /// The trace flags written.
    pub flags: u8,
}

impl SpanIds {
    /// The trace is sampled (flags bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl TraceParent {
    /// Parses a header value by the W3C rules: exact field lengths, lowercase
    /// hex only, version `ff` invalid, all-zero trace or parent id invalid,
    /// version 00 with trailing data invalid.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim_matches(|c| c == ' ' || c == '\t');
        let b = raw.as_bytes();
        let version = hex_u8(b.get(0..2)?)?;
        if version == 0xff || b.get(2) != Some(&b'-') {
            return None;
        }
        match (version, b.len()) {
            (0, 55) => {}
            // A future version may append fields after a dash.
            (v, n) if v > 0 && (n == 55 || (n > 55 && b.get(55) == Some(&b'-'))) => {}
            _ => return None,
        }
        let mut trace_id = [0u8; 16];
        hex_into(b.get(3..35)?, &mut trace_id)?;
        if b.get(35) != Some(&b'-') {
            return None;
        }
        let mut parent_id = [0u8; 8];
        hex_into(b.get(36..52)?, &mut parent_id)?;
        if b.get(52) != Some(&b'-') {
            return None;
        }
        let flags = hex_u8(b.get(53..55)?)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }
}

impl TraceParent {
    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// This `traceparent` as version 00 writes it: what a hop that adds no
    /// span of its own passes on (one header, 55 bytes, whatever version and
    /// spacing it came in).
    pub fn header(&self) -> String {
        header(&self.trace_id, &self.parent_id, self.flags)
    }

    /// The ids of a `traceparent` passed on by a hop that adds no span of
    /// its own: the span the upstream hangs under is the caller's.
    pub fn as_sent(&self) -> SpanIds {
        SpanIds {
            trace_id: self.trace_id,
            span_id: self.parent_id,
            parent_id: None,
            flags: self.flags,
        }
    }
}

/// The trace context for the upstream call: the caller's trace (`parsed`,
/// its valid `traceparent`) continued with a fresh span id (flags kept), or a
/// new trace when the caller sent none or an invalid one, sampled when
/// `sample_root`.
pub fn next(parsed: Option<TraceParent>, rng: &mut dyn Random, sample_root: bool) -> Outgoing {
    let (trace_id, flags) = match parsed {
        Some(p) => (p.trace_id, p.flags),
        None => (new_id::<16>(rng), u8::from(sample_root)),
    };
    let span_id = new_id::<8>(rng);
    Outgoing {
        trace_id: hex(&trace_id),
        traceparent: header(&trace_id, &span_id, flags),
        continued: parsed.is_some(),
        span: SpanIds {
            trace_id,
            span_id,
            parent_id: parsed.map(|p| p.parent_id),
            flags,
        },
    }
}

/// `00-<trace id>-<span id>-<flags>`, written in one buffer.
fn header(trace_id: &[u8; 16], span_id: &[u8; 8], flags: u8) -> String {
    let mut traceparent = String::with_capacity(55);
    traceparent.push_str("00-");
    push_hex(&mut traceparent, trace_id);
    traceparent.push('-');
    push_hex(&mut traceparent, span_id);
    traceparent.push('-');
    push_hex(&mut traceparent, &[flags]);
    traceparent
}

/// A random id that is never all zero.
fn new_id<const N: usize>(rng: &mut dyn Random) -> [u8; N] {
    let mut id = [0u8; N];
    loop {
        for chunk in id.chunks_mut(8) {
            let r = rng.next_u64().to_be_bytes();
            for (d, s) in chunk.iter_mut().zip(r) {
                *d = s;
            }
        }
        if id != [0; N] {
            return id;
        }
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// Appends the lowercase hex of `bytes`.
fn push_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        for n in [b >> 4, b & 0x0f] {
            out.push(char::from_digit(u32::from(n), 16).unwrap_or('0'));
        }
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_u8(pair: &[u8]) -> Option<u8> {
    match pair {
        [hi, lo] => Some(nibble(*hi)? << 4 | nibble(*lo)?),
        _ => None,
    }
}

fn hex_into(src: &[u8], dst: &mut [u8]) -> Option<()> {
    if src.len() != dst.len() * 2 {
        return None;
    }
    for (d, pair) in dst.iter_mut().zip(src.chunks(2)) {
        *d = hex_u8(pair)?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::SplitMix64;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_valid() {
        let p = TraceParent::parse(VALID).unwrap();
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.parent_id), "00f067aa0ba902b7");
        assert_eq!(p.flags, 1);
    }

    #[test]
    fn rejects_invalid() {
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01é",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn future_versions_read_by_known_fields() {
        let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future";
        assert!(TraceParent::parse(v).is_some());
        assert!(TraceParent::parse(&VALID.replacen("00", "01", 1)).is_some());
    }

    #[test]
    fn continues_a_valid_trace_with_a_new_span() {
        let mut rng = SplitMix64::new(7);
        let out = next(TraceParent::parse(VALID), &mut rng, true);
        assert!(out.continued);
        assert_eq!(out.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        let p = TraceParent::parse(&out.traceparent).unwrap();
        assert_eq!(hex(&p.trace_id), out.trace_id);
        assert_ne!(hex(&p.parent_id), "00f067aa0ba902b7");
        assert_eq!(p.flags, 1);
        let unsampled = VALID.replace("-01", "-00");
        assert!(next(TraceParent::parse(&unsampled), &mut rng, true)
            .traceparent
            .ends_with("-00"));
    }

    #[test]
    fn starts_a_new_trace_when_absent_or_invalid() {
        let mut rng = SplitMix64::new(9);
        let a = next(None, &mut rng, true);
        let b = next(TraceParent::parse("garbage"), &mut rng, true);
        for o in [&a, &b] {
            assert!(!o.continued);
            assert_eq!(o.trace_id.len(), 32);
            assert!(TraceParent::parse(&o.traceparent).is_some());
        }
        assert_ne!(a.trace_id, b.trace_id);
    }

    #[test]
    fn ids_are_never_zero() {
        struct Zeros(u32);
        impl Random for Zeros {
            fn next_u64(&mut self) -> u64 {
                self.0 += 1;
                if self.0 < 5 {
                    0
                } else {
                    u64::from(self.0)
                }
            }
        }
        let out = next(None, &mut Zeros(0), true);
        assert!(TraceParent::parse(&out.traceparent).is_some());
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;
    use crate::host::SplitMix64;

    fn valid() -> impl Strategy<Value = (u8, [u8; 16], [u8; 8], u8)> {
        (
            0u8..0xff,
            any::<[u8; 16]>().prop_filter("non-zero", |t| *t != [0; 16]),
            any::<[u8; 8]>().prop_filter("non-zero", |p| *p != [0; 8]),
            any::<u8>(),
        )
    }

    fn spell(version: u8, t: &[u8; 16], p: &[u8; 8], flags: u8) -> String {
        format!("{version:02x}-{}-{}-{flags:02x}", hex(t), hex(p))
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// A valid header reads back its fields, and the next hop continues
        /// its trace with a new span and the same flags.
        #[test]
        fn valid_headers_round_trip((version, t, p, flags) in valid(), seed: u64) {
            let raw = spell(version, &t, &p, flags);
            let parsed = TraceParent::parse(&raw);
            prop_assert_eq!(parsed, Some(TraceParent { trace_id: t, parent_id: p, flags }));
            let out = next(TraceParent::parse(&raw), &mut SplitMix64::new(seed), true);
            prop_assert!(out.continued);
            let again = TraceParent::parse(&out.traceparent).unwrap();
            prop_assert_eq!((again.trace_id, again.flags), (t, flags));
            prop_assert_eq!(out.traceparent.len(), 55);
        }

        /// One byte changed anywhere: read or refused, never a panic; what is
        /// sent upstream is always a valid version-00 header.
        #[test]
        fn damaged_headers_never_break_the_next_hop((version, t, p, flags) in valid(), at: usize, byte: u8, seed: u64) {
            let mut raw = spell(version, &t, &p, flags).into_bytes();
            let at = at % raw.len();
            raw[at] = byte;
            let raw = String::from_utf8_lossy(&raw);
            let _ = TraceParent::parse(&raw);
            let out = next(TraceParent::parse(&raw), &mut SplitMix64::new(seed), true);
            prop_assert!(TraceParent::parse(&out.traceparent).is_some());
            prop_assert!(out.traceparent.starts_with("00-"));
        }

        /// Any text at all: no panic, a valid header upstream.
        #[test]
        fn any_text_gives_a_valid_next_hop(raw in ".{0,80}", seed: u64) {
            let out = next(TraceParent::parse(&raw), &mut SplitMix64::new(seed), true);
            prop_assert!(TraceParent::parse(&out.traceparent).is_some());
        }
    }
}

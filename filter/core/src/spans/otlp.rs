//! The OTLP wire format of what the filter exports: an
//! `ExportTraceServiceRequest` (opentelemetry-proto `collector/trace/v1`) in
//! protobuf, written by hand — the few messages and fields below are all the
//! filter sends, so no code generator or runtime is needed. Field numbers are
//! the proto's; a collector decodes the bytes with the official definitions.

/// One attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// `string_value` (1).
    Str(&'a str),
    /// `bool_value` (2).
    Bool(bool),
    /// `int_value` (3).
    Int(i64),
    /// `double_value` (4).
    Double(f64),
    /// `array_value` (5) of strings.
    Strs(&'a [&'a str]),
}

/// Appends field `field` as a varint.
fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 0);
    varint(out, v);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// Appends field `field` as length-delimited bytes.
pub fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    tag(out, field, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn fixed64_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32_field(out: &mut Vec<u8>, field: u32, v: u32) {
    tag(out, field, 5);
    out.extend_from_slice(&v.to_le_bytes());
}

/// A `KeyValue` (key 1, `AnyValue` value 2).
pub fn key_value(key: &str, value: &Value<'_>) -> Vec<u8> {
    let mut any = Vec::with_capacity(16);
    match value {
        Value::Str(s) => bytes_field(&mut any, 1, s.as_bytes()),
        Value::Bool(b) => varint_field(&mut any, 2, u64::from(*b)),
        // int64 is two's complement in a varint.
        Value::Int(i) => varint_field(&mut any, 3, *i as u64),
        Value::Double(d) => fixed64_field(&mut any, 4, d.to_bits()),
        Value::Strs(items) => {
            // ArrayValue { repeated AnyValue values = 1 }.
            let mut array = Vec::new();
            for item in *items {
                let mut v = Vec::with_capacity(item.len() + 2);
                bytes_field(&mut v, 1, item.as_bytes());
                bytes_field(&mut array, 1, &v);
            }
            bytes_field(&mut any, 5, &array);
        }
    }
    let mut kv = Vec::with_capacity(key.len() + any.len() + 4);
    bytes_field(&mut kv, 1, key.as_bytes());
    bytes_field(&mut kv, 2, &any);
    kv
}

/// `Span.SpanKind` CLIENT.
pub const KIND_CLIENT: u64 = 3;
/// `Status.StatusCode` ERROR.
pub const STATUS_ERROR: u64 = 2;

/// What one `Span` message holds.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanFields<'a> {
    /// `trace_id` (1).
    pub trace_id: [u8; 16],
    /// `span_id` (2).
    pub span_id: [u8; 8],
    /// `parent_span_id` (4); none for a root.
    pub parent_span_id: Option<[u8; 8]>,
    /// `name` (5).
    pub name: &'a str,
    /// `start_time_unix_nano` (7).
    pub start_ns: u64,
    /// `end_time_unix_nano` (8).
    pub end_ns: u64,
    /// `attributes` (9).
    pub attributes: &'a [(&'a str, Value<'a>)],
    /// `status` (15): `Some(message)` for ERROR, none for UNSET.
    pub error: Option<&'a str>,
    /// `flags` (16): the W3C trace flags.
    pub flags: u8,
}

/// The bytes of one `Span` message (without its own tag and length).
pub fn span(s: &SpanFields<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + s.attributes.len() * 32);
    bytes_field(&mut out, 1, &s.trace_id);
    bytes_field(&mut out, 2, &s.span_id);
    if let Some(p) = &s.parent_span_id {
        bytes_field(&mut out, 4, p);
    }
    bytes_field(&mut out, 5, s.name.as_bytes());
    varint_field(&mut out, 6, KIND_CLIENT);
    fixed64_field(&mut out, 7, s.start_ns);
    fixed64_field(&mut out, 8, s.end_ns);
    for (k, v) in s.attributes {
        bytes_field(&mut out, 9, &key_value(k, v));
    }
    if let Some(message) = s.error {
        let mut status = Vec::with_capacity(message.len() + 4);
        bytes_field(&mut status, 2, message.as_bytes());
        varint_field(&mut status, 3, STATUS_ERROR);
        bytes_field(&mut out, 15, &status);
    }
    // The low byte: the W3C flags; bit 8 says whether the parent is remote.
    let remote = if s.parent_span_id.is_some() {
        0x300
    } else {
        0x100
    };
    fixed32_field(&mut out, 16, u32::from(s.flags) | remote);
    out
}

/// An `ExportTraceServiceRequest` of `spans` (each the bytes [`span`]
/// wrote), from one resource of `resource` attributes and one scope.
pub fn export_request<'a>(
    resource: &[(&str, Value<'_>)],
    scope: (&str, &str),
    spans: impl Iterator<Item = &'a [u8]>,
) -> Vec<u8> {
    let mut res = Vec::new();
    for (k, v) in resource {
        bytes_field(&mut res, 1, &key_value(k, v));
    }
    let mut scope_msg = Vec::new();
    bytes_field(&mut scope_msg, 1, scope.0.as_bytes());
    bytes_field(&mut scope_msg, 2, scope.1.as_bytes());
    let mut scope_spans = Vec::new();
    bytes_field(&mut scope_spans, 1, &scope_msg);
    for s in spans {
        bytes_field(&mut scope_spans, 2, s);
    }
    let mut resource_spans = Vec::with_capacity(res.len() + scope_spans.len() + 16);
    bytes_field(&mut resource_spans, 1, &res);
    bytes_field(&mut resource_spans, 2, &scope_spans);
    let mut out = Vec::with_capacity(resource_spans.len() + 8);
    bytes_field(&mut out, 1, &resource_spans);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_are_protobufs() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        // KeyValue{key:"a", value:{int_value:-1}}: a negative int64 takes ten bytes.
        let kv = key_value("a", &Value::Int(-1));
        assert_eq!(kv[..3], [0x0a, 0x01, b'a']);
        assert_eq!(kv[3..6], [0x12, 11, 0x18]);
        assert_eq!(kv.len(), 3 + 2 + 1 + 10);
        let kv = key_value("b", &Value::Str("xy"));
        assert_eq!(kv, [0x0a, 1, b'b', 0x12, 4, 0x0a, 2, b'x', b'y']);
    }

    #[test]
    fn a_span_starts_with_its_ids() {
        let s = span(&SpanFields {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: None,
            name: "chat m",
            start_ns: 1,
            end_ns: 2,
            attributes: &[("k", Value::Bool(true))],
            error: Some("500"),
            flags: 1,
        });
        assert_eq!(s[..2], [0x0a, 16]);
        assert_eq!(s[18..20], [0x12, 8]);
        // No parent: `name` follows the span id.
        assert_eq!(s[28..30], [0x2a, 6]);
        assert_eq!(s[s.len() - 6..], [0x85, 0x01, 0x01, 0x01, 0, 0]);
    }
}

//! The proxy-wasm ABI's status codes (`proxy_status_t`), read as plain
//! numbers: the SDK's enum lacks most of them.

/// The call succeeded.
pub const OK: u32 = 0;
/// Nothing under that name (key, header, buffer, property, metric).
pub const NOT_FOUND: u32 = 1;
/// An argument the host refuses (e.g. an unknown callout cluster).
pub const BAD_ARGUMENT: u32 = 2;
/// A value the host cannot serialize.
pub const SERIALIZATION_FAILURE: u32 = 3;
/// Shared data changed since the read whose CAS token was given.
pub const CAS_MISMATCH: u32 = 8;
/// The host failed.
pub const INTERNAL_FAILURE: u32 = 10;
/// Not a host status: the host answered `OK` with bytes that do not
/// parse (a header map whose lengths run past its end).
pub const MALFORMED: u32 = u32::MAX;

/// A failed host call: the status the host returned.
pub type Status = u32;

//! What the scenarios share (a cache rig, two routed backends, the official
//! SDKs' scripts), and the scenarios that prove the harness itself, which the
//! others build on.

pub mod alerts;
pub mod cache;
mod harness;
pub mod otlp;
pub mod sdk;
pub mod two_backends;

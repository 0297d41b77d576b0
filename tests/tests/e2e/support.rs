//! What the scenarios share (a cache rig, two routed backends, the official
//! SDKs' scripts, the mesh's secret files and the search for leaked ones),
//! and the scenarios that prove the harness itself, which the others build
//! on.

pub mod alerts;
pub mod cache;
mod harness;
pub mod load;
pub mod otlp;
pub mod sdk;
pub mod secrets;
pub mod two_backends;

//! The mesh-wide load Prometheus reported, kept in shared data so every
//! worker reads it: one reading per signal, each model's value and when it
//! was read. A reading older than `stale_after_s` is not used, so when
//! Prometheus stops answering the local window takes over again.

use serde::{Deserialize, Serialize};

use super::config::PrometheusSource;
use crate::host::cas::{self, Change, Unguarded};
use crate::host::codec;
use crate::host::{SharedStore, StoreError};
use crate::load::{Signal, Signals};
use crate::stat_name;

/// The shared-data key of the readings.
pub const KEY: &str = crate::keyspace::MESH.key;

/// One signal's reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Stored {
    signal: Signal,
    at_ms: u64,
    /// Model label → value, as [`super::prometheus::parse`] bounds them.
    values: Vec<(String, f64)>,
}

fn decode(bytes: Option<&[u8]>) -> Vec<Stored> {
    bytes
        .and_then(codec::decode::<Vec<Stored>>)
        .unwrap_or_default()
}

/// Keeps the reading of `signal` taken at `now_ms`, in place of the last one.
pub fn record(
    store: &dyn SharedStore,
    signal: Signal,
    values: Vec<(String, f64)>,
    now_ms: u64,
) -> Result<(), StoreError> {
    cas::update(
        store,
        KEY,
        Unguarded::Verify,
        decode,
        codec::encode,
        |readings: &mut Vec<Stored>| {
            readings.retain(|r| r.signal != signal);
            readings.push(Stored {
                signal,
                at_ms: now_ms,
                values: values.clone(),
            });
            Change::Write(())
        },
    )
    .map(|_| ())
}

/// The signals of `model` at `now_ms`: for each signal `source` reads and
/// has a fresh reading of, the mesh-wide value, or the local one when that is
/// higher (Prometheus lags a scrape and a rate window behind a burst this
/// proxy already sees; a model it has no sample of has no mesh-wide load);
/// the local value for the others.
pub fn signals(
    store: &dyn SharedStore,
    source: &PrometheusSource,
    model: &str,
    local: Signals,
    now_ms: u64,
) -> Signals {
    let bytes = store.get(KEY).ok().and_then(|v| v.value);
    let readings = decode(bytes.as_deref());
    let label = stat_name::label_value(model);
    let mut out = local;
    for r in &readings {
        let fresh = r.at_ms <= now_ms && now_ms - r.at_ms <= source.stale_after_ms;
        if !fresh || !source.queries.iter().any(|(s, _)| *s == r.signal) {
            continue;
        }
        let mesh = r
            .values
            .iter()
            .find(|(m, _)| *m == label)
            .map_or(0.0, |(_, v)| *v);
        match r.signal {
            Signal::Rps => out.rps = out.rps.max(mesh),
            Signal::TokensPerS => out.tokens_per_s = out.tokens_per_s.max(mesh),
            Signal::InFlight => {
                // In range: a reading's values are at most 1e9.
                let mesh = mesh.round().clamp(0.0, f64::from(u32::MAX)) as u32;
                out.in_flight = out.in_flight.max(mesh);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MemoryStore;

    fn source(json: &str) -> PrometheusSource {
        PrometheusSource::compile(crate::config::read::parse(json.as_bytes()).unwrap()).unwrap()
    }

    fn local(rps: f64, in_flight: u32) -> Signals {
        Signals {
            rps,
            tokens_per_s: 0.0,
            in_flight,
        }
    }

    #[test]
    fn a_fresh_reading_raises_the_local_signals() {
        let (store, src) = (MemoryStore::new(), source(r#"{"cluster":"p"}"#));
        record(&store, Signal::Rps, vec![("gpt-4o".into(), 12.5)], 1_000).unwrap();
        record(
            &store,
            Signal::InFlight,
            vec![("gpt-4o".into(), 7.4)],
            1_000,
        )
        .unwrap();
        let s = signals(&store, &src, "gpt-4o", local(1.0, 2), 2_000);
        assert_eq!((s.rps, s.in_flight), (12.5, 7));
        // The local burst Prometheus has not seen yet wins.
        let s = signals(&store, &src, "gpt-4o", local(20.0, 9), 2_000);
        assert_eq!((s.rps, s.in_flight), (20.0, 9));
        // A model without a sample: no mesh-wide load, the local stands.
        let s = signals(&store, &src, "llama", local(1.0, 0), 2_000);
        assert_eq!(s, local(1.0, 0));
        // A second reading replaces the first.
        record(&store, Signal::Rps, vec![("gpt-4o".into(), 3.0)], 5_000).unwrap();
        assert_eq!(
            signals(&store, &src, "gpt-4o", local(0.0, 0), 5_000).rps,
            3.0
        );
    }

    #[test]
    fn a_stale_or_unasked_reading_is_not_used() {
        let store = MemoryStore::new();
        let src = source(
            r#"{"cluster":"p","interval_s":5,"stale_after_s":10,"queries":{"in_flight":""}}"#,
        );
        record(&store, Signal::Rps, vec![("m".into(), 50.0)], 0).unwrap();
        record(&store, Signal::InFlight, vec![("m".into(), 50.0)], 0).unwrap();
        let s = signals(&store, &src, "m", local(0.0, 0), 10_000);
        assert_eq!((s.rps, s.in_flight), (50.0, 0), "in_flight is not asked");
        assert_eq!(signals(&store, &src, "m", local(0.0, 0), 10_001).rps, 0.0);
        // A reading from the future (a clock that went back) is not used.
        record(&store, Signal::Rps, vec![("m".into(), 50.0)], 20_000).unwrap();
        assert_eq!(signals(&store, &src, "m", local(0.0, 0), 19_000).rps, 0.0);
        // A corrupt record is no reading.
        store.set(KEY, b"\xff\xff", None).unwrap();
        assert_eq!(
            signals(&store, &src, "m", local(1.0, 1), 20_000),
            local(1.0, 1)
        );
    }
}

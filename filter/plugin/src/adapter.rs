//! The host adapter: Envoy's shared data, clock, randomness and stats behind
//! the core's traits, through the checked calls of [`crate::hostcall`].

use hashbrown::{Equivalent, HashMap};
use llm_filter_core::host::{Metrics, SharedStore, StoreError, Versioned};
use llm_filter_core::metrics::name;
use proxy_wasm::types::{MapType, MetricType};

use crate::hostcall::{self, status::CAS_MISMATCH, HeaderMap};

/// Milliseconds since the epoch by Envoy's clock (0 if the host cannot tell).
pub fn now_ms() -> u64 {
    hostcall::current_time_ns().map_or(0, |ns| ns / 1_000_000)
}

/// 64 bits from the host's entropy (WASI `random_get`), to seed a generator.
pub fn entropy() -> u64 {
    let mut buf = [0u8; 8];
    match getrandom::getrandom(&mut buf) {
        Ok(()) => u64::from_le_bytes(buf),
        // Still distinct per VM and start: better than a constant.
        Err(_) => now_ms() ^ 0x9E37_79B9_7F4A_7C15,
    }
}

/// One header as text; header values that are not UTF-8 are read lossily
/// (the SDK's string getter would panic on them).
pub fn header(map: MapType, name: &str) -> Option<String> {
    match hostcall::get_map_value(map, name) {
        Ok(Some(v)) => Some(text(&v)),
        _ => None,
    }
}

/// Every header of a map, in order, values read lossily.
pub fn headers(map: MapType) -> Vec<(String, String)> {
    Headers::read(map).pairs()
}

/// Bytes from the host as text, lossily (the SDK's string getters would
/// panic on bytes that are not UTF-8).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A header map read once from the host, and the edits made to it since:
/// lookups read the host's buffer in place (text is made only of the values
/// asked for), edits shadow what the host said.
#[derive(Debug, Default, Clone)]
pub struct Headers {
    read: HeaderMap,
    /// Names set (`Some`) or removed (`None`) since the read, newest last.
    edits: Vec<(String, Option<String>)>,
}

impl Headers {
    /// Reads `map` from the host (empty if the host cannot tell).
    pub fn read(map: MapType) -> Self {
        Self {
            read: hostcall::get_map(map).unwrap_or_default(),
            edits: Vec::new(),
        }
    }

    /// The edit of `name`, if it was set or removed since the read.
    fn edit(&self, name: &str) -> Option<Option<&str>> {
        self.edits
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_deref())
    }

    fn read_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.read
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The first value of `name`, lossily.
    pub fn first(&self, name: &str) -> Option<String> {
        match self.edit(name) {
            Some(edited) => edited.map(str::to_string),
            None => self.read_values(name).next().map(text),
        }
    }

    /// Every value of `name`, in order, lossily.
    pub fn all(&self, name: &str) -> Vec<String> {
        match self.edit(name) {
            Some(edited) => edited.map(str::to_string).into_iter().collect(),
            None => self.read_values(name).map(text).collect(),
        }
    }

    /// Whether `name` is present.
    pub fn has(&self, name: &str) -> bool {
        match self.edit(name) {
            Some(edited) => edited.is_some(),
            None => self.read_values(name).next().is_some(),
        }
    }

    /// Records that `name` was set to `value` (every value replaced) or removed.
    pub fn record(&mut self, name: &str, value: Option<&str>) {
        self.edits.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self.edits
            .push((name.to_string(), value.map(str::to_string)));
    }

    /// Every header as it stands, in order: the read ones not edited since,
    /// then the ones set.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let kept = self.read.iter().filter_map(|(k, v)| {
            let name = text(k);
            self.edit(&name).is_none().then(|| (name, text(v)))
        });
        let set = self
            .edits
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)));
        kept.chain(set).collect()
    }
}

/// Sets (or with `None` removes) a header; reports whether the host accepted it.
pub fn set_header(map: MapType, name: &str, value: Option<&str>) -> bool {
    hostcall::set_map_value(map, name, value).is_ok()
}

/// Envoy shared data.
#[derive(Debug, Default, Clone, Copy)]
pub struct EnvoyStore;

impl SharedStore for EnvoyStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        match hostcall::get_shared_data(key) {
            Ok((value, cas)) => Ok(Versioned { value, cas }),
            Err(_) => Err(StoreError::Host),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcall::set_shared_data(key, value, cas) {
            Ok(()) => Ok(()),
            Err(CAS_MISMATCH) => Err(StoreError::CasMismatch),
            Err(_) => Err(StoreError::Host),
        }
    }
}

/// Envoy stats, defined on first use and remembered by name (a fast hash:
/// the names are the filter's own, looked up several times per call), and
/// the ones recorded on every call by their label set too, so their names
/// are not built again.
#[derive(Debug, Default)]
pub struct EnvoyMetrics {
    ids: HashMap<String, Option<u32>>,
    labelled: HashMap<LabelSet, Option<u32>>,
}

/// Label sets remembered at most; past them a stat's name is built per use.
/// Label values are bounded already (models by the configured bound,
/// clusters by the configuration, the rest are the filter's own words).
const MAX_LABEL_SETS: usize = 4096;

/// A stat by its metric and labels, as remembered.
#[derive(Debug, PartialEq, Eq, Hash)]
struct LabelSet {
    metric: &'static str,
    labels: Vec<(&'static str, String)>,
}

/// A stat by its metric and labels, as asked for: hashes as the
/// [`LabelSet`] it equals (a slice and a `Vec` of pairs of strings hash
/// alike), so a lookup builds nothing.
#[derive(Hash)]
struct LabelSetRef<'a> {
    metric: &'static str,
    labels: &'a [(&'static str, &'a str)],
}

impl Equivalent<LabelSet> for LabelSetRef<'_> {
    fn equivalent(&self, key: &LabelSet) -> bool {
        self.metric == key.metric
            && self.labels.len() == key.labels.len()
            && self
                .labels
                .iter()
                .zip(&key.labels)
                .all(|((l, v), (kl, kv))| l == kl && v == kv)
    }
}

impl EnvoyMetrics {
    /// The stat of `metric` with `labels`, defined on first use.
    fn labelled_id(
        &mut self,
        kind: MetricType,
        metric: &'static str,
        labels: &[(&'static str, &str)],
    ) -> Option<u32> {
        let asked = LabelSetRef { metric, labels };
        if let Some(id) = self.labelled.get(&asked) {
            return *id;
        }
        let id = self.id(kind, &name(metric, labels));
        if self.labelled.len() < MAX_LABEL_SETS {
            let labels = labels.iter().map(|(l, v)| (*l, (*v).to_string())).collect();
            self.labelled.insert(LabelSet { metric, labels }, id);
        }
        id
    }

    fn id(&mut self, kind: MetricType, name: &str) -> Option<u32> {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = hostcall::define_metric(kind, name).ok();
        if id.is_none() {
            log::warn!("cannot define metric {name}");
        }
        self.ids.insert(name.to_string(), id);
        id
    }
}

impl Metrics for EnvoyMetrics {
    fn counter(&mut self, name: &str, delta: u64) {
        add(self.id(MetricType::Counter, name), delta);
    }

    fn gauge(&mut self, name: &str, value: i64) {
        set(self.id(MetricType::Gauge, name), value);
    }

    fn gauge_add(&mut self, name: &str, delta: i64) {
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcall::increment_metric(id, delta);
        }
    }

    fn histogram(&mut self, name: &str, value: u64) {
        sample(self.id(MetricType::Histogram, name), value);
    }

    fn counter_with(&mut self, metric: &'static str, labels: &[(&'static str, &str)], delta: u64) {
        add(self.labelled_id(MetricType::Counter, metric, labels), delta);
    }

    fn gauge_with(&mut self, metric: &'static str, labels: &[(&'static str, &str)], value: i64) {
        set(self.labelled_id(MetricType::Gauge, metric, labels), value);
    }

    fn histogram_with(
        &mut self,
        metric: &'static str,
        labels: &[(&'static str, &str)],
        value: u64,
    ) {
        sample(
            self.labelled_id(MetricType::Histogram, metric, labels),
            value,
        );
    }
}

/// Adds to a counter (a stat that could not be defined is skipped).
fn add(id: Option<u32>, delta: u64) {
    if let Some(id) = id {
        let _ = hostcall::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
    }
}

/// Sets a gauge; Envoy's gauges hold no negative value.
fn set(id: Option<u32>, value: i64) {
    if let Some(id) = id {
        let _ = hostcall::record_metric(id, u64::try_from(value).unwrap_or(0));
    }
}

/// Records a histogram sample.
fn sample(id: Option<u32>, value: u64) {
    if let Some(id) = id {
        let _ = hostcall::record_metric(id, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostcall::serialize_map;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        Headers {
            read: HeaderMap::parse(serialize_map(pairs).unwrap()).unwrap(),
            edits: Vec::new(),
        }
    }

    #[test]
    fn a_label_set_is_found_as_asked_for() {
        use std::hash::BuildHasher;
        let mut m = EnvoyMetrics::default();
        let labels = [("model", "gpt-4o"), ("outcome", "success")];
        m.labelled_id(MetricType::Counter, "requests", &labels);
        m.labelled_id(MetricType::Counter, "requests", &labels);
        m.labelled_id(MetricType::Counter, "requests", &[("model", "gpt-4o")]);
        m.labelled_id(MetricType::Counter, "other", &labels);
        assert_eq!(m.labelled.len(), 3);
        let asked = LabelSetRef {
            metric: "requests",
            labels: &labels,
        };
        let kept = LabelSet {
            metric: "requests",
            labels: labels.iter().map(|(l, v)| (*l, v.to_string())).collect(),
        };
        let hasher = m.labelled.hasher();
        assert_eq!(hasher.hash_one(&asked), hasher.hash_one(&kept));
        assert!(asked.equivalent(&kept));
        assert!(m.labelled.contains_key(&asked));
        // Distinct by value, not only by shape.
        let other = [("model", "gpt-4o"), ("outcome", "reset")];
        assert!(!m.labelled.contains_key(&LabelSetRef {
            metric: "requests",
            labels: &other,
        }));
    }

    #[test]
    fn edits_shadow_what_the_host_said() {
        let mut h = headers(&[(":path", "/v1"), ("baggage", "a=1"), ("baggage", "b=2")]);
        assert_eq!(h.first(":path").as_deref(), Some("/v1"));
        assert_eq!(h.all("Baggage"), ["a=1", "b=2"]);
        assert!(!h.has("tracestate"));

        h.record("baggage", Some("a=1,b=2,c=3"));
        h.record("x-new", Some("v"));
        h.record(":path", None);
        assert_eq!(h.all("baggage"), ["a=1,b=2,c=3"]);
        assert_eq!(h.first(":path"), None);
        assert!(!h.has(":path"));
        assert!(h.has("x-new"));
        assert_eq!(
            h.pairs(),
            [
                ("baggage".to_string(), "a=1,b=2,c=3".to_string()),
                ("x-new".to_string(), "v".to_string()),
            ]
        );
        h.record("x-new", Some("w"));
        assert_eq!(h.all("x-new"), ["w"], "a set replaces every value");
    }

    #[test]
    fn values_that_are_not_utf8_are_read_lossily() {
        let mut bytes = serialize_map(&[("k", "ab")]).unwrap();
        let at = bytes.len() - 3;
        bytes[at] = 0xff;
        let h = Headers {
            read: HeaderMap::parse(bytes).unwrap(),
            edits: Vec::new(),
        };
        assert_eq!(h.first("k").as_deref(), Some("\u{fffd}b"));
        assert_eq!(h.pairs()[0].1, "\u{fffd}b");
    }
}

//! The filter's own footprint in shared data, counted. Shared data never
//! evicts, so every key family is bounded by configuration; this counts the
//! keys and bytes of a [`Plan`] at a low rate, a few keys per timer tick, for
//! the `llm_filter_shared_data_keys` and `llm_filter_shared_data_bytes`
//! gauges. What the plan holds (which families, which keys, who counts the
//! ones not read) is the key registry's (`crate::keyspace`), and what the
//! owners count from is the caller's `C` (the configuration): the host layer
//! knows no family.

use super::SharedStore;

/// Keys read per [`Census::step`]: one timer tick's share of the work.
pub const KEYS_PER_STEP: u32 = 64;
/// Least time between the starts of two counts.
pub const INTERVAL_MS: u64 = 10_000;

/// Keys and bytes counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Keys present.
    pub keys: u64,
    /// Bytes of their values (keys themselves not included).
    pub bytes: u64,
}

impl Footprint {
    /// The sum of two counts.
    pub fn plus(self, other: Footprint) -> Footprint {
        Footprint {
            keys: self.keys.saturating_add(other.keys),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }
}

/// Keys a census reads one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// One key.
    Key(String),
    /// `count` keys, `prefix` followed by `0..count`.
    Slots {
        /// What every key starts with.
        prefix: String,
        /// How many.
        count: u32,
    },
}

impl Read {
    fn len(&self) -> u32 {
        match self {
            Read::Key(_) => 1,
            Read::Slots { count, .. } => *count,
        }
    }
}

/// A family its owner counts from what it keeps (its totals, its index),
/// because its values are too many or too large to read every count; `None`
/// when `C` has the family off.
pub type Owner<C> = fn(&dyn SharedStore, &C) -> Option<Footprint>;

/// What a census counts: the keys it reads, then what the owners of the
/// other families count, at the end of each count.
#[derive(Debug, Clone)]
pub struct Plan<C> {
    /// Read one by one, in order.
    pub reads: Vec<Read>,
    /// Counted by their owners.
    pub owners: Vec<Owner<C>>,
}

impl<C> Default for Plan<C> {
    fn default() -> Self {
        Self {
            reads: Vec::new(),
            owners: Vec::new(),
        }
    }
}

impl<C> Plan<C> {
    /// Keys read in one count.
    pub fn len(&self) -> u32 {
        self.reads
            .iter()
            .fold(0u32, |n, r| n.saturating_add(r.len()))
    }

    /// True when no key is read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th key read.
    fn key(&self, mut i: u32) -> Option<String> {
        for r in &self.reads {
            let n = r.len();
            if i < n {
                return Some(match r {
                    Read::Key(k) => k.clone(),
                    Read::Slots { prefix, .. } => format!("{prefix}{i}"),
                });
            }
            i -= n;
        }
        None
    }
}

/// A count in progress, a few keys at a time.
#[derive(Debug, Clone)]
pub struct Census<C> {
    plan: Plan<C>,
    /// [`Plan::len`], once.
    len: u32,
    next: u32,
    counted: Footprint,
    started_ms: Option<u64>,
}

impl<C> Default for Census<C> {
    fn default() -> Self {
        Self::new(Plan::default())
    }
}

impl<C> Census<C> {
    /// A census of `plan`.
    pub fn new(plan: Plan<C>) -> Self {
        Self {
            len: plan.len(),
            plan,
            next: 0,
            counted: Footprint::default(),
            started_ms: None,
        }
    }

    /// Reads up to `budget` keys; returns the footprint when a count ends,
    /// the owners counting from `owned`. A new count starts [`INTERVAL_MS`]
    /// after the last one started.
    pub fn step(
        &mut self,
        store: &dyn SharedStore,
        owned: &C,
        now_ms: u64,
        budget: u32,
    ) -> Option<Footprint> {
        match self.started_ms {
            Some(at) if self.next == 0 && now_ms.saturating_sub(at) < INTERVAL_MS => return None,
            Some(_) if self.next > 0 => {}
            _ => {
                self.started_ms = Some(now_ms);
                self.counted = Footprint::default();
            }
        }
        let end = self.next.saturating_add(budget).min(self.len);
        for i in self.next..end {
            let value = self
                .plan
                .key(i)
                .and_then(|k| store.get(&k).ok())
                .and_then(|v| v.value);
            if let Some(v) = value {
                self.counted = self.counted.plus(Footprint {
                    keys: 1,
                    bytes: v.len() as u64,
                });
            }
        }
        self.next = end;
        if end < self.len {
            return None;
        }
        self.next = 0;
        Some(self.plan.owners.iter().fold(self.counted, |f, owner| {
            f.plus(owner(store, owned).unwrap_or_default())
        }))
    }
}

#[cfg(test)]
mod tests;

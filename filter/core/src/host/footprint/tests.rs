use super::*;
use crate::host::MemoryStore;

/// What the owners count from, here: the keys and bytes the one owner says.
type Owned = Footprint;

fn plan() -> Plan<Owned> {
    Plan {
        reads: vec![
            Read::Key("one".into()),
            Read::Slots {
                prefix: "slot.".into(),
                count: 6,
            },
            Read::Key("two".into()),
        ],
        owners: vec![|_: &dyn SharedStore, owned: &Owned| Some(*owned)],
    }
}

const OWNED: Owned = Footprint {
    keys: 10,
    bytes: 100,
};

fn store() -> MemoryStore {
    let s = MemoryStore::new();
    for (k, v) in [
        ("one", &b"1"[..]),
        ("slot.0", b"22"),
        ("slot.5", b"333"),
        ("two", b"4444"),
        ("slot.6", b"not in the plan"),
        ("other", b"nor this"),
    ] {
        s.set(k, v, None).unwrap();
    }
    s
}

#[test]
fn a_count_reads_the_plan_and_adds_the_owners() {
    let (plan, s) = (plan(), store());
    assert_eq!(plan.len(), 8);
    let mut census = Census::new(plan);
    let f = (0..10).find_map(|_| census.step(&s, &OWNED, 0, 3)).unwrap();
    assert_eq!(
        f,
        Footprint {
            keys: 4 + 10,
            bytes: 1 + 2 + 3 + 4 + 100
        }
    );
    assert_eq!(s.reads("slot.5"), 1);
    assert_eq!(s.reads("slot.6"), 0);
    assert_eq!(s.reads("other"), 0);
}

#[test]
fn counts_are_spread_over_steps_and_spaced_out() {
    let s = store();
    let mut census = Census::new(plan());
    // 8 keys at 3 a step: the count ends on the third.
    assert_eq!(census.step(&s, &OWNED, 0, 3), None);
    assert_eq!(census.step(&s, &OWNED, 0, 3), None);
    let f = census.step(&s, &OWNED, 0, 3).unwrap();
    assert_eq!(census.step(&s, &OWNED, INTERVAL_MS - 1, 100), None);
    assert_eq!(census.step(&s, &OWNED, INTERVAL_MS, 100), Some(f));
}

#[test]
fn an_empty_plan_counts_nothing_and_saturates() {
    let s = store();
    let mut empty = Census::new(Plan::<Owned>::default());
    assert!(Plan::<Owned>::default().is_empty());
    assert_eq!(empty.step(&s, &OWNED, 0, 1), Some(Footprint::default()));
    let huge = Plan::<Owned> {
        reads: vec![
            Read::Slots {
                prefix: "a.".into(),
                count: u32::MAX,
            },
            Read::Key("b".into()),
        ],
        owners: Vec::new(),
    };
    assert_eq!(huge.len(), u32::MAX);
    let most = Footprint {
        keys: u64::MAX,
        bytes: u64::MAX,
    };
    assert_eq!(most.plus(most), most);
}

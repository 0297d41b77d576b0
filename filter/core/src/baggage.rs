//! W3C Baggage: the filter adds its own member (the call's priority) so every
//! later hop can see it, and must keep every other member as the caller sent it
//! while never forwarding a header beyond the spec's limits.

/// The W3C Baggage header.
pub const HEADER: &str = "baggage";
/// Most list-members a baggage header may carry (W3C Baggage).
pub const MAX_MEMBERS: usize = 64;
/// Most bytes a baggage header may carry (W3C Baggage).
pub const MAX_BYTES: usize = 8192;

/// Returns `existing` with `key=value` set: any member with that key is
/// replaced, other members are kept byte-for-byte in order, empty members are
/// dropped, and whole members are left out (never cut) where keeping them
/// would break the member or byte limit. The merged member is always kept.
pub fn merge(existing: Option<&str>, key: &str, value: &str) -> String {
    let ours_len = key.len() + 1 + value.len();
    let mut out = String::with_capacity(existing.map_or(0, str::len) + ours_len + 1);
    let mut members = 1usize;
    let mut bytes = ours_len;
    for member in existing.unwrap_or_default().split(',') {
        let member = member.trim_matches(|c| c == ' ' || c == '\t');
        if member.is_empty() || member_key(member) == key {
            continue;
        }
        let grown = bytes.saturating_add(member.len()).saturating_add(1);
        if members >= MAX_MEMBERS || grown > MAX_BYTES {
            continue;
        }
        members += 1;
        bytes = grown;
        out.push_str(member);
        out.push(',');
    }
    out.push_str(key);
    out.push('=');
    out.push_str(value);
    out
}

/// The value of the first list-member with `key` (its properties after `;`
/// left out, spaces trimmed); `None` when no member has that key.
pub fn member<'a>(baggage: &'a str, key: &str) -> Option<&'a str> {
    baggage
        .split(',')
        .map(|m| m.trim_matches(|c| c == ' ' || c == '\t'))
        .find(|m| member_key(m) == key && m.contains('='))
        .and_then(|m| m.split_once('='))
        .map(|(_, value)| value.split(';').next().unwrap_or(value).trim())
}

/// The key of a list-member: up to the first `=` or `;`, spaces trimmed.
fn member_key(member: &str) -> &str {
    let end = member.find(['=', ';']).unwrap_or(member.len());
    member.get(..end).unwrap_or(member).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_to_empty_and_absent() {
        assert_eq!(merge(None, "priority", "P1"), "priority=P1");
        assert_eq!(merge(Some(""), "priority", "P1"), "priority=P1");
        assert_eq!(merge(Some(" , ,"), "priority", "P0"), "priority=P0");
    }

    #[test]
    fn replaces_existing_and_keeps_others_verbatim() {
        assert_eq!(
            merge(
                Some("userId=alice,priority=P2;prop=1, serverNode=DF%2028;x , isProduction=false"),
                "priority",
                "P0"
            ),
            "userId=alice,serverNode=DF%2028;x,isProduction=false,priority=P0"
        );
        assert_eq!(
            merge(Some("priority = P2,priorityx=1"), "priority", "P1"),
            "priorityx=1,priority=P1"
        );
        // Keys are case-sensitive.
        assert_eq!(
            merge(Some("Priority=P2"), "priority", "P1"),
            "Priority=P2,priority=P1"
        );
    }

    #[test]
    fn reads_a_members_value_without_its_properties() {
        let b = "userId=alice, priority = P0;src=edge ,priority=P2";
        assert_eq!(member(b, "priority"), Some("P0"));
        assert_eq!(member(b, "userId"), Some("alice"));
        assert_eq!(member(b, "Priority"), None);
        assert_eq!(member("priorityx=P0", "priority"), None);
        assert_eq!(member("priority", "priority"), None);
        assert_eq!(member("", "priority"), None);
    }

    #[test]
    fn never_more_than_64_members() {
        let many: Vec<String> = (0..100).map(|i| format!("k{i}=v{i}")).collect();
        let merged = merge(Some(&many.join(",")), "priority", "P1");
        let members: Vec<&str> = merged.split(',').collect();
        assert_eq!(members.len(), MAX_MEMBERS);
        assert_eq!(members[0], "k0=v0");
        assert_eq!(members[62], "k62=v62");
        assert_eq!(*members.last().unwrap(), "priority=P1");
    }

    #[test]
    fn never_more_than_8192_bytes_and_never_cuts_a_member() {
        let big = format!("big={}", "x".repeat(5000));
        let second = format!("second={}", "y".repeat(4000));
        let input = format!("{big},{second},small=1");
        let merged = merge(Some(&input), "priority", "P2");
        assert!(merged.len() <= MAX_BYTES);
        assert_eq!(merged, format!("{big},small=1,priority=P2"));
        // A single oversized member is dropped whole.
        let huge = format!("huge={}", "z".repeat(9000));
        assert_eq!(merge(Some(&huge), "priority", "P2"), "priority=P2");
    }

    #[test]
    fn exactly_at_the_byte_limit_is_kept() {
        // member + ',' + "priority=P1" == 8192 bytes
        let fill = MAX_BYTES - "priority=P1".len() - 1 - "a=".len();
        let member = format!("a={}", "v".repeat(fill));
        let merged = merge(Some(&member), "priority", "P1");
        assert_eq!(merged.len(), MAX_BYTES);
        let over = format!("a={}", "v".repeat(fill + 1));
        assert_eq!(merge(Some(&over), "priority", "P1"), "priority=P1");
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzz;

    fn member() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => ("[a-zA-Z0-9_]{1,8}", "[a-zA-Z0-9%]{0,12}", prop::option::of("[a-z=;]{0,6}"))
                .prop_map(|(k, v, p)| match p {
                    Some(p) => format!("{k}={v};{p}"),
                    None => format!("{k}={v}"),
                }),
            1 => Just("priority=P2".to_string()),
            1 => (" ?priority ?= ?", "[A-Z0-9]{0,3}").prop_map(|(k, v)| format!("{k}{v}")),
            1 => (1usize..9_000).prop_map(|n| format!("big={}", "v".repeat(n))),
            1 => Just(String::new()),
            1 => fuzz::text(),
        ]
    }

    fn trimmed(m: &str) -> &str {
        m.trim_matches(|c| c == ' ' || c == '\t')
    }

    proptest! {
        #![proptest_config(fuzz::config(256))]

        /// The merged header is within the W3C limits, ends with our member,
        /// carries our key once, and keeps other members verbatim, in order,
        /// dropping only whole members.
        #[test]
        fn merged_baggage_keeps_limits_and_our_member(
            members in prop::collection::vec(member(), 0..120),
            sep in prop::sample::select(vec![",", ", ", " ,\t"]),
            value in prop::sample::select(vec!["P0", "P1", "P2"]),
        ) {
            let existing = members.join(sep);
            let merged = merge(Some(&existing), "priority", value);
            prop_assert!(merged.len() <= MAX_BYTES);
            let out: Vec<&str> = merged.split(',').collect();
            prop_assert!(out.len() <= MAX_MEMBERS);
            let ours = format!("priority={value}");
            prop_assert_eq!(*out.last().unwrap(), ours.as_str());
            prop_assert_eq!(out.iter().filter(|m| member_key(m) == "priority").count(), 1);
            // Every other member is an input member, in input order.
            let mut input = existing.split(',').map(trimmed);
            for kept in &out[..out.len() - 1] {
                prop_assert!(input.any(|m| m == *kept), "{} not from the input", kept);
            }
        }

    }

    proptest! {
        #![proptest_config(fuzz::config(64))]

        /// Arbitrary header bytes (as text) never panic and keep the limits.
        #[test]
        fn any_header_keeps_the_limits(header in ".{0,300}") {
            let merged = merge(Some(&header.repeat(40)), "priority", "P1");
            prop_assert!(merged.len() <= MAX_BYTES);
            prop_assert!(merged.split(',').count() <= MAX_MEMBERS);
            prop_assert!(merged.ends_with("priority=P1"));
        }
    }
}

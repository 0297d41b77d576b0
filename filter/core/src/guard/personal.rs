//! Personal data, by its shape and, where it has one, its checksum: a
//! number that only looks like a card, an IBAN or a social security number
//! is let be. Numbers are read whole: none starts inside another (after a
//! digit, or a digit and one of ` .,-/:`), and one that goes on past its
//! shape (more digits, a letter, a separator and a digit) is none of them,
//! so a plain run of digits or a table of numbers is not read as a card or
//! a phone number.

use std::ops::Range;

use super::detector::{DetectorId as D, Set};
use super::scan::Scan;

/// Payment card issuers by the first digits of the number: the range of
/// the prefix, its digits, and the number's lengths allowed (a bit each).
const ISSUERS: [(u16, u16, u8, u32); 16] = [
    // Visa.
    (4, 4, 1, 1 << 13 | 1 << 16 | 1 << 19),
    // Mastercard.
    (51, 55, 2, 1 << 16),
    (2221, 2720, 4, 1 << 16),
    // American Express.
    (34, 34, 2, 1 << 15),
    (37, 37, 2, 1 << 15),
    // Discover.
    (6011, 6011, 4, LONG),
    (644, 649, 3, LONG),
    (65, 65, 2, LONG),
    // Diners Club.
    (300, 305, 3, 1 << 14 | LONG),
    (36, 36, 2, 1 << 14 | LONG),
    (38, 39, 2, LONG),
    // JCB, UnionPay, Mir.
    (3528, 3589, 4, LONG),
    (62, 62, 2, LONG),
    (2200, 2204, 4, LONG),
    // Maestro.
    (50, 50, 2, 1 << 13 | 1 << 15 | LONG),
    (56, 58, 2, 1 << 13 | 1 << 15 | LONG),
];
/// Lengths 16 to 19.
const LONG: u32 = 0b1111 << 16;
/// Each IBAN country and the length of its IBANs, as the IBAN registry
/// (release 100) lists them; a territory writes its IBANs with its
/// country's code (Åland with FI, Jersey with GB).
const IBAN_LENGTHS: &[u8] = b"AD24AE23AL28AT20AZ28BA20BE16BG22BH22BI27BR29BY28CH21CR22CY28CZ24\
DE22DJ27DK18DO28EE20EG29ES24FI18FK18FO18FR27GB22GE22GI23GL18GR27GT28HN28HR21HU28IE22IL23IQ23\
IS26IT27JO30KW30KZ20LB28LC32LI21LT20LU20LV21LY25MC27MD24ME22MK19MN20MR27MT31MU30NI28NL18NO15\
OM23PK24PL28PS29PT25QA29RO24RS22RU33SA24SC31SD18SE24SI19SK24SM27SO23ST25SV28TL23TN24TR26UA29VA22\
VG24XK20YE30";
/// The longest IBAN.
const IBAN_MAX: usize = 34;

fn digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// The value of ASCII digits (at most 9 of them).
fn value(digits: &[u8]) -> u32 {
    digits
        .iter()
        .fold(0, |n, d| n * 10 + u32::from(d.wrapping_sub(b'0')))
}

/// The Luhn checksum of `digits` (their values) holds.
fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(k, d)| {
            let d = u32::from(*d);
            match k % 2 {
                0 => d,
                _ if d > 4 => d * 2 - 9,
                _ => d * 2,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// A detector of a fixed shape: where what starts at a byte ends.
type Shape<'t> = fn(&Scan<'t>, usize) -> Option<usize>;

/// Digits in groups, as [`Scan::groups`] read them.
struct Groups {
    end: usize,
    /// The digits' values, in order.
    digits: [u8; 19],
    len: usize,
    /// The groups' lengths.
    groups: [u8; 8],
    count: usize,
}

impl Groups {
    fn digits(&self) -> &[u8] {
        self.digits.get(..self.len).unwrap_or_default()
    }

    fn groups(&self) -> &[u8] {
        self.groups.get(..self.count).unwrap_or_default()
    }
}

impl<'t> Scan<'t> {
    /// Personal data of a fixed shape that starts at `i`: its detector and
    /// end.
    pub(super) fn personal(&self, i: usize, set: Set) -> Option<(D, usize)> {
        // Who may start with this byte: a bit for digits, capitals, hex
        // digits and `:`, the start of a phone number.
        let class = match self.at(i) {
            b'0'..=b'9' => 1,
            b'A'..=b'F' => 2 | 4,
            b'G'..=b'Z' => 2,
            b'a'..=b'f' | b':' => 4,
            b'+' | b'(' => 8,
            _ => return None,
        };
        let tries: [(D, u8, Shape<'t>); 6] = [
            (D::Iban, 2, Self::iban),
            (D::Ipv4, 1, Self::ipv4),
            (D::UsSsn, 1, Self::ssn),
            (D::CreditCard, 1, Self::card),
            (D::Phone, 1 | 8, Self::phone),
            (D::Ipv6, 1 | 4, Self::ipv6),
        ];
        if !self.number_starts(i, b".,-/:") {
            return None;
        }
        // After a number and a space, an address is still one (a log's
        // status code, then its client); a card or a phone number would be
        // the tail of a table of numbers.
        let spaced = !self.number_starts(i, b" ");
        tries
            .iter()
            .filter(|(id, starts, _)| starts & class != 0 && set.has(*id))
            .filter(|(id, _, _)| !spaced || matches!(id, D::Ipv4 | D::Ipv6))
            .find_map(|(id, _, f)| f(self, i).map(|end| (*id, end)))
    }

    /// A number may start at `i`: not inside another, after a digit and
    /// one of `seps`.
    fn number_starts(&self, i: usize, seps: &[u8]) -> bool {
        let Some(p) = i.checked_sub(1) else {
            return true;
        };
        let prev = self.at(p);
        !(seps.contains(&prev) && p.checked_sub(1).is_some_and(|q| digit(self.at(q))))
    }

    /// A number ends at `j`: no letter or digit follows, nor `.`, `,` or
    /// `-` and a digit.
    fn number_ends(&self, j: usize) -> bool {
        let next = self.at(j);
        !(next.is_ascii_alphanumeric() || (b".,-".contains(&next) && digit(self.at(j + 1))))
    }

    /// Groups of digits from `i`, joined by one of `seps` (the same one
    /// throughout), at most 19 digits and 8 groups.
    fn groups(&self, i: usize, seps: &[u8]) -> Option<Groups> {
        let mut g = Groups {
            end: i,
            digits: [0; 19],
            len: 0,
            groups: [0; 8],
            count: 0,
        };
        let mut sep = None;
        loop {
            let from = g.end;
            g.end = self.run_max(from, digit, 20);
            let run = self.b.get(from..g.end).unwrap_or_default();
            for d in run {
                *g.digits.get_mut(g.len)? = d - b'0';
                g.len += 1;
            }
            *g.groups.get_mut(g.count)? = u8::try_from(run.len()).ok()?;
            g.count += 1;
            let s = self.at(g.end);
            if !seps.contains(&s) || sep.is_some_and(|x| x != s) || !digit(self.at(g.end + 1)) {
                return (g.len > 0).then_some(g);
            }
            sep = Some(s);
            g.end += 1;
        }
    }

    /// A payment card number: 13 to 19 digits, alone or in groups (four
    /// digits, then three to six each) joined by spaces or dashes, of a
    /// known issuer's prefix and length, and Luhn-valid. A run of 13
    /// digits alone is an EAN-13 (GTIN) barcode's length, and no issuer
    /// has handed out 13-digit cards for years: none.
    fn card(&self, i: usize) -> Option<usize> {
        let g = self.groups(i, b" -")?;
        let grouped = match g.groups() {
            [13] => false,
            [_] => true,
            [4, rest @ ..] => rest.iter().all(|n| (3..=6).contains(n)),
            _ => false,
        };
        let digits = g.digits();
        let len = digits.len();
        // The first four digits, and as many as each issuer's prefix has.
        let four = digits
            .iter()
            .take(4)
            .fold(0u16, |v, d| v * 10 + u16::from(*d));
        let issuer = ISSUERS.iter().any(|(lo, hi, n, lens)| {
            let prefix = four / 10u16.pow(4 - u32::from(*n));
            (*lo..=*hi).contains(&prefix) && lens >> len & 1 == 1
        });
        (grouped && (13..=19).contains(&len) && issuer && luhn(digits) && self.number_ends(g.end))
            .then_some(g.end)
    }

    /// A US social security number, `AAA-GG-SSSS`: no area 000, 666 or
    /// 900 and up, no group 00, no serial 0000.
    fn ssn(&self, i: usize) -> Option<usize> {
        let s = self.b.get(i..i + 11)?;
        let shape = s.iter().enumerate().all(|(k, b)| {
            if k == 3 || k == 6 {
                *b == b'-'
            } else {
                digit(*b)
            }
        });
        if !shape || !self.number_ends(i + 11) {
            return None;
        }
        let area = value(s.get(..3)?);
        let group = value(s.get(4..6)?);
        let serial = value(s.get(7..)?);
        (area != 0 && area != 666 && area < 900 && group != 0 && serial != 0).then_some(i + 11)
    }

    /// An IPv4 address: four decimal octets, 0 to 255, without leading
    /// zeros, not right after the word `version` (`Version=4.0.0.0`,
    /// `"version": "1.2.3.4"`: a version, as `v1.2.3.4` is).
    fn ipv4(&self, i: usize) -> Option<usize> {
        if self.after_version(i) {
            return None;
        }
        let mut j = i;
        for k in 0..4 {
            if k > 0 {
                if self.at(j) != b'.' {
                    return None;
                }
                j += 1;
            }
            let end = self.run_max(j, digit, 4);
            let octet = self.b.get(j..end)?;
            let ok = match octet {
                [] | [b'0', _, ..] => false,
                _ => octet.len() <= 3 && value(octet) <= 255,
            };
            if !ok {
                return None;
            }
            j = end;
        }
        self.number_ends(j).then_some(j)
    }

    /// The word `version` (any case; or ending a name in camel case,
    /// `AssemblyVersion`; not `conversion`) ends at most a few quotes,
    /// spaces, `:` or `=` before `i`.
    fn after_version(&self, i: usize) -> bool {
        const WORD: &str = "version";
        let mut at = i;
        while at > 0 && i - at < 8 && b" \t\"'\\:=".contains(&self.at(at - 1)) {
            at -= 1;
        }
        at.checked_sub(WORD.len()).is_some_and(|w| {
            let prev = w.checked_sub(1).map_or(b' ', |p| self.at(p));
            self.starts_any_case(w, WORD)
                && (!prev.is_ascii_alphabetic()
                    || (self.at(w) == b'V' && prev.is_ascii_lowercase()))
        })
    }

    /// An IPv6 address: eight groups of one to four hex digits joined by
    /// `:`, or fewer with one `::`, the last two maybe an IPv4 address;
    /// with a decimal digit, and with `::` at least two groups unless it
    /// starts with it (`::1`), so `a::b` and `dead::beef` in code are none;
    /// with `::`, a group of three or four digits, an IPv4 tail or the
    /// loopback `::1` (every address in use has one: `2001:db8::1`,
    /// `fe80::1`, `::ffff:192.0.2.1`), so the slices `xs[::2]` and
    /// `xs[1::2]` are none.
    fn ipv6(&self, i: usize) -> Option<usize> {
        if i.checked_sub(1)
            .is_some_and(|p| b":.".contains(&self.at(p)))
        {
            return None;
        }
        let lead = self.starts(i, "::");
        let mut j = i + if lead { 2 } else { 0 };
        let (mut groups, mut gap, mut decimal, mut long) = (0, lead, false, false);
        loop {
            let end = self.run_max(j, |b| b.is_ascii_hexdigit(), 5);
            let group = self.b.get(j..end)?;
            if group.is_empty() {
                break;
            }
            if self.at(end) == b'.' && digit(self.at(end + 1)) {
                j = self.ipv4(j)?;
                groups += 2;
                decimal = true;
                long = true;
                break;
            }
            if group.len() > 4 || groups == 8 {
                return None;
            }
            decimal |= group.iter().any(|b| digit(*b));
            long |= group.len() >= 3;
            groups += 1;
            j = end;
            match (self.at(j), self.at(j + 1)) {
                (b':', b':') if !gap => {
                    gap = true;
                    j += 2;
                }
                (b':', b) if b.is_ascii_hexdigit() => j += 1,
                _ => break,
            }
        }
        let loopback = lead && j == i + 3 && self.at(i + 2) == b'1';
        let whole = match gap {
            true => groups <= 7 && (groups >= 2 || lead && groups == 1) && (long || loopback),
            false => groups == 8,
        };
        let next = self.at(j);
        let ends = !next.is_ascii_alphanumeric()
            && next != b':'
            && (next != b'.' || !digit(self.at(j + 1)));
        (whole && decimal && ends).then_some(j)
    }

    /// A phone number: `+` and 9 to 15 digits in groups (one may be in
    /// parentheses); a North American number with separators
    /// (`(415) 555-2671`, `415-555-2671`, `1.415.555.2671`: area and
    /// exchange codes start at 2); or a national number after its trunk `0`
    /// in two groups or more of 2 to 8 digits, 10 or 11 in all, joined by
    /// one of ` -./` (`020 7946 0958`, `06-12345678`, `01 23 45 67 89`). A
    /// plain run of digits is none.
    fn phone(&self, i: usize) -> Option<usize> {
        let plus = self.at(i) == b'+';
        let mut j = i + usize::from(plus);
        // Each group's start and length; the separators (a bit each); the
        // group in parentheses.
        let mut groups = [(0usize, 0usize); 6];
        let mut count = 0;
        let mut digits = 0;
        let mut seps = 0u8;
        let mut paren = None;
        loop {
            let open = self.at(j) == b'(' && paren.is_none();
            let from = j + usize::from(open);
            let end = self.run_max(from, digit, 16);
            let n = end - from;
            digits += n;
            if n == 0 || digits > 15 {
                return None;
            }
            *groups.get_mut(count)? = (from, n);
            j = end;
            if open {
                if self.at(j) != b')' {
                    return None;
                }
                paren = Some(count);
                j += 1;
            }
            count += 1;
            let (s, next) = (self.at(j), self.at(j + 1));
            if open && digit(s) {
                continue;
            }
            let bit = match s {
                b' ' => 1,
                b'-' => 2,
                b'.' => 4,
                b'/' => 8,
                _ => 0,
            };
            if bit == 0 || !(digit(next) || next == b'(') {
                break;
            }
            seps |= bit;
            j += 1;
        }
        let groups = groups.get(..count)?;
        let len = |k: usize| groups.get(k).map_or(0, |g| g.1);
        let first = |k: usize| groups.get(k).map_or(0, |g| self.at(g.0));
        let one_sep = seps.count_ones() <= 1;
        let ok = if plus {
            (9..=15).contains(&digits) && seps & 8 == 0 && first(0) != b'0'
        } else {
            let area = match (count, paren) {
                (3, None | Some(0)) => Some(0),
                (4, None) if len(0) == 1 && first(0) == b'1' => Some(1),
                _ => None,
            };
            let nanp = area.is_some_and(|a| {
                let seps_ok = match paren {
                    Some(_) => seps & 8 == 0,
                    None => one_sep && seps & 6 != 0,
                };
                (len(a), len(a + 1), len(a + 2)) == (3, 3, 4)
                    && first(a) >= b'2'
                    && first(a + 1) >= b'2'
                    && seps_ok
            });
            let trunk = paren.is_none()
                && first(0) == b'0'
                && self.at(i + 1) != b'0'
                && count >= 2
                && (10..=11).contains(&digits)
                && one_sep
                && groups.iter().all(|g| (2..=8).contains(&g.1));
            nanp || trunk
        };
        (ok && self.number_ends(j)).then_some(j)
    }

    /// An IBAN: a country, two check digits (2 to 98) and as many capital
    /// letters and digits as the country's IBANs have, in groups of four
    /// joined by single spaces or not at all, whose mod-97 checksum holds.
    fn iban(&self, i: usize) -> Option<usize> {
        let country = self.b.get(i..i + 2)?;
        if !digit(self.at(i + 2)) || !digit(self.at(i + 3)) {
            return None;
        }
        let len = IBAN_LENGTHS
            .chunks_exact(4)
            .find(|c| c.get(..2) == Some(country))
            .and_then(|c| c.get(2..))
            .map(|n| value(n) as usize)?;
        let mut chars = [0u8; IBAN_MAX];
        let mut j = i;
        let mut spaced = None;
        for (n, slot) in chars.iter_mut().take(len).enumerate() {
            if n > 0 && n % 4 == 0 {
                let space = self.at(j) == b' ';
                if *spaced.get_or_insert(space) != space {
                    return None;
                }
                j += usize::from(space);
            }
            let b = self.at(j);
            if !(b.is_ascii_uppercase() || digit(b)) {
                return None;
            }
            *slot = b;
            j += 1;
        }
        let next = self.at(j);
        let more = next.is_ascii_alphanumeric()
            || (spaced == Some(true) && next == b' ' && digit(self.at(j + 1)));
        let chars = chars.get(..len)?;
        let check = value(chars.get(2..4)?);
        let (head, rest) = chars.split_at_checked(4)?;
        let rem = rest.iter().chain(head).fold(0u32, |r, c| match c {
            b'0'..=b'9' => (r * 10 + u32::from(c - b'0')) % 97,
            _ => (r * 100 + u32::from(c - b'A') + 10) % 97,
        });
        (!more && (2..=98).contains(&check) && rem == 1).then_some(j)
    }

    /// An e-mail address around the `@` at `i`, not before `floor`.
    pub(super) fn email(&self, i: usize, floor: usize) -> Option<Range<usize>> {
        let local = |b: u8| b.is_ascii_alphanumeric() || b"._%+-".contains(&b);
        let mut start = i;
        while start > floor && local(self.at(start - 1)) && !self.escaped(start - 1) {
            self.step(1);
            start -= 1;
        }
        let from = i.saturating_add(1);
        let mut end = self.run(from, |b| {
            b.is_ascii_alphanumeric() || b == b'.' || b == b'-'
        });
        while end > from && b".-".contains(&self.at(end - 1)) {
            end -= 1;
        }
        let domain = self.b.get(from..end)?;
        let dot = domain.iter().position(|b| *b == b'.')?;
        // A top-level domain holds a letter: `react@18.3.1` is a package's
        // version.
        let top = domain.rsplit(|b| *b == b'.').next().unwrap_or_default();
        let named = top.iter().any(u8::is_ascii_alphabetic);
        (start < i && dot > 0 && dot + 1 < domain.len() && named).then_some(start..end)
    }
}

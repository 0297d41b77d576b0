//! The windows a limit counts in, and the arithmetic of one count.
//!
//! Minutes and hours slide: a count keeps its current window and the one
//! before, and weighs the one before by the share of it still inside the
//! sliding window (the "sliding window counter": an exact sliding count would
//! keep every call, this keeps two numbers and errs by at most the change of
//! rate within a window). So a caller that spent its minute at 12:00:59 does
//! not get a whole new minute at 12:01:00. Days and months are calendar
//! windows in UTC, as budgets and invoices are: a day's spend starts again at
//! midnight.
//!
//! Time is the host's wall clock, the same for every worker of a proxy. A
//! worker whose clock reads a window older than the one stored (a skew of a
//! few ms at a boundary) counts in the stored window: a count never moves
//! back, and nothing is ever lost or counted twice by it.

use serde::{Deserialize, Serialize};

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// The window a limit counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The last 60 s, sliding.
    Minute,
    /// The last hour, sliding.
    Hour,
    /// The calendar day, UTC.
    Day,
    /// The calendar month, UTC.
    Month,
}

impl Span {
    /// The index of the window `now_ms` falls in.
    pub fn index(self, now_ms: u64) -> u64 {
        match self {
            Self::Minute => now_ms / MINUTE_MS,
            Self::Hour => now_ms / HOUR_MS,
            Self::Day => now_ms / DAY_MS,
            Self::Month => {
                let (y, m, _) = civil_from_days(now_ms / DAY_MS);
                y * 12 + (m - 1)
            }
        }
    }

    /// When the window `index` starts, ms since the epoch.
    pub fn start_ms(self, index: u64) -> u64 {
        match self {
            Self::Minute => index.saturating_mul(MINUTE_MS),
            Self::Hour => index.saturating_mul(HOUR_MS),
            Self::Day => index.saturating_mul(DAY_MS),
            Self::Month => days_from_civil(index / 12, index % 12 + 1).saturating_mul(DAY_MS),
        }
    }

    /// The window's length when it slides.
    fn sliding_ms(self) -> Option<u64> {
        match self {
            Self::Minute => Some(MINUTE_MS),
            Self::Hour => Some(HOUR_MS),
            Self::Day | Self::Month => None,
        }
    }

    /// The word a limit's field and metric label use for the window.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Month => "month",
        }
    }
}

/// One count of one limit: its current window and the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// The current window's index.
    pub index: u64,
    /// Counted in the current window.
    pub current: u64,
    /// Counted in the window before (sliding spans only).
    pub previous: u64,
}

impl Count {
    /// Moves the count to the window `now_ms` falls in; an older window (a
    /// worker's clock behind the stored one) leaves it where it is.
    pub fn roll(&mut self, span: Span, now_ms: u64) {
        let i = span.index(now_ms);
        if i <= self.index {
            return;
        }
        self.previous = if i == self.index + 1 { self.current } else { 0 };
        self.current = 0;
        self.index = i;
    }

    /// What counts against the limit at `now_ms` (after [`Count::roll`]).
    pub fn used(&self, span: Span, now_ms: u64) -> u64 {
        let Some(len) = span.sliding_ms() else {
            return self.current;
        };
        let into = now_ms.saturating_sub(span.start_ms(self.index)).min(len);
        let left = len - into;
        // previous × (left / len), rounded up: the share of the window before
        // still inside the sliding window.
        let weighed = (u128::from(self.previous) * u128::from(left)).div_ceil(u128::from(len));
        self.current
            .saturating_add(u64::try_from(weighed).unwrap_or(u64::MAX))
    }

    /// How long until `need` more fits under `max`, ms, at `now_ms` (after
    /// [`Count::roll`], nothing else counted meanwhile); 0 when it fits now,
    /// `None` when it never can (`need` alone is more than `max`).
    pub fn wait_ms(&self, span: Span, now_ms: u64, need: u64, max: u64) -> Option<u64> {
        if need > max {
            return None;
        }
        if self.used(span, now_ms).saturating_add(need) <= max {
            return Some(0);
        }
        let start = span.start_ms(self.index);
        let Some(len) = span.sliding_ms() else {
            // A calendar window frees at its end, all at once.
            return Some(span.start_ms(self.index + 1).saturating_sub(now_ms));
        };
        let into = now_ms.saturating_sub(start).min(len);
        let room = max - need;
        // The share `f` of a window that must have passed for `count × (1 − f)`
        // to fit in `room`, as ms of it, rounded up.
        let passed = |count: u64, room: u64| -> u64 {
            if count <= room {
                return 0;
            }
            let over = u128::from(count - room) * u128::from(len);
            u64::try_from(over.div_ceil(u128::from(count))).unwrap_or(len)
        };
        if self.current <= room {
            // Fits within this window, once enough of the one before slid out.
            let at = passed(self.previous, room - self.current);
            return Some(at.saturating_sub(into).max(1));
        }
        // Not before the next window, where this one is the one before.
        Some(
            (len - into)
                .saturating_add(passed(self.current, room))
                .max(1),
        )
    }
}

/// `ms` since the epoch as an RFC 3339 UTC time, to the second.
pub fn rfc3339(ms: u64) -> String {
    let s = ms / 1000;
    let (y, mo, d) = civil_from_days(s / 86_400);
    let t = s % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

/// Year, month (1..=12) and day of a count of days since 1970-01-01
/// (proleptic Gregorian; H. Hinnant's algorithm, for days on or after 1970).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of the first day of month `m` (1..=12) of year `y`
/// (≥ 1970); the inverse of [`civil_from_days`].
fn days_from_civil(y: u64, m: u64) -> u64 {
    let y = if m <= 2 { y.saturating_sub(1) } else { y };
    let era = y / 400;
    let yoe = y % 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_547_200_000; // 2025-12-01T00:00:00Z

    #[test]
    fn calendar_windows_are_utc_days_and_months() {
        assert_eq!(civil_from_days(T0 / DAY_MS), (2025, 12, 1));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let m = Span::Month.index(T0);
        assert_eq!(Span::Month.start_ms(m), T0);
        // December has 31 days: the next month starts 2026-01-01.
        assert_eq!(Span::Month.start_ms(m + 1), T0 + 31 * DAY_MS);
        assert_eq!(Span::Month.index(T0 + 31 * DAY_MS - 1), m);
        assert_eq!(Span::Month.index(T0 + 31 * DAY_MS), m + 1);
        for days in [0, 59, 365, 10_000, 20_000, 20_500, 30_000] {
            let (y, mo, _) = civil_from_days(days);
            let start = days_from_civil(y, mo);
            assert!(start <= days && days - start < 31, "{days}");
            assert_eq!(civil_from_days(start).2, 1);
        }
    }

    #[test]
    fn times_are_written_as_rfc3339() {
        assert_eq!(rfc3339(T0 + 3_723_999), "2025-12-01T01:02:03Z");
    }

    #[test]
    fn a_sliding_minute_weighs_the_minute_before() {
        let mut c = Count::default();
        c.roll(Span::Minute, T0);
        c.current = 100;
        // A quarter into the next minute, three quarters of the last one count.
        let t = T0 + 60_000 + 15_000;
        c.roll(Span::Minute, t);
        assert_eq!((c.previous, c.current), (100, 0));
        assert_eq!(c.used(Span::Minute, t), 75);
        // Two minutes on, nothing is left.
        c.roll(Span::Minute, t + 120_000);
        assert_eq!(c.used(Span::Minute, t + 120_000), 0);
    }

    #[test]
    fn a_clock_behind_counts_in_the_stored_window() {
        let mut c = Count::default();
        c.roll(Span::Minute, T0 + 60_000);
        c.current = 7;
        c.roll(Span::Minute, T0 + 59_990);
        assert_eq!((c.index, c.current), (Span::Minute.index(T0 + 60_000), 7));
    }

    #[test]
    fn the_wait_is_until_the_need_fits() {
        let mut c = Count::default();
        c.roll(Span::Minute, T0);
        c.current = 100;
        assert_eq!(c.wait_ms(Span::Minute, T0, 10, 110), Some(0));
        assert_eq!(c.wait_ms(Span::Minute, T0, 200, 150), None);
        // 100 used of 100: 10 more fit once a tenth of the minute slid out of
        // the next one, 60 s + 6 s from now.
        let wait = c.wait_ms(Span::Minute, T0, 10, 100).unwrap();
        assert_eq!(wait, 66_000);
        let later = T0 + wait;
        let mut d = c;
        d.roll(Span::Minute, later);
        assert!(d.used(Span::Minute, later) + 10 <= 100);
        assert!(d.used(Span::Minute, later - 1_000) + 10 > 100);
        // Within the same minute: the one before slides out.
        let mut e = Count::default();
        e.roll(Span::Minute, T0 + 60_000);
        e.previous = 100;
        e.current = 20;
        let t = T0 + 60_000;
        let wait = e.wait_ms(Span::Minute, t, 10, 100).unwrap();
        assert_eq!(wait, 18_000);
        assert!(e.used(Span::Minute, t + wait) + 10 <= 100);
        // A day frees at midnight.
        let mut day = Count::default();
        day.roll(Span::Day, T0 + 1_000);
        day.current = 5;
        assert_eq!(
            day.wait_ms(Span::Day, T0 + 1_000, 1, 5),
            Some(DAY_MS - 1_000)
        );
    }
}

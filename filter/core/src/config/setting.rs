//! A setting stated once. Each section declares its settings as constants —
//! the field's name, its default and its bound — and compiles every one of
//! them through [`Setting::read`], so the default a section applies and the
//! range it refuses outside of live in one place. The section also lists its
//! settings in a table ([`Row`]s under the section's path, [`SECTIONS`]),
//! which the docs test (`filter/core/tests/docs.rs`) compares with the rows
//! of `docs/configuration.md`: a default or a range changed here fails that
//! test until the page says the same. The table is read by tests only, so no
//! byte of it reaches the Wasm module; for the same reason a setting's
//! one-line description is the doc comment on its constant, and the page's
//! `meaning` cell the longer one.

use std::fmt::Display;

use super::check;
use super::error::ConfigError;

/// A setting: the field's name relative to its section, the value an absent
/// or `null` field takes, and the values it may take.
#[derive(Debug, Clone, Copy)]
pub struct Setting<T: 'static> {
    /// The field's name, as errors name it (relative to the section).
    pub name: &'static str,
    /// The value of an absent or `null` field.
    pub default: T,
    /// The values accepted.
    pub bound: Bound<T>,
}

/// The values a setting accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound<T> {
    /// Every value serde accepts.
    Any,
    /// A whole number in `lo..=hi`.
    Range(T, T),
    /// A whole number other than zero; the word names the unit in the
    /// refusal.
    Positive(&'static str),
    /// A real number between `lo` and `hi`, each end open (`true`) or
    /// closed; NaN and infinities are refused.
    Real(T, bool, T, bool),
    /// A finite real number above zero.
    PositiveReal,
    /// A bound that depends on another setting, checked by the section's
    /// code and stated in these words on the page.
    Stated(&'static str),
}

/// A number a setting can hold. Whole numbers of every width are checked
/// as `u64` and reals as `f64`, so the module holds one check of each.
pub trait Number: Copy + PartialOrd + Display + Default {
    /// `value` within `bound`, a refusal naming `name`.
    fn within(name: &str, value: Self, bound: Bound<Self>) -> Result<Self, ConfigError>;
}

macro_rules! whole {
    ($($t:ty),*) => {$(
        impl Number for $t {
            fn within(name: &str, value: Self, bound: Bound<Self>) -> Result<Self, ConfigError> {
                let wide = |v: Self| u64::try_from(v).unwrap_or(u64::MAX);
                whole_within(name, wide(value), bound.map(wide)).map(|()| value)
            }
        }
    )*};
}
whole!(u8, u16, u32, u64, usize);

impl Number for f64 {
    fn within(name: &str, value: Self, bound: Bound<Self>) -> Result<Self, ConfigError> {
        real_within(name, value, bound).map(|()| value)
    }
}

impl<T> Bound<T> {
    /// The same bound over other numbers.
    fn map<U>(self, f: impl Fn(T) -> U) -> Bound<U> {
        match self {
            Self::Any => Bound::Any,
            Self::Range(lo, hi) => Bound::Range(f(lo), f(hi)),
            Self::Positive(what) => Bound::Positive(what),
            Self::Real(lo, a, hi, b) => Bound::Real(f(lo), a, f(hi), b),
            Self::PositiveReal => Bound::PositiveReal,
            Self::Stated(words) => Bound::Stated(words),
        }
    }
}

/// A whole number within `bound`.
fn whole_within(name: &str, value: u64, bound: Bound<u64>) -> Result<(), ConfigError> {
    match bound {
        Bound::Range(lo, hi) => check::in_range(name, value, lo..=hi).map(drop),
        Bound::Positive(what) => check::positive(name, value, what).map(drop),
        Bound::Any | Bound::Stated(_) | Bound::Real(..) | Bound::PositiveReal => Ok(()),
    }
}

/// A real number within `bound`; NaN and infinities are refused by every
/// bound but `Any` and `Stated`.
fn real_within(name: &str, value: f64, bound: Bound<f64>) -> Result<(), ConfigError> {
    match bound {
        Bound::Real(lo, lo_open, hi, hi_open) => {
            let above = if lo_open { value > lo } else { value >= lo };
            let below = if hi_open { value < hi } else { value <= hi };
            if above && below && value.is_finite() {
                return Ok(());
            }
            let open = if lo_open { '(' } else { '[' };
            let close = if hi_open { ')' } else { ']' };
            Err(ConfigError::new(
                name,
                format!("{value} is not in {open}{lo}, {hi}{close}"),
            ))
        }
        Bound::PositiveReal => check::positive_real(name, value).map(drop),
        Bound::Range(lo, hi) => check::real_in(name, value, lo..=hi).map(drop),
        Bound::Positive(_) | Bound::Any | Bound::Stated(_) => Ok(()),
    }
}

impl<T: Number> Setting<T> {
    /// A whole number in `lo..=hi`, `default` when not written.
    pub const fn range(name: &'static str, default: T, lo: T, hi: T) -> Self {
        Self {
            name,
            default,
            bound: Bound::Range(lo, hi),
        }
    }

    /// The value written, or the default, checked against the bound.
    pub fn read(&self, written: Option<T>) -> Result<T, ConfigError> {
        self.check(written.unwrap_or(self.default))
    }

    /// `value` checked against the bound, the refusal naming the field.
    pub fn check(&self, value: T) -> Result<T, ConfigError> {
        T::within(self.name, value, self.bound)
    }
}

impl Setting<f64> {
    /// A share in `[0, 1]`.
    pub const fn fraction(name: &'static str, default: f64) -> Self {
        Self::real(name, default, (0.0, false), (1.0, false))
    }

    /// A real number between two ends, each `(value, open)`.
    pub const fn real(name: &'static str, default: f64, lo: (f64, bool), hi: (f64, bool)) -> Self {
        Self {
            name,
            default,
            bound: Bound::Real(lo.0, lo.1, hi.0, hi.1),
        }
    }
}

impl<T> Setting<T> {
    /// A setting every value serde accepts is valid for.
    pub const fn any(name: &'static str, default: T) -> Self {
        Self {
            name,
            default,
            bound: Bound::Any,
        }
    }
}

impl<T: Copy> Setting<T> {
    /// The value written, or the default (a setting every value of its type
    /// is valid for).
    pub fn or(&self, written: Option<T>) -> T {
        written.unwrap_or(self.default)
    }
}

impl Setting<&'static str> {
    /// The text written, or the default.
    pub fn or_string(&self, written: Option<String>) -> String {
        written.unwrap_or_else(|| self.default.to_string())
    }
}

/// A setting seen by the docs test: its name, its default and its bound as
/// text, so settings of every type make one table.
pub trait Row: Sync {
    /// The field's name relative to its section.
    fn name(&self) -> &'static str;
    /// The default as the page writes it (`3600`, `0.1`, `true`, `x-user-id`).
    fn default_text(&self) -> String;
    /// The bound with each number written out.
    fn bound_text(&self) -> Bound<String>;
}

impl<T: Display + Sync + Copy> Row for Setting<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn default_text(&self) -> String {
        self.default.to_string()
    }

    fn bound_text(&self) -> Bound<String> {
        match self.bound {
            Bound::Any => Bound::Any,
            Bound::Range(lo, hi) => Bound::Range(lo.to_string(), hi.to_string()),
            Bound::Positive(what) => Bound::Positive(what),
            Bound::Real(lo, a, hi, b) => Bound::Real(lo.to_string(), a, hi.to_string(), b),
            Bound::PositiveReal => Bound::PositiveReal,
            Bound::Stated(words) => Bound::Stated(words),
        }
    }
}

/// A setting whose default is derived from other settings, stated in words
/// on the page (`three intervals`).
pub struct Derived<T: 'static> {
    /// The setting; its own default is not used.
    pub setting: Setting<T>,
    /// The default, in the page's words.
    pub default: &'static str,
}

impl<T: Display + Sync + Copy> Row for Derived<T> {
    fn name(&self) -> &'static str {
        self.setting.name
    }

    fn default_text(&self) -> String {
        self.default.to_string()
    }

    fn bound_text(&self) -> Bound<String> {
        self.setting.bound_text()
    }
}

/// A setting whose default is one of its type's names (an enum's variant).
pub struct Named<T: 'static> {
    /// The field's name.
    pub name: &'static str,
    /// The default.
    pub default: T,
    /// How the document spells a value.
    pub spell: fn(T) -> &'static str,
}

impl<T: Copy> Named<T> {
    /// The value written, or the default.
    pub fn default_or(&self, written: Option<T>) -> T {
        written.unwrap_or(self.default)
    }
}

impl<T: Copy + Sync + 'static> Row for Named<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn default_text(&self) -> String {
        (self.spell)(self.default).to_string()
    }

    fn bound_text(&self) -> Bound<String> {
        Bound::Any
    }
}

/// The settings of one object of the document, under its path (`""` for
/// the document's own fields, `routing.models.<>[]` for each backend).
pub type Table = &'static [(&'static str, &'static [&'static dyn Row])];

/// Every section's tables.
pub const SECTIONS: &[Table] = &[
    super::SETTINGS,
    crate::spans::config::SETTINGS,
    crate::routing::config::SETTINGS,
    crate::budget::config::SETTINGS,
    crate::cache::config::SETTINGS,
    crate::degrade::config::SETTINGS,
    crate::admin::config::SETTINGS,
    crate::shaping::config::SETTINGS,
    crate::limits::config::SETTINGS,
    crate::identity::config::SETTINGS,
    crate::ab::SETTINGS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_reads_its_default_and_refuses_outside_its_bound() {
        const N: Setting<u32> = Setting::range("n", 3, 1, 5);
        assert_eq!(N.read(None), Ok(3));
        assert_eq!(N.read(Some(5)), Ok(5));
        let e = N.read(Some(9)).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("n", "9 is not in 1..=5")
        );
        const W: Setting<u32> = Setting {
            name: "w",
            default: 1,
            bound: Bound::Positive("weight"),
        };
        assert_eq!(
            W.read(Some(0)).unwrap_err().message,
            "0 is not a positive weight"
        );
        const F: Setting<f64> = Setting::fraction("f", 0.5);
        assert_eq!(F.read(None), Ok(0.5));
        for bad in [f64::NAN, -0.1, 1.5, f64::INFINITY] {
            assert!(F.read(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            F.read(Some(1.5)).unwrap_err().message,
            "1.5 is not in [0, 1]"
        );
        const J: Setting<f64> = Setting::real("j", 0.1, (0.0, false), (1.0, true));
        assert_eq!(J.read(Some(1.0)).unwrap_err().message, "1 is not in [0, 1)");
        assert_eq!(J.read(Some(0.0)), Ok(0.0));
        const T: Setting<f64> = Setting::real("t", 0.9, (0.0, true), (1.0, false));
        assert_eq!(T.read(Some(0.0)).unwrap_err().message, "0 is not in (0, 1]");
        const S: Setting<f64> = Setting::real("s", 0.7, (0.0, true), (1.0, true));
        assert_eq!(S.read(Some(0.5)), Ok(0.5));
        for bad in [0.0, 1.0, f64::NAN] {
            assert!(S.read(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(S.read(Some(1.0)).unwrap_err().message, "1 is not in (0, 1)");
        const P: Setting<f64> = Setting {
            name: "p",
            default: 1.0,
            bound: Bound::PositiveReal,
        };
        assert_eq!(
            P.read(Some(0.0)).unwrap_err().message,
            "0 is not a positive number"
        );
        assert!(P.read(Some(f64::INFINITY)).is_err() && P.read(Some(f64::NAN)).is_err());
        assert!(Setting::any("b", true).or(None));
        assert_eq!(Setting::any("s", "x").or_string(Some("y".into())), "y");
        assert_eq!(Setting::any("s", "x").or_string(None), "x");
    }

    #[test]
    fn a_row_writes_the_default_and_bound_out() {
        const N: Setting<u64> = Setting::range("n", 3_600, 1, 86_400);
        assert_eq!(N.default_text(), "3600");
        assert_eq!(N.bound_text(), Bound::Range("1".into(), "86400".into()));
        assert_eq!(Setting::fraction("f", 0.05).default_text(), "0.05");
        assert_eq!(
            Setting::real("h", 10.0, (0.1, false), (3600.0, false)).default_text(),
            "10"
        );
    }
}

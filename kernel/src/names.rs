//! The one spelling of every option name: the CLI, the Python and JavaScript SDKs, JSON
//! reports and error messages all use [`Named::as_str`] and [`core::str::FromStr`] of the
//! kernel's enums, so a name exists once.
//!
//! Names are lowercase kebab-case (`next-fit`, `cost-desc`); parsing also accepts `_` for
//! `-` (`next_fit`), since Python callers write identifiers. Anything else is an
//! `invalid-argument` [`Error`] naming the option and every allowed value.

use alloc::string::String;
use core::fmt;

use crate::Error;
use crate::balance::{Cost, Order};
use crate::multi::MultiMethod;
use crate::pack::{OversizePolicy, PackMethod};
use crate::partition::PartitionMethod;

/// An enum with a fixed set of names.
pub trait Named: Sized + Copy + 'static {
    /// What the value is called in messages (`method`, `oversize`, …).
    const WHAT: &'static str;
    /// Every value, in the documented order (the default first).
    const ALL: &'static [Self];
    /// The value's name.
    fn as_str(self) -> &'static str;
    /// Every name, in the order of [`Named::ALL`].
    fn names() -> impl Iterator<Item = &'static str> {
        Self::ALL.iter().map(|v| v.as_str())
    }
    /// Parses a name (`_` accepted for `-`).
    fn parse_name(s: &str) -> Result<Self, Error> {
        Self::ALL
            .iter()
            .copied()
            .find(|v| {
                let name = v.as_str();
                name.len() == s.len() && name.bytes().zip(s.bytes()).all(|(a, b)| a == b || (a == b'-' && b == b'_'))
            })
            .ok_or_else(|| Error::InvalidArgument(alloc::format!("{} (got {s:?})", allowed::<Self>())))
    }
}

/// `"WHAT must be 'a', 'b' or 'c'"` for `T`.
pub fn allowed<T: Named>() -> String {
    let mut out = alloc::format!("{} must be ", T::WHAT);
    let n = T::ALL.len();
    for (i, name) in T::names().enumerate() {
        if i > 0 {
            out.push_str(if i + 1 == n { " or " } else { ", " });
        }
        out.push('\'');
        out.push_str(name);
        out.push('\'');
    }
    out
}

macro_rules! named {
    ($ty:ident, $what:literal, [$($variant:ident => $name:literal),+ $(,)?]) => {
        impl Named for $ty {
            const WHAT: &'static str = $what;
            const ALL: &'static [Self] = &[$($ty::$variant),+];
            fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }
        impl core::str::FromStr for $ty {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                <$ty as Named>::parse_name(s)
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named!(PartitionMethod, "method", [Kk => "kk", Greedy => "greedy", Verl => "verl"]);
named!(PackMethod, "method", [Bfd => "bfd", Ffd => "ffd", NextFit => "next-fit"]);
named!(MultiMethod, "method", [Balanced => "balanced", Bfd => "bfd", Ffd => "ffd", NextFit => "next-fit"]);
named!(OversizePolicy, "oversize", [Error => "error", Single => "single", Drop => "drop"]);
named!(Order, "order", [None => "none", CostDesc => "cost-desc", Verl => "verl", Roll => "roll"]);

/// The named cost presets: `tokens` = (1, 0) and `attention` = (24576, 1).
pub const COST_PRESETS: [(&str, Cost); 2] = [("tokens", Cost::TOKENS), ("attention", Cost::ATTENTION)];

impl Cost {
    /// The preset's name if this cost is one of [`COST_PRESETS`].
    pub fn preset_name(&self) -> Option<&'static str> {
        COST_PRESETS.iter().find(|(_, c)| c == self).map(|(name, _)| *name)
    }
}

/// `tokens`, `attention` or `LINEAR,QUADRATIC` (two integers ≥ 0).
impl core::str::FromStr for Cost {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        if let Some((_, c)) = COST_PRESETS.iter().find(|(name, _)| *name == s) {
            return Ok(*c);
        }
        let (a, b) = s.split_once(',').ok_or_else(|| {
            Error::InvalidArgument(alloc::format!(
                "cost must be 'tokens', 'attention' or LINEAR,QUADRATIC (two integers ≥ 0) (got {s:?})"
            ))
        })?;
        let int = |x: &str, what: &str| {
            x.trim().parse::<u64>().map_err(|e| {
                Error::InvalidArgument(alloc::format!(
                    "cost {what} coefficient {x:?}: {e} (an integer from 0 to 2^64 - 1)"
                ))
            })
        };
        Ok(Cost { linear: int(a, "linear")?, quadratic: int(b, "quadratic")? })
    }
}

/// The preset's name, else `LINEAR,QUADRATIC` (what [`core::str::FromStr`] reads back).
impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.preset_name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{},{}", self.linear, self.quadratic),
        }
    }
}

impl core::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn names_round_trip_and_accept_underscores() {
        for &m in PackMethod::ALL {
            assert_eq!(m.as_str().parse::<PackMethod>(), Ok(m));
        }
        assert_eq!("next_fit".parse::<PackMethod>(), Ok(PackMethod::NextFit));
        assert_eq!("cost_desc".parse::<Order>(), Ok(Order::CostDesc));
        assert_eq!(
            "worst".parse::<PackMethod>(),
            Err(Error::InvalidArgument("method must be 'bfd', 'ffd' or 'next-fit' (got \"worst\")".into()))
        );
        assert!("Bfd".parse::<PackMethod>().is_err());
    }

    #[test]
    fn costs_parse_and_print() {
        assert_eq!("attention".parse::<Cost>(), Ok(Cost::ATTENTION));
        assert_eq!("3, 2".parse::<Cost>(), Ok(Cost { linear: 3, quadratic: 2 }));
        assert_eq!(Cost { linear: 3, quadratic: 2 }.to_string(), "3,2");
        assert_eq!(Cost::ATTENTION.to_string(), "attention");
        assert!("3".parse::<Cost>().is_err());
        assert!("-1,0".parse::<Cost>().is_err());
    }
}

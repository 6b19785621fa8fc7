//! Finding the line and column of one node, for an error report.
//!
//! The YAML deserializer tells positions only through its errors: an error
//! returned while visiting a node carries that node's position. So to place
//! an error, the file is read again, walking straight to the node, and the
//! walk fails there on purpose. Used for at most
//! [`super::MAX_LOCATED_ERRORS`] errors of a file that is refused anyway.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::raw::{Budget, RawKey, ValueSeed};
use crate::error::Location;

/// A node of a rule file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    /// The `nth` top-level key spelled `key` (or the `nth` non-string key when `key` is `None`).
    TopKey(Option<String>, usize),
    /// The value of the first top-level key spelled so.
    TopValue(String),
    /// The rule at this index of `policies`.
    Rule(usize),
    /// A key in a rule, as for [`Target::TopKey`].
    RuleKey(usize, Option<String>, usize),
    /// The value of the first key so spelled in a rule.
    RuleValue(usize, String),
}

/// The position of `target` in `text`, if the parser gives one.
pub(crate) fn locate(text: &str, target: &Target) -> Option<Location> {
    let budget = Budget::for_text(text.len());
    let found = Cell::new(false);
    let walk = Walk {
        target,
        budget: &budget,
        found: &found,
        level: Level::Top,
    };
    let deserializer = yaml_serde::Deserializer::from_str(text);
    match walk.deserialize(deserializer) {
        Err(error) if found.get() => error.location().map(|l| Location {
            line: l.line(),
            column: l.column(),
        }),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Top,
    Policies,
    Rule(usize),
}

#[derive(Clone, Copy)]
struct Walk<'t> {
    target: &'t Target,
    budget: &'t Budget,
    found: &'t Cell<bool>,
    level: Level,
}

impl Walk<'_> {
    fn skip(&self) -> ValueSeed<'_> {
        ValueSeed {
            budget: self.budget,
            keep: false,
        }
    }

    fn here(&self) -> Here<'_> {
        Here { found: self.found }
    }

    /// The key this level's walk is after, and which occurrence.
    fn wanted_key(&self) -> Option<(Option<&str>, usize)> {
        match (self.level, self.target) {
            (Level::Top, Target::TopKey(key, nth)) => Some((key.as_deref(), *nth)),
            (Level::Rule(i), Target::RuleKey(j, key, nth)) if i == *j => {
                Some((key.as_deref(), *nth))
            }
            _ => None,
        }
    }

    fn wanted_value(&self) -> Option<&str> {
        match (self.level, self.target) {
            (Level::Top, Target::TopValue(key)) => Some(key),
            (Level::Rule(i), Target::RuleValue(j, key)) if i == *j => Some(key),
            _ => None,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rule file")
    }

    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _v: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let wanted = match (self.level, self.target) {
            (
                Level::Policies,
                Target::Rule(i) | Target::RuleKey(i, _, _) | Target::RuleValue(i, _),
            ) => *i,
            _ => return Ok(()),
        };
        for _ in 0..wanted {
            if seq.next_element_seed(self.skip())?.is_none() {
                return Ok(());
            }
        }
        if matches!(self.target, Target::Rule(_)) {
            seq.next_element_seed(self.here())?;
        } else {
            seq.next_element_seed(Walk {
                level: Level::Rule(wanted),
                ..self
            })?;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if self.level == Level::Policies {
            return Ok(());
        }
        let wanted_key = self.wanted_key();
        let wanted_value = self.wanted_value();
        let seen = Cell::new(0usize);
        while let Some(key) = map.next_key_seed(KeyProbe {
            wanted: wanted_key,
            seen: &seen,
            budget: self.budget,
            found: self.found,
        })? {
            let key = match key {
                RawKey::Str(text) => Some(text),
                RawKey::Other(_) => None,
            };
            if let (Some(want), Some(key)) = (wanted_value, key.as_deref())
                && want == key
            {
                map.next_value_seed(self.here())?;
                return Ok(());
            }
            let into_policies = self.level == Level::Top
                && key.as_deref() == Some("policies")
                && matches!(
                    self.target,
                    Target::Rule(_) | Target::RuleKey(..) | Target::RuleValue(..)
                );
            if into_policies {
                map.next_value_seed(Walk {
                    level: Level::Policies,
                    ..self
                })?;
                return Ok(());
            }
            map.next_value_seed(self.skip())?;
        }
        Ok(())
    }
}

/// Reads a key, and fails on the wanted one (inside the key's own visit, so
/// the error carries the key's position).
#[derive(Clone, Copy)]
struct KeyProbe<'a> {
    wanted: Option<(Option<&'a str>, usize)>,
    seen: &'a Cell<usize>,
    budget: &'a Budget,
    found: &'a Cell<bool>,
}

impl KeyProbe<'_> {
    fn check<E: de::Error>(&self, key: Option<&str>) -> Result<(), E> {
        let Some((want, nth)) = self.wanted else {
            return Ok(());
        };
        if want == key {
            if self.seen.get() == nth {
                self.found.set(true);
                return Err(E::custom("here"));
            }
            self.seen.set(self.seen.get() + 1);
        }
        Ok(())
    }

    fn other<E: de::Error>(&self, kind: &'static str) -> Result<RawKey, E> {
        self.check(None)?;
        Ok(RawKey::Other(kind))
    }
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = RawKey;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<RawKey, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyProbe<'_> {
    type Value = RawKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawKey, E> {
        self.check(Some(v))?;
        Ok(RawKey::Str(v.to_owned()))
    }
    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<RawKey, E> {
        self.other("a boolean")
    }
    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<RawKey, E> {
        self.other("a number")
    }
    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<RawKey, E> {
        self.other("a number")
    }
    fn visit_i128<E: de::Error>(self, _v: i128) -> Result<RawKey, E> {
        self.other("a number")
    }
    fn visit_u128<E: de::Error>(self, _v: u128) -> Result<RawKey, E> {
        self.other("a number")
    }
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<RawKey, E> {
        self.other("a number")
    }
    fn visit_unit<E: de::Error>(self) -> Result<RawKey, E> {
        self.other("nothing")
    }
    fn visit_none<E: de::Error>(self) -> Result<RawKey, E> {
        self.other("nothing")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawKey, A::Error> {
        self.check(None)?;
        let skip = ValueSeed {
            budget: self.budget,
            keep: false,
        };
        skip.visit_seq(seq)?;
        Ok(RawKey::Other("a list"))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawKey, A::Error> {
        self.check(None)?;
        let skip = ValueSeed {
            budget: self.budget,
            keep: false,
        };
        skip.visit_map(map)?;
        Ok(RawKey::Other("a mapping"))
    }
}

/// Fails on whatever node it is given, so the error carries its position.
#[derive(Clone, Copy)]
struct Here<'a> {
    found: &'a Cell<bool>,
}

impl Here<'_> {
    fn fail<E: de::Error>(&self) -> E {
        self.found.set(true);
        E::custom("here")
    }
}

impl<'de> DeserializeSeed<'de> for Here<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Here<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_i128<E: de::Error>(self, _v: i128) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_u128<E: de::Error>(self, _v: u128) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_str<E: de::Error>(self, _v: &str) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(self.fail())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<(), A::Error> {
        Err(self.fail())
    }
    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        Err(self.fail())
    }
}

//! Reading YAML into a loose raw form, bounded in nodes and bytes, so an alias bomb stops early.
//!
//! The raw form keeps what the checker needs (strings, booleans, numbers,
//! the shape of lists and mappings) and nothing else. Every node the YAML
//! deserializer hands out, aliases expanded, counts against
//! [`MAX_YAML_NODES`] and every scalar's length against
//! [`MAX_SCALAR_BYTES`]; past either the read stops with an error.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// The most YAML nodes (scalars, lists, mappings; aliases counted each time
/// they are used) one file may expand to; a file may also expand to at most
/// about twice as many nodes as it has bytes.
pub const MAX_YAML_NODES: usize = 4_000_000;

/// The most scalar bytes (aliases counted each time they are used) one file
/// may expand to; a file may also expand to at most about twice its length.
pub const MAX_SCALAR_BYTES: usize = 32 * 1024 * 1024;

/// The most rules in one file.
pub const MAX_RULES: usize = 100_000;

/// Counts what the deserializer hands out; records why it stopped.
pub(crate) struct Budget {
    nodes: Cell<usize>,
    bytes: Cell<usize>,
    max_nodes: usize,
    max_bytes: usize,
    pub(crate) stopped: RefCell<Option<String>>,
}

impl Budget {
    /// The budget for a file of `len` bytes. Without aliases a file holds
    /// fewer nodes and fewer scalar bytes than it has bytes, so twice its
    /// length (and at most the global caps) leaves room for honest aliases
    /// while an alias bomb stops after little more work than reading it.
    pub(crate) fn for_text(len: usize) -> Self {
        let room = len.saturating_mul(2).saturating_add(1024);
        Self {
            nodes: Cell::new(0),
            bytes: Cell::new(0),
            max_nodes: room.min(MAX_YAML_NODES),
            max_bytes: room.min(MAX_SCALAR_BYTES),
            stopped: RefCell::new(None),
        }
    }

    fn stop<E: de::Error>(&self, message: String) -> E {
        let error = E::custom(&message);
        *self.stopped.borrow_mut() = Some(message);
        error
    }

    fn node<E: de::Error>(&self) -> Result<(), E> {
        let n = self.nodes.get() + 1;
        self.nodes.set(n);
        if n > self.max_nodes {
            return Err(self.stop(format!(
                "the file expands to more than {} yaml nodes (an alias bomb?)",
                self.max_nodes
            )));
        }
        Ok(())
    }

    fn bytes<E: de::Error>(&self, len: usize) -> Result<(), E> {
        let n = self.bytes.get().saturating_add(len);
        self.bytes.set(n);
        if n > self.max_bytes {
            return Err(self.stop(format!(
                "the file expands to more than {} bytes of text (an alias bomb?)",
                self.max_bytes
            )));
        }
        Ok(())
    }
}

/// A YAML value as far as the checker cares.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Raw {
    Null,
    Bool(bool),
    Int(i128),
    Float,
    /// A string; its text is kept only where asked.
    Str(Option<String>),
    Seq {
        len: usize,
        all_strings: bool,
        strings: Vec<String>,
    },
    Map,
}

impl Raw {
    /// "a string", "a list", ...: for "must be ..., found ..." messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Raw::Null => "nothing",
            Raw::Bool(_) => "a boolean",
            Raw::Int(_) | Raw::Float => "a number",
            Raw::Str(_) => "a string",
            Raw::Seq { .. } => "a list",
            Raw::Map => "a mapping",
        }
    }
}

/// A mapping key: a string, or the kind of whatever else it was.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RawKey {
    Str(String),
    Other(&'static str),
}

/// One entry of `policies`.
#[derive(Debug)]
pub(crate) enum RawEntry {
    Rule(Vec<(RawKey, Raw)>),
    Other(Raw),
}

/// The value of a top-level key.
#[derive(Debug)]
pub(crate) enum RawTop {
    Policies(Vec<RawEntry>),
    Value(Raw),
}

/// The whole document.
#[derive(Debug)]
pub(crate) enum RawFile {
    Map(Vec<(RawKey, RawTop)>),
    Other(Raw),
}

fn tag_error<E: de::Error>(budget: &Budget) -> E {
    budget.stop("yaml tags (`!name`) are not supported".to_owned())
}

/// Reads any value; keeps string text when `keep` (and for list items when `keep`).
#[derive(Clone, Copy)]
pub(crate) struct ValueSeed<'b> {
    pub(crate) budget: &'b Budget,
    pub(crate) keep: bool,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Raw;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Raw, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any yaml value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(Raw::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(Raw::Int(i128::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(Raw::Int(i128::from(v)))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(Raw::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(i128::try_from(v).map_or(Raw::Float, Raw::Int))
    }

    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(Raw::Float)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        self.budget.node()?;
        self.budget.bytes(v.len())?;
        Ok(Raw::Str(self.keep.then(|| v.to_owned())))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        self.budget.node()?;
        Ok(Raw::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Raw, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        self.budget.node()?;
        let mut len = 0usize;
        let mut all_strings = true;
        let mut strings = Vec::new();
        while let Some(item) = seq.next_element_seed(ValueSeed {
            budget: self.budget,
            keep: self.keep,
        })? {
            len += 1;
            match item {
                Raw::Str(Some(text)) => strings.push(text),
                Raw::Str(None) => {}
                _ => all_strings = false,
            }
        }
        Ok(Raw::Seq {
            len,
            all_strings,
            strings,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        self.budget.node()?;
        let skip = ValueSeed {
            budget: self.budget,
            keep: false,
        };
        while map.next_key_seed(skip)?.is_some() {
            map.next_value_seed(skip)?;
        }
        Ok(Raw::Map)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Raw, A::Error> {
        Err(tag_error(self.budget))
    }
}

/// Reads a mapping key.
#[derive(Clone, Copy)]
pub(crate) struct KeySeed<'b> {
    pub(crate) budget: &'b Budget,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = RawKey;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<RawKey, D::Error> {
        let raw = ValueSeed {
            budget: self.budget,
            keep: true,
        }
        .deserialize(deserializer)?;
        Ok(match raw {
            Raw::Str(Some(text)) => RawKey::Str(text),
            other => RawKey::Other(other.kind()),
        })
    }
}

/// Reads one entry of `policies`.
struct EntrySeed<'b> {
    budget: &'b Budget,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = RawEntry;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<RawEntry, D::Error> {
        deserializer.deserialize_any(self)
    }
}

macro_rules! forward_scalars {
    ($wrap:expr) => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            self.value().visit_bool(v).map($wrap)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            self.value().visit_i64(v).map($wrap)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            self.value().visit_u64(v).map($wrap)
        }
        fn visit_i128<E: de::Error>(self, v: i128) -> Result<Self::Value, E> {
            self.value().visit_i128(v).map($wrap)
        }
        fn visit_u128<E: de::Error>(self, v: u128) -> Result<Self::Value, E> {
            self.value().visit_u128(v).map($wrap)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            self.value().visit_f64(v).map($wrap)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            self.value().visit_str(v).map($wrap)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            self.value().visit_unit().map($wrap)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            self.value().visit_unit().map($wrap)
        }
        fn visit_some<D: de::Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_any(self)
        }
        fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Self::Value, A::Error> {
            Err(tag_error(self.budget))
        }
    };
}

impl EntrySeed<'_> {
    fn value(&self) -> ValueSeed<'_> {
        ValueSeed {
            budget: self.budget,
            keep: false,
        }
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = RawEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rule")
    }

    forward_scalars!(RawEntry::Other);

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawEntry, A::Error> {
        self.value().visit_seq(seq).map(RawEntry::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntry, A::Error> {
        self.budget.node()?;
        let mut fields = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed {
            budget: self.budget,
        })? {
            let value = map.next_value_seed(ValueSeed {
                budget: self.budget,
                keep: true,
            })?;
            fields.push((key, value));
        }
        Ok(RawEntry::Rule(fields))
    }
}

/// Reads the value of `policies`.
struct PoliciesSeed<'b> {
    budget: &'b Budget,
}

impl PoliciesSeed<'_> {
    fn value(&self) -> ValueSeed<'_> {
        ValueSeed {
            budget: self.budget,
            keep: false,
        }
    }
}

impl<'de> DeserializeSeed<'de> for PoliciesSeed<'_> {
    type Value = RawTop;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<RawTop, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PoliciesSeed<'_> {
    type Value = RawTop;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of rules")
    }

    forward_scalars!(RawTop::Value);

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawTop, A::Error> {
        self.value().visit_map(map).map(RawTop::Value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawTop, A::Error> {
        self.budget.node()?;
        let mut entries = Vec::new();
        while let Some(entry) = seq.next_element_seed(EntrySeed {
            budget: self.budget,
        })? {
            if entries.len() >= MAX_RULES {
                return Err(self
                    .budget
                    .stop(format!("more than {MAX_RULES} rules in one file")));
            }
            entries.push(entry);
        }
        Ok(RawTop::Policies(entries))
    }
}

/// Reads the whole document.
pub(crate) struct FileSeed<'b> {
    pub(crate) budget: &'b Budget,
}

impl FileSeed<'_> {
    fn value(&self) -> ValueSeed<'_> {
        ValueSeed {
            budget: self.budget,
            keep: false,
        }
    }
}

impl<'de> DeserializeSeed<'de> for FileSeed<'_> {
    type Value = RawFile;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<RawFile, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FileSeed<'_> {
    type Value = RawFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rule file")
    }

    forward_scalars!(RawFile::Other);

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawFile, A::Error> {
        self.value().visit_seq(seq).map(RawFile::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFile, A::Error> {
        self.budget.node()?;
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed {
            budget: self.budget,
        })? {
            let value = if key == RawKey::Str("policies".to_owned()) {
                map.next_value_seed(PoliciesSeed {
                    budget: self.budget,
                })?
            } else {
                // The text of `timezone` is kept: it names the zone.
                let keep = key == RawKey::Str("timezone".to_owned());
                RawTop::Value(map.next_value_seed(ValueSeed {
                    budget: self.budget,
                    keep,
                })?)
            };
            entries.push((key, value));
        }
        Ok(RawFile::Map(entries))
    }
}

//! Device manifests: validation of untrusted manifests with 8DK v1's rules,
//! order and messages, and the manifest digest.
//!
//! The validated manifest's types, their errors, their canonical JSON and
//! digest are defined here; its parts: [`validate`] (reading an untrusted
//! manifest), [`limits`] and [`extension`] (the dk extension's fields, read
//! and written).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::text::write_json_str as json_str;

mod extension;
pub mod limits;
pub(crate) mod validate;

use extension::ToolExtras;
pub(crate) use extension::is_whole;
pub use extension::{Annotations, Bounds};

/// Why a manifest was refused. `Display` gives 8DK v1's exact message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The manifest is not a JSON object.
    #[error("manifest must be an object")]
    NotAnObject,
    /// The manifest text is not JSON at all (only from
    /// [`validate_manifest_json`](crate::validate_manifest_json)).
    #[error("manifest is not valid JSON: {0}")]
    NotJson(String),
    /// The id is text but not lower case words joined by `-`.
    #[error("manifest id \"{0}\" must be lower case words joined by \"-\"")]
    BadId(String),
    /// `capabilities` is missing, not an array, or empty.
    #[error("manifest must declare at least one capability")]
    NoCapabilities,
    /// More than [`limits::CAPABILITIES`] capabilities.
    #[error("manifest declares more than {} capabilities", limits::CAPABILITIES)]
    TooManyCapabilities,
    /// A capability name is text but not lower snake case (or contains `__`).
    #[error("capability name \"{0}\" must be lower snake case without \"__\"")]
    BadCapabilityName(String),
    /// Two capabilities share a name.
    #[error("duplicate capability \"{0}\"")]
    DuplicateCapability(String),
    /// A capability's kind is neither `sensor` nor `actuator`.
    #[error("capability \"{0}\" kind must be sensor or actuator")]
    BadCapabilityKind(String),
    /// More than [`limits::PARAMS`] params on one capability.
    #[error("capability \"{0}\" declares more than {max} params", max = limits::PARAMS)]
    TooManyParams(String),
    /// A param's key or type is wrong. The key is cut to [`limits::PARAM_NAME`] UTF-16 units.
    #[error(
        "capability \"{capability}\" param \"{key}\" must be lower snake case with type string, number or boolean"
    )]
    BadParam {
        /// The capability declaring the param.
        capability: String,
        /// The param key, cut to 30 UTF-16 code units.
        key: String,
    },
    /// A text field is not a string, is blank, or is too long.
    #[error("manifest {field} must be a non-empty string of at most {max} characters")]
    TextLength {
        /// The field, as 8DK names it (`id`, `capability "x" description`, ...).
        field: String,
        /// Its limit in UTF-16 code units.
        max: usize,
    },
    /// A param's `maxLength` (a dk extension) is not a whole number from 1 to
    /// [`limits::INPUT_STRING`] on a string param.
    #[error(
        "capability \"{capability}\" param \"{key}\" maxLength must be a whole number from 1 to {max} on a string param",
        max = limits::INPUT_STRING
    )]
    BadMaxLength {
        /// The capability declaring the param.
        capability: String,
        /// The param key.
        key: String,
    },
    /// A param's `multiline` (a dk extension) is not a boolean, or is true
    /// on a param that is not a string.
    #[error(
        "capability \"{capability}\" param \"{key}\" multiline must be true or false on a string param"
    )]
    BadMultiline {
        /// The capability declaring the param.
        capability: String,
        /// The param key.
        key: String,
    },
    /// A param's `base64` (a dk extension) is not a boolean, or is true on
    /// a param that is not a string or declares no `maxLength`.
    #[error(
        "capability \"{capability}\" param \"{key}\" base64 must be true or false on a string param with a maxLength"
    )]
    BadBase64 {
        /// The capability declaring the param.
        capability: String,
        /// The param key.
        key: String,
    },
    /// `noScreen` (a dk extension) is not a boolean.
    #[error("manifest noScreen must be true or false")]
    BadNoScreen,
    /// A field of the dk extension (a manifest with `"dk": 1`) is not as
    /// the extension defines it.
    #[error("manifest {field} {why}")]
    BadExtension {
        /// The field, named as in 8DK's messages (`capability "x" param
        /// "y" minimum`, `events`, `dk`).
        field: String,
        /// What it must be.
        why: String,
    },
    /// A text field contains a refused character (see [`crate::is_unsafe_char`]).
    #[error("manifest {field} contains control, escape, invisible or bidirectional characters")]
    UnsafeText {
        /// The field, as 8DK names it.
        field: String,
    },
}

/// What a capability does to the world; `"sensor"` or `"actuator"` in
/// JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    /// Reads the world.
    Sensor,
    /// Changes the world.
    Actuator,
}

impl CapabilityKind {
    /// `sensor` or `actuator`.
    pub fn as_str(self) -> &'static str {
        match self {
            CapabilityKind::Sensor => "sensor",
            CapabilityKind::Actuator => "actuator",
        }
    }

    /// The kind `text` names (`sensor` or `actuator`, exactly), if any.
    pub fn parse(text: &str) -> Option<CapabilityKind> {
        match text {
            "sensor" => Some(CapabilityKind::Sensor),
            "actuator" => Some(CapabilityKind::Actuator),
            _ => None,
        }
    }
}

impl fmt::Display for CapabilityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON type a param takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamType {
    /// A JSON string.
    String,
    /// A finite JSON number.
    Number,
    /// `true` or `false`.
    Boolean,
}

impl ParamType {
    /// `string`, `number` or `boolean`.
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Number => "number",
            ParamType::Boolean => "boolean",
        }
    }

    fn from_value(value: Option<&Value>) -> Option<ParamType> {
        match value?.as_str()? {
            "string" => Some(ParamType::String),
            "number" => Some(ParamType::Number),
            "boolean" => Some(ParamType::Boolean),
            _ => None,
        }
    }
}

impl fmt::Display for ParamType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One declared param of a capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    name: String,
    ty: ParamType,
    description: Option<String>,
    required: bool,
    max_length: Option<usize>,
    multiline: bool,
    base64: bool,
    bounds: Bounds,
}

impl Param {
    /// The param's key in the input object.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its type.
    pub fn ty(&self) -> ParamType {
        self.ty
    }
    /// Its description, when the device gave a non-empty one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    /// Whether a call must give it.
    pub fn required(&self) -> bool {
        self.required
    }
    /// The longest string a call may pass (UTF-16 units): the param's own
    /// `maxLength` (a dk extension) or [`limits::INPUT_STRING`].
    pub fn max_length(&self) -> usize {
        self.max_length.unwrap_or(limits::INPUT_STRING)
    }
    /// Whether a call's string may hold new lines (U+000A) and tabs
    /// (U+0009), the param's `multiline` (a dk extension): text typed
    /// into a program, where they press Return and Tab. No other control
    /// character is ever allowed.
    pub fn multiline(&self) -> bool {
        self.multiline
    }
    /// Whether a call's string must be standard base64 (`A-Z`, `a-z`,
    /// `0-9`, `+`, `/`, `=` padding), the param's `base64` (a dk
    /// extension): bytes such as audio, whose `maxLength` may then be up
    /// to [`limits::INPUT_BASE64`].
    pub fn base64(&self) -> bool {
        self.base64
    }
    /// The bounds its values must keep (the dk extension; empty for a
    /// manifest without `"dk": 1`).
    pub fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    /// A copy without its description: what a check of a value reads.
    fn for_checks(&self) -> Param {
        Param {
            description: None,
            ..self.clone()
        }
    }
}

/// One thing a device can sense or do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    name: String,
    kind: CapabilityKind,
    description: String,
    params: Vec<Param>,
    confirm: bool,
    extras: ToolExtras,
}

impl Capability {
    /// Lower snake case name, unique on its device.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Sensor or actuator.
    pub fn kind(&self) -> CapabilityKind {
        self.kind
    }
    /// What it does, shown to the person and the model.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// Declared params, in the order the device sent them.
    pub fn params(&self) -> &[Param] {
        &self.params
    }
    /// The JSON Schema of a call's input, as 8DK gives it to a model: an
    /// object of the declared params (each its type and, when declared, its
    /// description, in declared order), the required ones listed, nothing
    /// else allowed. With the dk extension, each param's bounds too
    /// (`minimum`, `maximum`, `enum`, `minLength`, `maxLength`, `integer`
    /// as the type), or the capability's own `inputSchema` as declared.
    pub fn input_schema(&self) -> Value {
        if let Some(schema) = &self.extras.input_schema {
            return schema.clone();
        }
        serde_json::to_value(InputSchema(&self.params, self.extras.extended)).unwrap_or(Value::Null)
    }
    /// Its `title` (the dk extension), a name for people.
    pub fn title(&self) -> Option<&str> {
        self.extras.title.as_deref()
    }
    /// Its `annotations` (the dk extension): the device's claims, shown as
    /// such.
    pub fn annotations(&self) -> Option<&Annotations> {
        self.extras.annotations.as_ref()
    }
    /// A copy holding only what [`check_input`](crate::check_input) reads:
    /// its name, kind, params and their bounds, and a declared input
    /// schema; no description, title, annotations or output schema. A small
    /// device keeps it to check a call's input before its handler.
    pub fn for_input_checks(&self) -> Capability {
        Capability {
            name: self.name.clone(),
            kind: self.kind,
            description: String::new(),
            params: self.params.iter().map(Param::for_checks).collect(),
            confirm: self.confirm,
            extras: ToolExtras {
                input_schema: self.extras.input_schema.clone(),
                extended: self.extras.extended,
                ..ToolExtras::default()
            },
        }
    }
    /// The JSON Schema its input must match, when the device declared one
    /// (`inputSchema`, the dk extension) instead of params.
    pub fn declared_input_schema(&self) -> Option<&Value> {
        self.extras.input_schema.as_ref()
    }
    /// The JSON Schema of its result's structured content, when declared
    /// (`outputSchema`, the dk extension).
    pub fn output_schema(&self) -> Option<&Value> {
        self.extras.output_schema.as_ref()
    }
    /// The name the device knows it by, when that is not its dk name
    /// (`tool`, the dk extension: an MCP server's tool behind a bridge).
    pub fn tool(&self) -> Option<&str> {
        self.extras.tool.as_deref()
    }
    /// The declared param named `name`.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
    /// Whether the person is asked on every call, even when granted.
    pub fn confirm(&self) -> bool {
        self.confirm
    }
}

/// An event a device declares it may send (`device:event` with this name
/// as its `capability`), with the params of its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    name: String,
    description: String,
    params: Vec<Param>,
}

impl EventSpec {
    /// Lower snake case, unique among the device's events and capabilities.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What it tells, shown to the person and the model.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// The params of its data, in declared order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }
    /// A copy holding only what [`check_event`](crate::check_event) reads:
    /// its name and params with their bounds, no description. A small
    /// device keeps it to check an event's data before sending it.
    pub fn for_data_checks(&self) -> EventSpec {
        EventSpec {
            name: self.name.clone(),
            description: String::new(),
            params: self.params.iter().map(Param::for_checks).collect(),
        }
    }
}

/// A validated device manifest. The only way to get one is
/// [`validate_manifest`](crate::validate_manifest), so holding a `Manifest` means every v1 rule passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    id: String,
    name: String,
    kind: String,
    version: String,
    capabilities: Vec<Capability>,
    no_screen: bool,
    extended: bool,
    events: Vec<EventSpec>,
}

impl Manifest {
    /// Lower case words joined by `-`, at most 24 characters.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Display name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Free-form kind (`lamp`, `lock`, ...).
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// The device's own version text.
    pub fn version(&self) -> &str {
        &self.version
    }
    /// Capabilities in declaration order.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }
    /// The capability named `name`.
    pub fn capability(&self, name: &str) -> Option<&Capability> {
        self.capabilities.iter().find(|c| c.name == name)
    }

    /// Whether the device says it cannot display a pairing code (`noScreen`,
    /// a dk extension). Nothing then proves the device in front of the
    /// person is the one pairing, and the person must confirm that knowingly.
    pub fn no_screen(&self) -> bool {
        self.no_screen
    }

    /// Whether the manifest opted in to the dk extension (`"dk": 1`): its
    /// bounds, events and tool fields are read and enforced, and its digest
    /// covers them.
    pub fn extended(&self) -> bool {
        self.extended
    }

    /// The events it declares (the dk extension), in declared order.
    pub fn events(&self) -> &[EventSpec] {
        &self.events
    }

    /// The declared event named `name`.
    pub fn event(&self, name: &str) -> Option<&EventSpec> {
        self.events.iter().find(|e| e.name == name)
    }

    /// The canonical JSON plus dk's extensions (`noScreen`, params'
    /// `maxLength`, `multiline` and `base64`): what a vessel stores, so that validating it again gives
    /// back this same manifest. [`Manifest::to_json`] and the digest leave the
    /// extensions out, as 8DK does.
    pub fn to_stored_json(&self) -> String {
        let mut out = String::with_capacity(512);
        self.write(&mut out, true);
        out
    }

    /// Compact JSON of the validated manifest in the canonical key order
    /// (`id, name, kind, version, capabilities`; capability `name, kind,
    /// description, params?, confirm?`; param `type, description?,
    /// required?`). Byte-identical to 8DK's `JSON.stringify` of its validated copy.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(512);
        self.write(&mut out, false);
        out
    }

    /// Writes the canonical JSON. Validated text holds no control character
    /// (they are refused), so `"` and `\\` are the only characters JSON
    /// needs escaped, exactly as `JSON.stringify` escapes them. The `Serialize`
    /// impl writes the same bytes; a test holds the two together.
    fn write(&self, out: &mut String, extensions: bool) {
        out.push_str("{\"id\":");
        json_str(out, &self.id);
        out.push_str(",\"name\":");
        json_str(out, &self.name);
        out.push_str(",\"kind\":");
        json_str(out, &self.kind);
        out.push_str(",\"version\":");
        json_str(out, &self.version);
        out.push_str(",\"capabilities\":[");
        for (i, cap) in self.capabilities.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"name\":");
            json_str(out, &cap.name);
            out.push_str(",\"kind\":\"");
            out.push_str(cap.kind.as_str());
            out.push_str("\",\"description\":");
            json_str(out, &cap.description);
            if !cap.params.is_empty() {
                out.push_str(",\"params\":{");
                for (j, param) in cap.params.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    json_str(out, &param.name);
                    write_param(out, param, extensions);
                }
                out.push('}');
            }
            if cap.confirm {
                out.push_str(",\"confirm\":true");
            }
            if extensions {
                extension::write_tool(out, &cap.extras);
            }
            out.push('}');
        }
        out.push(']');
        if extensions && !self.events.is_empty() {
            out.push_str(",\"events\":[");
            for (i, event) in self.events.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str("{\"name\":");
                json_str(out, &event.name);
                out.push_str(",\"description\":");
                json_str(out, &event.description);
                if !event.params.is_empty() {
                    out.push_str(",\"params\":{");
                    for (j, param) in event.params.iter().enumerate() {
                        if j > 0 {
                            out.push(',');
                        }
                        json_str(out, &param.name);
                        write_param(out, param, true);
                    }
                    out.push('}');
                }
                out.push('}');
            }
            out.push(']');
        }
        if extensions && self.no_screen {
            out.push_str(",\"noScreen\":true");
        }
        if extensions && self.extended {
            out.push_str(&format!(",\"dk\":{}", extension::VERSION));
        }
        out.push('}');
    }

    /// SHA-256 of [`Manifest::to_json`], lower-case hex: the manifest digest,
    /// equal to 8DK's `manifestDigest` for the same manifest. For a
    /// manifest with the dk extension, of [`Manifest::to_stored_json`]
    /// instead, so that every field the person consents to is covered.
    pub fn digest(&self) -> String {
        let text = if self.extended {
            self.to_stored_json()
        } else {
            self.to_json()
        };
        hex(&Sha256::digest(text.as_bytes()))
    }
}

/// Appends a param's spec (`:{...}`, after its key): 8DK's fields, then
/// with `extensions` dk's.
fn write_param(out: &mut String, param: &Param, extensions: bool) {
    out.push_str(":{\"type\":\"");
    out.push_str(param.ty.as_str());
    out.push('"');
    if let Some(description) = &param.description {
        out.push_str(",\"description\":");
        json_str(out, description);
    }
    if param.required {
        out.push_str(",\"required\":true");
    }
    if extensions {
        if let Some(max) = param.max_length {
            out.push_str(&format!(",\"maxLength\":{max}"));
        }
        if param.multiline {
            out.push_str(",\"multiline\":true");
        }
        if param.base64 {
            out.push_str(",\"base64\":true");
        }
        extension::write_bounds(out, &param.bounds);
    }
    out.push('}');
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(bytes)
}

impl Serialize for Manifest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("kind", &self.kind)?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("capabilities", &self.capabilities)?;
        map.end()
    }
}

impl Serialize for Capability {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("kind", self.kind.as_str())?;
        map.serialize_entry("description", &self.description)?;
        if !self.params.is_empty() {
            map.serialize_entry("params", &ParamsJson(&self.params))?;
        }
        if self.confirm {
            map.serialize_entry("confirm", &true)?;
        }
        map.end()
    }
}

struct ParamsJson<'a>(&'a [Param]);

impl Serialize for ParamsJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for param in self.0 {
            map.serialize_entry(&param.name, param)?;
        }
        map.end()
    }
}

impl Serialize for Param {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.ty.as_str())?;
        if let Some(description) = &self.description {
            map.serialize_entry("description", description)?;
        }
        if self.required {
            map.serialize_entry("required", &true)?;
        }
        map.end()
    }
}

/// [`Capability::input_schema`]'s shape.
struct InputSchema<'a>(&'a [Param], bool);

impl Serialize for InputSchema<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("type", "object")?;
        map.serialize_entry("properties", &ParamSchemas(self.0, self.1))?;
        let required: Vec<&str> = self
            .0
            .iter()
            .filter(|p| p.required())
            .map(|p| p.name.as_str())
            .collect();
        map.serialize_entry("required", &required)?;
        map.serialize_entry("additionalProperties", &false)?;
        map.end()
    }
}

/// The params as a JSON Schema's `properties`, in declared order; with the
/// dk extension, their bounds too.
struct ParamSchemas<'a>(&'a [Param], bool);

impl Serialize for ParamSchemas<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for param in self.0 {
            map.serialize_entry(&param.name, &ParamSchema(param, self.1))?;
        }
        map.end()
    }
}

/// One param's schema: `{"type", "description"?}`, and with the dk
/// extension (the `bool`) its bounds: `integer` as the type, `minimum`,
/// `maximum`, `enum`, `minLength`, `maxLength`.
struct ParamSchema<'a>(&'a Param, bool);

impl Serialize for ParamSchema<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (param, extended) = (self.0, self.1);
        let bounds = &param.bounds;
        let mut map = serializer.serialize_map(None)?;
        let ty = if extended && bounds.integer() {
            "integer"
        } else {
            param.ty().as_str()
        };
        map.serialize_entry("type", ty)?;
        if let Some(description) = param.description() {
            map.serialize_entry("description", description)?;
        }
        if extended {
            if let Some(n) = &bounds.minimum {
                map.serialize_entry("minimum", n)?;
            }
            if let Some(n) = &bounds.maximum {
                map.serialize_entry("maximum", n)?;
            }
            if !bounds.one_of().is_empty() {
                map.serialize_entry("enum", bounds.one_of())?;
            }
            if let Some(n) = bounds.min_length() {
                map.serialize_entry("minLength", &n)?;
            }
            if param.ty() == ParamType::String {
                map.serialize_entry("maxLength", &param.max_length())?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests;

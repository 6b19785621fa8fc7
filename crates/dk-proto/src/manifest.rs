//! Device manifests: validation of untrusted manifests with 8DK v1's rules,
//! order and messages, and the manifest digest.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::text::{
    has_unsafe_char, is_js_blank, utf16_len, utf16_prefix, write_json_str as json_str,
};

mod extension;

use extension::ToolExtras;
pub(crate) use extension::is_whole;
pub use extension::{Annotations, Bounds};

/// Limits on manifest text and size, as 8DK v1 sets them. Lengths are in
/// UTF-16 code units.
pub mod limits {
    /// Device id.
    pub const ID: usize = 24;
    /// Device display name.
    pub const NAME: usize = 80;
    /// Device kind.
    pub const KIND: usize = 40;
    /// Device version.
    pub const VERSION: usize = 40;
    /// Capabilities per device.
    pub const CAPABILITIES: usize = 32;
    /// Capability name.
    pub const CAPABILITY_NAME: usize = 30;
    /// Capability description.
    pub const CAPABILITY_DESCRIPTION: usize = 500;
    /// Params per capability.
    pub const PARAMS: usize = 16;
    /// Param name.
    pub const PARAM_NAME: usize = 30;
    /// Param description.
    pub const PARAM_DESCRIPTION: usize = 200;
    /// Longest string value a call may pass for a string param, unless the
    /// param declares a smaller `maxLength` (a dk extension).
    pub const INPUT_STRING: usize = 1000;
    /// Longest `maxLength` of a param declared `base64` (a dk extension):
    /// 768 KiB of base64, 576 KiB of bytes, so that the call's frame stays
    /// within a frame's 1 MiB.
    pub const INPUT_BASE64: usize = 768 * 1024;
    /// The dk manifest extension's limits: `UNIT`, `ENUM`, `TITLE`, `TOOL`,
    /// `SCHEMA_BYTES`, `SCHEMA_DEPTH` and `EVENTS`.
    pub use crate::manifest::extension::{
        ENUM, EVENTS, SCHEMA_BYTES, SCHEMA_DEPTH, TITLE, TOOL, UNIT,
    };
}

/// Why a manifest was refused. `Display` gives 8DK v1's exact message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The manifest is not a JSON object.
    #[error("manifest must be an object")]
    NotAnObject,
    /// The manifest text is not JSON at all (only from [`validate_manifest_json`]).
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
/// [`validate_manifest`], so holding a `Manifest` means every v1 rule passed.
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

/// Parses `text` as JSON and validates it with [`validate_manifest`].
pub fn validate_manifest_json(text: &str) -> Result<Manifest, ManifestError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ManifestError::NotJson(e.to_string()))?;
    validate_manifest(&value)
}

/// Validates an untrusted manifest with 8DK v1's rules, in its order, and
/// returns the validated copy (unknown keys dropped). The first failure wins.
pub fn validate_manifest(input: &Value) -> Result<Manifest, ManifestError> {
    // JavaScript treats an array as an object with none of the named fields.
    let empty = Map::new();
    let m = match input {
        Value::Object(map) => map,
        Value::Array(_) => &empty,
        _ => return Err(ManifestError::NotAnObject),
    };
    let id = text(field(m, "id"), limits::ID, || "id".to_owned())?;
    if !is_device_id(id) {
        return Err(ManifestError::BadId(id.to_owned()));
    }
    let raw_capabilities = match field(m, "capabilities") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        _ => return Err(ManifestError::NoCapabilities),
    };
    if raw_capabilities.len() > limits::CAPABILITIES {
        return Err(ManifestError::TooManyCapabilities);
    }
    let mut capabilities: Vec<Capability> = Vec::with_capacity(raw_capabilities.len());
    for raw in raw_capabilities {
        let capability = validate_capability(raw, &capabilities, &empty)?;
        capabilities.push(capability);
    }
    let mut manifest = Manifest {
        id: id.to_owned(),
        name: text(field(m, "name"), limits::NAME, || "name".to_owned())?.to_owned(),
        kind: text(field(m, "kind"), limits::KIND, || "kind".to_owned())?.to_owned(),
        version: text(field(m, "version"), limits::VERSION, || {
            "version".to_owned()
        })?
        .to_owned(),
        capabilities,
        no_screen: false,
        extended: false,
        events: Vec::new(),
    };
    // dk's extensions are checked last, so every manifest 8DK refuses gets
    // 8DK's first error.
    manifest.no_screen = match field(m, "noScreen") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ManifestError::BadNoScreen),
    };
    manifest.extended = extension::opted_in(m)?;
    for (capability, raw) in manifest.capabilities.iter_mut().zip(raw_capabilities) {
        let c = raw.as_object().unwrap_or(&empty);
        if let Some(Value::Object(specs)) = field(c, "params") {
            let owner = format!("capability \"{}\"", capability.name);
            let name = capability.name.clone();
            read_param_extensions(
                &name,
                &owner,
                &mut capability.params,
                specs,
                manifest.extended,
            )?;
        }
        if manifest.extended {
            let owner = format!("capability \"{}\"", capability.name);
            capability.extras = extension::read_tool(&owner, !capability.params.is_empty(), c)?;
            capability.extras.extended = true;
        }
    }
    if manifest.extended {
        manifest.events = read_events(m, &manifest.capabilities)?;
    }
    Ok(manifest)
}

/// Reads dk's param fields of `params` from their `specs`: `multiline`,
/// `base64` and `maxLength` always (errors name the capability `name`), the
/// extension's bounds when `extended` (errors name `owner`).
pub(super) fn read_param_extensions(
    name: &str,
    owner: &str,
    params: &mut [Param],
    specs: &Map<String, Value>,
    extended: bool,
) -> Result<(), ManifestError> {
    for param in params {
        let spec = specs.get(&param.name).and_then(Value::as_object);
        param.multiline = match spec.and_then(|spec| field(spec, "multiline")) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) if param.ty == ParamType::String => true,
            Some(_) => {
                return Err(ManifestError::BadMultiline {
                    capability: name.to_owned(),
                    key: param.name.clone(),
                });
            }
        };
        let raw_max = spec.and_then(|spec| field(spec, "maxLength"));
        param.base64 = match spec.and_then(|spec| field(spec, "base64")) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) if param.ty == ParamType::String && raw_max.is_some() => true,
            Some(_) => {
                return Err(ManifestError::BadBase64 {
                    capability: name.to_owned(),
                    key: param.name.clone(),
                });
            }
        };
        if let Some(raw_max) = raw_max {
            let most = if param.base64 {
                limits::INPUT_BASE64
            } else {
                limits::INPUT_STRING
            };
            let max = raw_max
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=most).contains(n) && param.ty == ParamType::String);
            param.max_length = Some(max.ok_or_else(|| ManifestError::BadMaxLength {
                capability: name.to_owned(),
                key: param.name.clone(),
            })?);
        }
        if let (true, Some(spec)) = (extended, spec) {
            let shape = extension::Shape {
                number: param.ty == ParamType::Number,
                string: param.ty == ParamType::String,
                max_length: param.max_length(),
            };
            param.bounds = extension::read_bounds(owner, &param.name, shape, spec)?;
        }
    }
    Ok(())
}

/// Reads a manifest's `events`; `capabilities` are those already read, whose
/// names an event may not take.
fn read_events(
    m: &Map<String, Value>,
    capabilities: &[Capability],
) -> Result<Vec<EventSpec>, ManifestError> {
    let Some(raw) = field(m, "events") else {
        return Ok(Vec::new());
    };
    let why = "must be a list of at most 32 events, each with a lower snake case name of its own";
    let Value::Array(list) = raw else {
        return Err(extension_error("events", why));
    };
    if list.len() > limits::EVENTS {
        return Err(extension_error("events", why));
    }
    let mut events: Vec<EventSpec> = Vec::with_capacity(list.len());
    let empty = Map::new();
    for raw in list {
        let e = raw.as_object().unwrap_or(&empty);
        let name = text(field(e, "name"), limits::CAPABILITY_NAME, || {
            "event name".to_owned()
        })?;
        let taken = events.iter().any(|other| other.name == name)
            || capabilities.iter().any(|c| c.name == name);
        if !is_snake_name(name) || taken {
            return Err(extension_error(&format!("event \"{name}\""), why));
        }
        let owner = format!("event \"{name}\"");
        let description = text(
            field(e, "description"),
            limits::CAPABILITY_DESCRIPTION,
            || format!("{owner} description"),
        )?;
        let mut params =
            validate_params(name, field(e, "params")).map_err(|error| match error {
                ManifestError::BadParam { key, .. } => extension_error(
                    &format!("{owner} param \"{key}\""),
                    "must be lower snake case with type string, number or boolean",
                ),
                ManifestError::TooManyParams(_) => {
                    extension_error(&owner, "declares more than 16 params")
                }
                other => other,
            })?;
        if let Some(Value::Object(specs)) = field(e, "params") {
            read_param_extensions(name, &owner, &mut params, specs, true)?;
        }
        events.push(EventSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            params,
        });
    }
    Ok(events)
}

/// The error of a field of the dk extension.
fn extension_error(field: &str, why: &str) -> ManifestError {
    ManifestError::BadExtension {
        field: field.to_owned(),
        why: why.to_owned(),
    }
}

impl From<extension::Refused> for ManifestError {
    fn from(refused: extension::Refused) -> ManifestError {
        ManifestError::BadExtension {
            field: refused.field,
            why: refused.why,
        }
    }
}

/// Validates one capability, in 8DK's order: name, duplicate, kind, params
/// (count, then each key and type, then its description), description, confirm.
fn validate_capability(
    raw: &Value,
    seen: &[Capability],
    empty: &Map<String, Value>,
) -> Result<Capability, ManifestError> {
    // A capability that is not an object has none of the fields.
    let c = raw.as_object().unwrap_or(empty);
    let name = text(field(c, "name"), limits::CAPABILITY_NAME, || {
        "capability name".to_owned()
    })?;
    if !is_snake_name(name) {
        return Err(ManifestError::BadCapabilityName(name.to_owned()));
    }
    if seen.iter().any(|other| other.name == name) {
        return Err(ManifestError::DuplicateCapability(name.to_owned()));
    }
    let kind = match field(c, "kind").and_then(Value::as_str) {
        Some("sensor") => CapabilityKind::Sensor,
        Some("actuator") => CapabilityKind::Actuator,
        _ => return Err(ManifestError::BadCapabilityKind(name.to_owned())),
    };
    let params = validate_params(name, field(c, "params"))?;
    let description = text(
        field(c, "description"),
        limits::CAPABILITY_DESCRIPTION,
        || format!("capability \"{name}\" description"),
    )?;
    Ok(Capability {
        name: name.to_owned(),
        kind,
        description: description.to_owned(),
        params,
        confirm: field(c, "confirm") == Some(&Value::Bool(true)),
        extras: ToolExtras::default(),
    })
}

/// Validates a capability's `params` the way 8DK walks `Object.entries` of it:
/// an array or a string has index keys (which never pass the name rule), a
/// number or boolean has none.
fn validate_params(capability: &str, raw: Option<&Value>) -> Result<Vec<Param>, ManifestError> {
    let bad = |key: &str| ManifestError::BadParam {
        capability: capability.to_owned(),
        key: utf16_prefix(key, limits::PARAM_NAME).to_owned(),
    };
    let map = match raw {
        Some(Value::Object(map)) => map,
        Some(Value::Array(list)) if !list.is_empty() => {
            return Err(if list.len() > limits::PARAMS {
                ManifestError::TooManyParams(capability.to_owned())
            } else {
                bad("0")
            });
        }
        Some(Value::String(s)) if !s.is_empty() => {
            return Err(if utf16_len(s) > limits::PARAMS {
                ManifestError::TooManyParams(capability.to_owned())
            } else {
                bad("0")
            });
        }
        _ => return Ok(Vec::new()),
    };
    if map.len() > limits::PARAMS {
        return Err(ManifestError::TooManyParams(capability.to_owned()));
    }
    let mut params = Vec::with_capacity(map.len());
    for (key, spec) in js_key_order(map) {
        let ty = match spec {
            Value::Object(spec) if utf16_len(key) <= limits::PARAM_NAME && is_snake_name(key) => {
                ParamType::from_value(field(spec, "type"))
            }
            _ => None,
        };
        let (Some(ty), Value::Object(spec)) = (ty, spec) else {
            return Err(bad(key));
        };
        let description = if truthy(field(spec, "description")) {
            let name = || format!("capability \"{capability}\" param \"{key}\" description");
            Some(text(field(spec, "description"), limits::PARAM_DESCRIPTION, name)?.to_owned())
        } else {
            None
        };
        params.push(Param {
            name: key.to_owned(),
            ty,
            description,
            required: truthy(field(spec, "required")),
            max_length: None,
            multiline: false,
            base64: false,
            bounds: Bounds::default(),
        });
    }
    Ok(params)
}

/// `map[key]` by a linear scan: manifests' objects are small, and a scan
/// beats hashing the key for a handful of entries. Keys are unique in the map.
fn field<'v>(map: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    if map.len() > 8 {
        return map.get(key);
    }
    map.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
}

/// Reads a text field: a string, not blank by JavaScript's `trim`, at most
/// `max` UTF-16 units, with no unsafe character.
fn text(
    value: Option<&Value>,
    max: usize,
    field: impl FnOnce() -> String,
) -> Result<&str, ManifestError> {
    let s = match value {
        Some(Value::String(s)) if !is_js_blank(s) && utf16_len(s) <= max => s.as_str(),
        _ => {
            return Err(ManifestError::TextLength {
                field: field(),
                max,
            });
        }
    };
    if has_unsafe_char(s) {
        return Err(ManifestError::UnsafeText { field: field() });
    }
    Ok(s)
}

/// `^[a-z0-9]+(-[a-z0-9]+)*$`
pub(crate) fn is_device_id(s: &str) -> bool {
    !s.is_empty()
        && s.split('-').all(|word| {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`: lower snake case, never `__`, no
/// leading digit, no trailing `_`.
pub(crate) fn is_snake_name(s: &str) -> bool {
    match s.as_bytes().first() {
        Some(b) if b.is_ascii_lowercase() => {}
        _ => return false,
    }
    s.split('_').all(|word| {
        !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// JavaScript truthiness of a JSON value.
fn truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// True for a canonical array index (`0`, or digits without a leading zero,
/// below 2^32 - 1): JavaScript enumerates such keys first, in numeric order.
pub(crate) fn array_index(key: &str) -> Option<u32> {
    if key.is_empty()
        || (key.len() > 1 && key.starts_with('0'))
        || !key.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    key.parse::<u32>().ok().filter(|&n| n != u32::MAX)
}

/// The keys of a JSON object in the order JavaScript's `Object.entries`
/// gives them: array-index keys ascending, then the rest as sent.
pub(crate) fn js_key_order(map: &Map<String, Value>) -> Vec<(&str, &Value)> {
    let mut indexed: Vec<(u32, &str, &Value)> = Vec::new();
    let mut named: Vec<(&str, &Value)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        match array_index(key) {
            Some(n) => indexed.push((n, key, value)),
            None => named.push((key, value)),
        }
    }
    if indexed.is_empty() {
        return named;
    }
    indexed.sort_by_key(|&(n, _, _)| n);
    indexed
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .chain(named)
        .collect()
}

#[cfg(test)]
mod tests;

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

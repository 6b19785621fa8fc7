//! dk's MQTT bridge: devices that already speak MQTT (Zigbee2MQTT,
//! Tasmota, ESPHome, Shelly) become dk devices, one per mapped device,
//! each with its own manifest, key and pairing, so the person pairs,
//! grants, rules, approves and audits them like any other.
//!
//! A mapping (`config.rs`, the TOML `dk bridge mqtt --config` reads) names
//! a device's state topic and its capabilities: a sensor reads the last
//! state seen there (a path into its JSON); an actuator publishes a
//! payload built from the call's checked input to a command topic
//! (`template.rs`: values are JSON-encoded into a fixed structure, never
//! spliced as text, and the topic is fixed) and waits until the state
//! topic confirms the change. `bridge.rs` holds the broker connection and
//! the devices. Nothing is exposed unless it is mapped, then paired and
//! granted by the person.

#![forbid(unsafe_code)]

mod bridge;
mod config;
pub mod discover;
mod template;

pub use bridge::{
    BridgeError, BrokerState, CodeHook, Credentials, MAX_PACKET_BYTES, MAX_STATE_BYTES,
    MAX_STATE_DEPTH, run_bridge,
};
pub use config::{ActuatorMap, BridgeConfig, BrokerConfig, ConfigError, DeviceMap, SensorMap};
pub use template::{TemplateError, fill};

//! Tests of device events as MCP resources.

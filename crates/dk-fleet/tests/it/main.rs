//! dk-fleet against a real `nats-server` (Debian's), each test starting
//! its own on a free loopback port and stopping it after.

#![cfg(test)]

mod harness;

mod auth;
mod events;
mod outsider;
mod presence;
mod requests;

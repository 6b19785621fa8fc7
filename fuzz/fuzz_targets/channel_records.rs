#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| dk_channel::fuzz::channel_records(data));

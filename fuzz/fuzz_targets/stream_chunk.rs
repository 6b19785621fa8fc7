#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| dk_proto::fuzz::stream_chunk(data));

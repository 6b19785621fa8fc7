#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| dk_policy::fuzz_admission(data));

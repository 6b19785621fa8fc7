//! The ABI called as C calls it: the header cbindgen writes, NULLs, bad
//! lengths and text, and a whole pairing against a vessel written on
//! dk-channel's responder.

use std::path::Path;

/// Where the checked-in header lives.
fn header_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include/dk_device.h")
}

#[test]
fn the_checked_in_header_is_what_cbindgen_writes() {
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(Path::new(crate_dir).join("cbindgen.toml")).unwrap();
    let mut written = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap()
        .write(&mut written);
    let written = String::from_utf8(written).unwrap();
    if std::env::var_os("DK_BLESS").is_some() {
        std::fs::write(header_path(), &written).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(header_path()).unwrap_or_default();
    assert!(
        checked_in == written,
        "crates/dk-device-c/include/dk_device.h is not what cbindgen writes from the crate: \
         run `DK_BLESS=1 cargo test -p dk-device-c header` to rewrite it"
    );
}

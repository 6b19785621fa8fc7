//! Links Debian's libespeak-ng (`libespeak-ng-dev`), the shared library.

fn main() {
    println!("cargo:rustc-link-lib=dylib=espeak-ng");
    println!("cargo:rerun-if-changed=build.rs");
}

//! Links the images with aarch64-rt's `image.ld` and our `memory.ld`, on
//! the bare-metal target only.

fn main() {
    println!("cargo::rerun-if-changed=memory.ld");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "none" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        println!("cargo::rustc-link-search={dir}");
        println!("cargo::rustc-link-arg-bins=-Timage.ld");
        println!("cargo::rustc-link-arg-bins=-Tmemory.ld");
    }
}

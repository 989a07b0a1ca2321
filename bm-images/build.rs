//! Links the images, on the bare-metal targets only: on aarch64 with
//! aarch64-rt's `image.ld` and our `memory.ld`; on Arm (Cortex-M) with
//! cortex-m-rt's `link.x`, which includes `cortex-m/memory.x`. Plus
//! defmt's `defmt.x` with the `defmt` feature.

fn main() {
    println!("cargo::rerun-if-changed=memory.ld");
    println!("cargo::rerun-if-changed=cortex-m/memory.x");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os == "none" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        if arch == "arm" {
            println!("cargo::rustc-link-search={dir}/cortex-m");
            println!("cargo::rustc-link-arg-bins=-Tlink.x");
        } else {
            println!("cargo::rustc-link-search={dir}");
            println!("cargo::rustc-link-arg-bins=-Timage.ld");
            println!("cargo::rustc-link-arg-bins=-Tmemory.ld");
        }
        // defmt's interned strings and its `.defmt` section (feature
        // `defmt`; the host decodes logs with the ELF's table).
        if std::env::var_os("CARGO_FEATURE_DEFMT").is_some() {
            println!("cargo::rustc-link-arg-bins=-Tdefmt.x");
        }
    }
}

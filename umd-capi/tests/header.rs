//! `include/umd.h` is what cbindgen generates from the crate now, and it
//! compiles warning-free as C99 and as C++ (with and without the host
//! build's and the capture's declarations) with the system's `cc` and `c++`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn header_is_up_to_date() {
    let path = crate_dir().join("include/umd.h");
    let fresh = generate();
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    // A bless run that changes the header fails too: a run with the
    // variable set by mistake (CI) never passes on a header it rewrote.
    if std::env::var_os("UMD_CAPI_BLESS").is_some() && committed != fresh {
        std::fs::write(&path, &fresh).expect("write include/umd.h");
        panic!("include/umd.h rewritten; rerun without UMD_CAPI_BLESS");
    }
    assert!(
        committed == fresh,
        "include/umd.h is not what cbindgen generates from the crate; rewrite it with \
         `UMD_CAPI_BLESS=1 cargo test -p umd-capi --test header`"
    );
}

/// Compiles a file that includes the header with `compiler` and `args`.
fn compiles(compiler: &str, args: &[&str], dir: &Path) {
    let src = dir.join("umd-include.c");
    std::fs::write(&src, "#include \"umd.h\"\nint umd_header_probe(void) { return (int)UMD_OK; }\n")
        .expect("write");
    let out = Command::new(compiler)
        .args(args)
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(dir.join("umd-include.o"))
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {} failed on umd.h:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_as_c99_and_cpp_without_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let strict = ["-Wall", "-Wextra", "-Wpedantic", "-Werror"];
    for host in [false, true] {
        let mut c: Vec<&str> = vec!["-std=c99"];
        c.extend(strict);
        let mut cpp: Vec<&str> = vec!["-x", "c++", "-std=c++11"];
        cpp.extend(strict);
        if host {
            c.extend(["-DUMD_HOST", "-DUMD_CAPTURE"]);
            cpp.extend(["-DUMD_HOST", "-DUMD_CAPTURE"]);
        }
        compiles("cc", &c, dir.path());
        compiles("c++", &cpp, dir.path());
    }
}

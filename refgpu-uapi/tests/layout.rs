//! The Rust mirror against the C header: `gcc` compiles a program that
//! includes `kmd/include/uapi/refgpu_drm.h` and prints every structure size,
//! field offset, ioctl number and constant; each must equal the Rust value.
//! (`tests/c/drm.h` stands in for the kernel's `drm.h`: the header needs
//! only its request-code macros.)

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use refgpu_uapi as u;

/// (C struct name, Rust size, [(field, Rust offset)]).
type StructRow = (&'static str, usize, Vec<(&'static str, usize)>);

macro_rules! layout {
    ($c:literal, $t:ty, [$($f:ident),* $(,)?]) => {
        ($c, size_of::<$t>(), vec![$((stringify!($f), offset_of!($t, $f))),*])
    };
}

fn structs() -> Vec<StructRow> {
    vec![
        layout!("drm_refgpu_get_param", u::GetParam, [param, pad, value]),
        layout!("drm_refgpu_bo_create", u::BoCreate, [size, flags, handle]),
        layout!("drm_refgpu_bo_mmap_offset", u::BoMmapOffset, [handle, pad, offset]),
        layout!("drm_refgpu_sync", u::Sync, [handle, flags, point]),
        layout!("drm_refgpu_vm_bind_op", u::VmBindOp, [op, flags, handle, pad, bo_offset, va, size]),
        layout!(
            "drm_refgpu_vm_bind",
            u::VmBind,
            [flags, op_count, in_sync_count, out_sync_count, ops, in_syncs, out_syncs]
        ),
        layout!("drm_refgpu_ctx_create", u::CtxCreate, [engine, flags, ctx_id, pad]),
        layout!("drm_refgpu_ctx_destroy", u::CtxDestroy, [ctx_id, pad]),
        layout!(
            "drm_refgpu_submit",
            u::Submit,
            [
                ctx_id,
                flags,
                ib_va,
                ib_size_dw,
                in_sync_count,
                out_sync_count,
                out_fence_fd,
                in_syncs,
                out_syncs,
                seqno
            ]
        ),
        layout!("drm_refgpu_obj_array", u::ObjArray, [stride, count, array]),
        layout!("drm_refgpu_batch_sync", u::BatchSync, [handle, flags, point]),
        layout!("drm_refgpu_batch_job", u::BatchJob, [flags, ib_size_dw, ib_va, in_syncs, out_syncs]),
        layout!(
            "drm_refgpu_submit_batch",
            u::SubmitBatch,
            [ctx_id, flags, jobs, first_seqno, error_index, pad]
        ),
        layout!(
            "drm_refgpu_ctx_query",
            u::CtxQuery,
            [ctx_id, state, engine, pad, reset_count, fault_status, fault_addr, guilty_seqno]
        ),
    ]
}

fn constants() -> Vec<(&'static str, u64)> {
    vec![
        ("DRM_IOCTL_REFGPU_GET_PARAM", u::DRM_IOCTL_REFGPU_GET_PARAM.into()),
        ("DRM_IOCTL_REFGPU_BO_CREATE", u::DRM_IOCTL_REFGPU_BO_CREATE.into()),
        ("DRM_IOCTL_REFGPU_BO_MMAP_OFFSET", u::DRM_IOCTL_REFGPU_BO_MMAP_OFFSET.into()),
        ("DRM_IOCTL_REFGPU_VM_BIND", u::DRM_IOCTL_REFGPU_VM_BIND.into()),
        ("DRM_IOCTL_REFGPU_CTX_CREATE", u::DRM_IOCTL_REFGPU_CTX_CREATE.into()),
        ("DRM_IOCTL_REFGPU_CTX_DESTROY", u::DRM_IOCTL_REFGPU_CTX_DESTROY.into()),
        ("DRM_IOCTL_REFGPU_SUBMIT", u::DRM_IOCTL_REFGPU_SUBMIT.into()),
        ("DRM_IOCTL_REFGPU_CTX_QUERY", u::DRM_IOCTL_REFGPU_CTX_QUERY.into()),
        ("DRM_IOCTL_REFGPU_SUBMIT_BATCH", u::DRM_IOCTL_REFGPU_SUBMIT_BATCH.into()),
        ("REFGPU_ENGINE_GFX", u::engine::GFX.into()),
        ("REFGPU_ENGINE_COMPUTE", u::engine::COMPUTE.into()),
        ("REFGPU_ENGINE_COPY", u::engine::COPY.into()),
        ("REFGPU_ENGINE_COUNT", u::engine::COUNT.into()),
        ("REFGPU_PARAM_CHIP_ID", u::param::CHIP_ID.into()),
        ("REFGPU_PARAM_GENERATION", u::param::GENERATION.into()),
        ("REFGPU_PARAM_ENGINE_COUNT", u::param::ENGINE_COUNT.into()),
        ("REFGPU_PARAM_VA_START", u::param::VA_START.into()),
        ("REFGPU_PARAM_VA_END", u::param::VA_END.into()),
        ("REFGPU_PARAM_IB_MAX_DWORDS", u::param::IB_MAX_DWORDS.into()),
        ("REFGPU_PARAM_IB_ALIGN", u::param::IB_ALIGN.into()),
        ("REFGPU_PARAM_VA_BITS", u::param::VA_BITS.into()),
        ("REFGPU_PARAM_PAGE_SIZE", u::param::PAGE_SIZE.into()),
        ("REFGPU_PARAM_MAX_BIND_OPS", u::param::MAX_BIND_OPS.into()),
        ("REFGPU_PARAM_MAX_SYNCS", u::param::MAX_SYNCS.into()),
        ("REFGPU_PARAM_JOB_TIMEOUT_MS", u::param::JOB_TIMEOUT_MS.into()),
        ("REFGPU_PARAM_MAX_BATCH_JOBS", u::param::MAX_BATCH_JOBS.into()),
        ("REFGPU_BATCH_SYNC_BINARY", u::batch_sync::BINARY.into()),
        ("REFGPU_BATCH_SYNC_TIMELINE", u::batch_sync::TIMELINE.into()),
        ("REFGPU_BATCH_SYNC_TYPE_MASK", u::batch_sync::TYPE_MASK.into()),
        ("REFGPU_BATCH_NO_INDEX", u::BATCH_NO_INDEX.into()),
        ("REFGPU_BO_NO_CPU_MAPPING", u::BO_NO_CPU_MAPPING.into()),
        ("REFGPU_BO_GPU_READ_ONLY", u::BO_GPU_READ_ONLY.into()),
        ("REFGPU_BO_FLAGS_MASK", u::BO_FLAGS_MASK.into()),
        ("REFGPU_VM_BIND_OP_MAP", u::VM_BIND_OP_MAP.into()),
        ("REFGPU_VM_BIND_OP_UNMAP", u::VM_BIND_OP_UNMAP.into()),
        ("REFGPU_VM_BIND_READ_ONLY", u::VM_BIND_READ_ONLY.into()),
        ("REFGPU_VM_BIND_OP_FLAGS_MASK", u::VM_BIND_OP_FLAGS_MASK.into()),
        ("REFGPU_SUBMIT_OUT_SYNC_FILE", u::SUBMIT_OUT_SYNC_FILE.into()),
        ("REFGPU_SUBMIT_FLAGS_MASK", u::SUBMIT_FLAGS_MASK.into()),
        ("REFGPU_CTX_STATE_OK", u::ctx_state::OK.into()),
        ("REFGPU_CTX_STATE_INNOCENT", u::ctx_state::INNOCENT.into()),
        ("REFGPU_CTX_STATE_GUILTY", u::ctx_state::GUILTY.into()),
        ("REFGPU_CTX_STATE_DEVICE_LOST", u::ctx_state::DEVICE_LOST.into()),
    ]
}

fn rust_values() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (name, size, fields) in structs() {
        m.insert(format!("sizeof {name}"), size as u64);
        for (f, off) in fields {
            m.insert(format!("offsetof {name}.{f}"), off as u64);
        }
    }
    for (name, v) in constants() {
        m.insert(name.to_string(), v);
    }
    m
}

fn c_program() -> String {
    let mut s = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"refgpu_drm.h\"\nint main(void) {\n",
    );
    for (name, _, fields) in structs() {
        s += &format!("printf(\"sizeof {name} %zu\\n\", sizeof(struct {name}));\n");
        for (f, _) in fields {
            s += &format!("printf(\"offsetof {name}.{f} %zu\\n\", offsetof(struct {name}, {f}));\n");
            s += &format!("printf(\"fieldsize {name}.{f} %zu\\n\", sizeof(((struct {name} *)0)->{f}));\n");
        }
    }
    for (name, _) in constants() {
        s += &format!("printf(\"{name} %llu\\n\", (unsigned long long)({name}));\n");
    }
    s += "return 0;\n}\n";
    s
}

/// Compiles and runs the C program; its output as key -> value.
fn c_values() -> BTreeMap<String, u64> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header_dir = root.join("../kmd/include/uapi");
    let shim_dir = root.join("tests/c");
    let dir = tempdir();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(&header_dir)
        .arg("-I")
        .arg(&shim_dir)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e} (install gcc: apt-get install gcc)"));
    assert!(out.status.success(), "compiling the header failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().expect("running the layout program");
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("key value");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect()
}

fn tempdir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "refgpu-uapi-layout-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn rust_mirror_matches_the_c_header() {
    let c: BTreeMap<String, u64> =
        c_values().into_iter().filter(|(k, _)| !k.starts_with("fieldsize ")).collect();
    let rust = rust_values();
    assert_eq!(c.len(), rust.len(), "every entry printed once");
    let diffs: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: rust {v} (hex {v:#x}), C {:?}", c.get(k)))
        .collect();
    assert!(diffs.is_empty(), "Rust and C disagree:\n{}", diffs.join("\n"));
}

#[test]
fn structures_have_no_implicit_padding() {
    // Every byte of each C structure belongs to a named field (the header
    // makes padding explicit, so userspace can zero it).
    let c = c_values();
    for (name, size, fields) in structs() {
        let sum: u64 = fields.iter().map(|(f, _)| c[&format!("fieldsize {name}.{f}")]).sum();
        assert_eq!(sum, size as u64, "{name}: fields cover {sum} of {size} bytes");
    }
}

//! The guest suite. Each test returns `Err(reason)` on failure; the order
//! is `linux_tests::guest_tests`.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, CompareOp, Payload};

use crate::drm::{self, map_op, sync, unmap_op, Dev};
use crate::ensure;
use crate::fixture::{self, buf, expect_errno, live, Fx, DATA_VA};
use crate::R;

const EINVAL: i32 = libc::EINVAL;
const ENOENT: i32 = libc::ENOENT;

/// A named test.
pub type Test = (&'static str, fn() -> R);

/// The suite for kernel `kind`, in order (`linux_tests::guest_tests`): on
/// the debug kernel, `failslab_ioctls` before the GPU's removal
/// (`linux_tests::REMOVES_GPU`) and `kmemleak_clean` before the last test.
pub fn all(kind: linux_tests::KernelKind) -> Vec<Test> {
    let mut v: Vec<Test> = vec![
        ("get_param", get_param),
        ("version_ioctl", version_ioctl),
        ("unknown_ioctl", unknown_ioctl),
        ("bo_create_errors", bo_create_errors),
        ("bo_mmap_write_read", bo_mmap_write_read),
        ("bo_no_cpu_mapping", bo_no_cpu_mapping),
        ("bo_mmap_offset_errors", bo_mmap_offset_errors),
        ("vm_bind_errors", vm_bind_errors),
        ("vm_bind_overlap", vm_bind_overlap),
        ("vm_bind_read_only_bo", vm_bind_read_only_bo),
        ("vm_bind_batch_atomic", vm_bind_batch_atomic),
        ("vm_bind_unmap_split", vm_bind_unmap_split),
        ("vm_bind_frees_page_tables", crate::vm_tables::vm_bind_frees_page_tables),
        ("vm_bind_table_limit", crate::vm_tables::vm_bind_table_limit),
        ("vm_bind_charges_page_tables", crate::vm_tables::vm_bind_charges_page_tables),
        ("ctx_errors", ctx_errors),
        ("submit_errors", submit_errors),
        ("submit_batch_errors", crate::batch::submit_batch_errors),
        ("submit_batch_runs", crate::batch::submit_batch_runs),
        ("syncobj_errors", syncobj_errors),
        ("copy_fill_write_data", copy_fill_write_data),
        ("timeline_wait", timeline_wait),
        ("cross_engine_order", cross_engine_order),
        ("sync_file_out", sync_file_out),
        ("sync_file_failure_queues_nothing", sync_file_failure_queues_nothing),
        ("vm_bind_syncs", vm_bind_syncs),
        ("read_only_mapping_faults", read_only_mapping_faults),
        ("isolation_two_files", isolation_two_files),
        ("isolation_two_processes", isolation_two_processes),
        ("prime_share", prime_share),
        ("hang_recovery", hang_recovery),
        ("devcoredump", devcoredump),
        ("fault_recovery", fault_recovery),
        ("fdinfo_engine_time", crate::fdinfo::fdinfo_engine_time),
        ("fdinfo_memory", crate::fdinfo::fdinfo_memory),
        ("fdinfo_file_closed_mid_job", crate::fdinfo::fdinfo_file_closed_mid_job),
        ("reset_resumes_innocent_jobs", crate::recovery::reset_resumes_innocent_jobs),
        ("progressing_job_outlives_timeout", crate::recovery::progressing_job_outlives_timeout),
        ("job_max_ms_bound", crate::recovery::job_max_ms_bound),
        ("forged_fence_fill", crate::hostile::forged_fence_fill),
        ("forged_fence_wait", crate::hostile::forged_fence_wait),
        ("fault_racing_submits", crate::hostile::fault_racing_submits),
        ("teardown_killed_process", teardown_killed_process),
        ("submit_racing_ctx_destroy", submit_racing_ctx_destroy),
        ("conformance_kernel_mode", crate::kernel_mode::conformance_kernel_mode),
        ("conformance_kernel_mode_validation", crate::kernel_mode::conformance_kernel_mode_validation),
        (
            "kernel_mode_sync_files_and_reset_status",
            crate::kernel_mode::kernel_mode_sync_files_and_reset_status,
        ),
        ("dma_overrun_walk", crate::debugging::dma_overrun_walk),
        ("tracepoints_follow_a_job", crate::tracing::tracepoints_follow_a_job),
        ("tracepoints_name_resets", crate::tracing::tracepoints_name_resets),
        ("bench_submit_vs_null_ioctl", bench_submit_vs_null_ioctl),
        ("bench_wait_syncobj_vs_poll", bench_wait_syncobj_vs_poll),
        ("bench_vm_bind_batched", bench_vm_bind_batched),
        ("bench_umd_submit_kernel_vs_direct", crate::kernel_mode::bench_umd_submit_kernel_vs_direct),
        ("bench_submit_batch", crate::batch::bench_submit_batch),
        ("bench_ib_sweep_kernel_mode", crate::kernel_mode::bench_ib_sweep_kernel_mode),
        ("bench_umd_batch_window", crate::kernel_mode::bench_umd_batch_window),
        ("module_reload", crate::unplug::module_reload),
        ("lost_device_keeps_memory", crate::unplug::lost_device_keeps_memory),
        ("unbind_with_open_file", crate::unplug::unbind_with_open_file),
        ("surprise_removal", crate::unplug::surprise_removal),
        ("kmsg_clean", kmsg_clean),
    ];
    if kind == linux_tests::KernelKind::Debug {
        let removal = v.iter().position(|(name, _)| *name == linux_tests::REMOVES_GPU).unwrap_or(v.len());
        v.insert(removal, ("failslab_ioctls", crate::debug_kernel::failslab_ioctls));
        let last = v.pop();
        v.push(("kmemleak_clean", crate::debug_kernel::kmemleak_clean));
        v.extend(last);
    }
    v
}

fn open() -> Result<Dev, String> {
    Dev::open().map_err(|e| format!("open {:?}: errno {e}", drm::render_node()))
}

fn ok<T>(r: Result<T, i32>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: errno {e}"))
}

/// A WRITE_DATA command of `data` at `dst`.
pub fn write_data(dst: u64, data: &[u32]) -> Command<'_> {
    Command::WriteData { dst, data: Payload::Words(data) }
}

/// WAIT_MEM until the 32-bit value at `addr` equals `value`.
pub fn wait_eq(addr: u64, value: u32) -> Command<'static> {
    Command::WaitMem { addr, reference: u64::from(value), mask: 0xFFFF_FFFF, op: CompareOp::Eq, wide: false }
}

// ----- uAPI basics

fn get_param() -> R {
    let d = open()?;
    let id = ok(d.param(u::param::CHIP_ID), "CHIP_ID")?;
    let gen = ok(d.param(u::param::GENERATION), "GENERATION")?;
    ensure!(id >> 16 == 0x5247, "CHIP_ID {id:#x} lacks the RG magic");
    ensure!((id >> 8) & 0xFF == gen, "GENERATION {gen} != ID bits 15:8 of {id:#x}");
    if let Some(want) = fixture::expected_gen() {
        ensure!(gen == u64::from(want), "generation {gen}, the harness booted gen{want}");
    }
    ensure!(ok(d.param(u::param::ENGINE_COUNT), "ENGINE_COUNT")? == 3, "ENGINE_COUNT");
    let (start, end) =
        (ok(d.param(u::param::VA_START), "VA_START")?, ok(d.param(u::param::VA_END), "VA_END")?);
    let bits = ok(d.param(u::param::VA_BITS), "VA_BITS")?;
    let (want_bits, want_max, want_align) = if gen == 1 { (40, 262_144, 4) } else { (48, 4_194_304, 32) };
    ensure!(bits == want_bits, "VA_BITS {bits}");
    ensure!(start > 0 && start < end && end < 1 << bits, "VA range [{start:#x}, {end:#x})");
    ensure!(ok(d.param(u::param::IB_MAX_DWORDS), "IB_MAX")? == want_max, "IB_MAX_DWORDS");
    ensure!(ok(d.param(u::param::IB_ALIGN), "IB_ALIGN")? == want_align, "IB_ALIGN");
    ensure!(ok(d.param(u::param::PAGE_SIZE), "PAGE_SIZE")? == 4096, "PAGE_SIZE");
    ensure!(ok(d.param(u::param::MAX_BIND_OPS), "MAX_BIND_OPS")? >= 1000, "MAX_BIND_OPS");
    ensure!(ok(d.param(u::param::MAX_SYNCS), "MAX_SYNCS")? == 64, "MAX_SYNCS");
    ensure!(ok(d.param(u::param::JOB_TIMEOUT_MS), "JOB_TIMEOUT_MS")? == 1000, "JOB_TIMEOUT_MS");
    expect_errno(d.param(999), EINVAL, "unknown param")?;
    let mut a = u::GetParam { param: u::param::CHIP_ID, pad: 1, value: 0 };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_GET_PARAM, &mut a), EINVAL, "nonzero pad")?;
    Ok(())
}

fn version_ioctl() -> R {
    let d = open()?;
    let (v, name) = ok(d.version(), "VERSION")?;
    ensure!(name == "refgpu", "driver name {name:?}");
    ensure!(v.major == 1, "major {}", v.major);
    Ok(())
}

fn unknown_ioctl() -> R {
    let d = open()?;
    let mut a = u::GetParam::default();
    let req = u::drm_iowr::<u::GetParam>(0x20);
    expect_errno(d.ioctl(req, &mut a), EINVAL, "driver ioctl 0x20")?;
    // A known number with the wrong size still works on the common prefix
    // (DRM core semantics), so only the number is checked here.
    Ok(())
}

// ----- buffer objects

fn bo_create_errors() -> R {
    let d = open()?;
    let before = live()?;
    expect_errno(d.bo_create(0, 0), EINVAL, "size 0")?;
    expect_errno(d.bo_create(4097, 0), EINVAL, "unaligned size")?;
    expect_errno(d.bo_create(100, 0), EINVAL, "size 100")?;
    expect_errno(d.bo_create(4096, 1 << 7), EINVAL, "unknown flag")?;
    expect_errno(d.bo_create(1 << 50, 0), libc::E2BIG, "size 1 PiB")?;
    ensure!(live()? == before, "failed creates changed the counts: {before:?} -> {:?}", live()?);
    let h = ok(d.bo_create(4096, u::BO_FLAGS_MASK), "all flags")?;
    ensure!(live()?[0] == before[0] + 1, "one more BO");
    ok(d.gem_close(h), "GEM_CLOSE")?;
    ensure!(live()? == before, "GEM_CLOSE freed it");
    Ok(())
}

fn bo_mmap_write_read() -> R {
    let d = open()?;
    let h = ok(d.bo_create(64 << 10, 0), "BO_CREATE")?;
    let off = ok(d.mmap_offset(h), "MMAP_OFFSET")?;
    ensure!(off != 0 && off % 4096 == 0, "offset {off:#x}");
    ensure!(ok(d.mmap_offset(h), "MMAP_OFFSET again")? == off, "offset is stable");
    {
        let m = ok(d.mmap(off, 64 << 10), "mmap")?;
        for i in 0..(16 << 10) {
            m.w32(4 * i, (i as u32) ^ 0xA5A5_0000);
        }
        let m2 = ok(d.mmap(off, 64 << 10), "second mmap")?;
        for i in 0..(16 << 10) {
            ensure!(m2.r32(4 * i) == (i as u32) ^ 0xA5A5_0000, "word {i} through the second mapping");
        }
    }
    ok(d.gem_close(h), "GEM_CLOSE")?;
    expect_errno(d.gem_close(h), EINVAL, "GEM_CLOSE twice")?;
    expect_errno(d.mmap_offset(h), ENOENT, "MMAP_OFFSET of a closed handle")?;
    Ok(())
}

fn bo_no_cpu_mapping() -> R {
    let d = open()?;
    let h = ok(d.bo_create(8192, u::BO_NO_CPU_MAPPING), "BO_CREATE")?;
    expect_errno(d.mmap_offset(h), libc::EPERM, "MMAP_OFFSET of a NO_CPU_MAPPING BO")?;
    // Nor through its dma-buf.
    let fd = ok(d.prime_export(h), "PRIME export")?;
    expect_errno(drm::map_fd(fd.as_raw_fd(), 0, 8192).map(|_| ()), libc::EPERM, "mmap of its dma-buf")?;
    // The GPU may still use it.
    ok(d.map(h, 0, 0x3000_0000, 8192, 0), "VM_BIND of a NO_CPU_MAPPING BO")?;
    ok(d.gem_close(h), "GEM_CLOSE")?;
    Ok(())
}

fn bo_mmap_offset_errors() -> R {
    let d = open()?;
    expect_errno(d.mmap_offset(0), ENOENT, "handle 0")?;
    expect_errno(d.mmap_offset(12345), ENOENT, "unknown handle")?;
    let h = ok(d.bo_create(4096, 0), "BO_CREATE")?;
    let mut a = u::BoMmapOffset { handle: h, pad: 1, offset: 0 };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_BO_MMAP_OFFSET, &mut a), EINVAL, "nonzero pad")?;
    // An offset past the object is refused by mmap.
    let off = ok(d.mmap_offset(h), "MMAP_OFFSET")?;
    ensure!(d.mmap(off, 8192).is_err(), "mmap larger than the BO succeeded");
    Ok(())
}

// ----- VM_BIND

fn vm_bind_errors() -> R {
    let d = open()?;
    let start = ok(d.param(u::param::VA_START), "VA_START")?;
    let end = ok(d.param(u::param::VA_END), "VA_END")?;
    let h = ok(d.bo_create(64 << 10, 0), "BO_CREATE")?;
    let va = 0x4000_0000u64;
    let m = |bo_offset, va, size| map_op(h, bo_offset, va, size, 0);
    let cases: Vec<(&str, u::VmBindOp, i32)> = vec![
        ("unaligned va", m(0, va + 8, 4096), EINVAL),
        ("unaligned size", m(0, va, 4095), EINVAL),
        ("unaligned bo_offset", m(12, va, 4096), EINVAL),
        ("zero size", m(0, va, 0), EINVAL),
        ("below VA_START", m(0, start - 4096, 8192), EINVAL),
        ("past VA_END", m(0, end - 4096, 8192), EINVAL),
        ("va + size overflows", m(0, u64::MAX - 4095, 8192), EINVAL),
        ("past the end of the BO", m(60 << 10, va, 8192), EINVAL),
        ("bo_offset + size overflows", m(u64::MAX - 4095, va, 8192), EINVAL),
        ("unknown handle", map_op(777, 0, va, 4096, 0), ENOENT),
        ("handle 0", map_op(0, 0, va, 4096, 0), ENOENT),
        ("unknown op", u::VmBindOp { op: 7, ..m(0, va, 4096) }, EINVAL),
        ("unknown flag", u::VmBindOp { flags: 1 << 3, ..m(0, va, 4096) }, EINVAL),
        ("nonzero pad", u::VmBindOp { pad: 1, ..m(0, va, 4096) }, EINVAL),
        ("unmap with a handle", u::VmBindOp { handle: h, ..unmap_op(va, 4096) }, EINVAL),
        ("unmap with flags", u::VmBindOp { flags: 1, ..unmap_op(va, 4096) }, EINVAL),
        ("unmap with bo_offset", u::VmBindOp { bo_offset: 4096, ..unmap_op(va, 4096) }, EINVAL),
        ("unmap unaligned", unmap_op(va + 4, 4096), EINVAL),
        ("unmap zero size", unmap_op(va, 0), EINVAL),
        ("unmap past VA_END", unmap_op(end, 4096), EINVAL),
    ];
    for (what, op, errno) in cases {
        expect_errno(d.vm_bind(&[op]), errno, what)?;
    }
    let good = [m(0, va, 4096)];
    let mut a = u::VmBind { flags: 1, op_count: 1, ops: good.as_ptr() as u64, ..Default::default() };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a), EINVAL, "VM_BIND flags")?;
    let mut a = u::VmBind { op_count: 0, ops: good.as_ptr() as u64, ..Default::default() };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a), EINVAL, "op_count 0")?;
    let max = ok(d.param(u::param::MAX_BIND_OPS), "MAX_BIND_OPS")? as u32;
    let mut a = u::VmBind { op_count: max + 1, ops: good.as_ptr() as u64, ..Default::default() };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a), EINVAL, "op_count > MAX_BIND_OPS")?;
    let mut a = u::VmBind { op_count: 1, ops: 0x10, ..Default::default() };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a), libc::EFAULT, "bad ops pointer")?;
    let s = ok(d.syncobj(), "SYNCOBJ_CREATE")?;
    expect_errno(d.vm_bind_syncs(&good, &[sync(999, 0)], &[]), ENOENT, "unknown in-sync")?;
    expect_errno(d.vm_bind_syncs(&good, &[], &[sync(999, 0)]), ENOENT, "unknown out-sync")?;
    expect_errno(
        d.vm_bind_syncs(&good, &[u::Sync { handle: s, flags: 2, point: 0 }], &[]),
        EINVAL,
        "sync flags",
    )?;
    expect_errno(d.vm_bind_syncs(&good, &[sync(s, 0)], &[]), EINVAL, "in-sync without a fence")?;
    expect_errno(d.vm_bind_syncs(&good, &[sync(s, 5)], &[]), EINVAL, "unsubmitted timeline point")?;
    let many = vec![sync(s, 0); 65];
    expect_errno(d.vm_bind_syncs(&good, &[], &many), EINVAL, "65 out-syncs")?;
    let mut a = u::VmBind {
        op_count: 1,
        ops: good.as_ptr() as u64,
        in_sync_count: 1,
        in_syncs: 0x10,
        ..Default::default()
    };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a), libc::EFAULT, "bad in-sync pointer")?;
    let mut a = u::VmBind {
        op_count: 1,
        ops: good.as_ptr() as u64,
        out_sync_count: u32::MAX,
        out_syncs: many.as_ptr() as u64,
        ..Default::default()
    };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_VM_BIND, &mut a), EINVAL, "out_sync_count u32::MAX")?;
    // Nothing above changed the VM: the range is still free.
    ok(d.vm_bind(&good), "the same map, valid")?;
    Ok(())
}

fn vm_bind_overlap() -> R {
    let d = open()?;
    let h = ok(d.bo_create(64 << 10, 0), "BO_CREATE")?;
    let va = 0x4000_0000u64;
    ok(d.map(h, 0, va, 16 << 10, 0), "map")?;
    expect_errno(d.map(h, 0, va, 16 << 10, 0), libc::EEXIST, "the same range")?;
    expect_errno(d.map(h, 0, va + (12 << 10), 8 << 10, 0), libc::EEXIST, "overlapping the end")?;
    expect_errno(d.map(h, 0, va - 4096, 8 << 10, 0), libc::EEXIST, "overlapping the start")?;
    expect_errno(d.map(h, 0, va - 4096, 32 << 10, 0), libc::EEXIST, "covering it")?;
    ok(d.map(h, 0, va + (16 << 10), 4096, 0), "adjacent after")?;
    ok(d.map(h, 0, va - 4096, 4096, 0), "adjacent before")?;
    // Unmap + map of the same range in one call.
    ok(d.vm_bind(&[unmap_op(va, 16 << 10), map_op(h, 4096, va, 16 << 10, 0)]), "unmap then map")?;
    // Map, then an overlapping map in the same call.
    let va2 = 0x5000_0000u64;
    expect_errno(
        d.vm_bind(&[map_op(h, 0, va2, 8192, 0), map_op(h, 0, va2 + 4096, 8192, 0)]),
        libc::EEXIST,
        "two overlapping maps in one call",
    )?;
    ok(d.map(h, 0, va2, 16 << 10, 0), "the failed call left the range free")?;
    // Unmapping a free range succeeds (nothing to do).
    ok(d.unmap(0x6000_0000, 4096), "unmap of a free range")?;
    Ok(())
}

fn vm_bind_read_only_bo() -> R {
    let d = open()?;
    let h = ok(d.bo_create(8192, u::BO_GPU_READ_ONLY), "BO_CREATE")?;
    expect_errno(d.map(h, 0, 0x4000_0000, 8192, 0), libc::EACCES, "writable map of a GPU_READ_ONLY BO")?;
    ok(d.map(h, 0, 0x4000_0000, 8192, u::VM_BIND_READ_ONLY), "read-only map")?;
    Ok(())
}

fn vm_bind_batch_atomic() -> R {
    let d = open()?;
    let h = ok(d.bo_create(64 << 10, 0), "BO_CREATE")?;
    let (x, y) = (0x4000_0000u64, 0x4100_0000u64);
    expect_errno(
        d.vm_bind(&[map_op(h, 0, x, 4096, 0), map_op(4242, 0, y, 4096, 0)]),
        ENOENT,
        "second op's handle",
    )?;
    expect_errno(d.vm_bind(&[map_op(h, 0, x, 4096, 0), map_op(h, 0, y, 3, 0)]), EINVAL, "second op's size")?;
    ok(d.vm_bind(&[map_op(h, 0, x, 4096, 0), map_op(h, 4096, y, 4096, 0)]), "both ops, valid")?;
    Ok(())
}

fn vm_bind_unmap_split() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let h = ok(fx.dev.bo_create(16 << 10, 0), "BO_CREATE")?;
    let off = ok(fx.dev.mmap_offset(h), "MMAP_OFFSET")?;
    let m = ok(fx.dev.mmap(off, 16 << 10), "mmap")?;
    let va = 0x4000_0000u64;
    ok(fx.dev.map(h, 0, va, 16 << 10, 0), "map 4 pages")?;
    ok(fx.dev.unmap(va + 4096, 4096), "unmap page 1")?;
    // Page 1 is free again: map another BO there.
    let h2 = ok(fx.dev.bo_create(4096, 0), "BO_CREATE 2")?;
    let off2 = ok(fx.dev.mmap_offset(h2), "MMAP_OFFSET 2")?;
    let m2 = ok(fx.dev.mmap(off2, 4096), "mmap 2")?;
    ok(fx.dev.map(h2, 0, va + 4096, 4096, 0), "map into the hole")?;
    let p = fx.run(
        ctx,
        &[
            write_data(va, &[0x1111]),
            write_data(va + 4096, &[0x2222]),
            write_data(va + 2 * 4096, &[0x3333]),
            write_data(va + 3 * 4096 + 8, &[0x4444]),
        ],
    )?;
    fx.wait(p)?;
    ensure!(m.r32(0) == 0x1111, "page 0: {:#x}", m.r32(0));
    ensure!(m.r32(4096) == 0, "page 1 of the first BO was written");
    ensure!(m2.r32(0) == 0x2222, "the hole maps the second BO: {:#x}", m2.r32(0));
    ensure!(m.r32(2 * 4096) == 0x3333, "page 2: {:#x}", m.r32(2 * 4096));
    ensure!(m.r32(3 * 4096 + 8) == 0x4444, "page 3: {:#x}", m.r32(3 * 4096 + 8));
    ensure!(fx.dev.ctx_query(ctx).map(|q| q.state) == Ok(u::ctx_state::OK), "context state");
    Ok(())
}

// ----- contexts and submit

fn ctx_errors() -> R {
    let d = open()?;
    expect_errno(d.ctx_create(3), EINVAL, "engine 3")?;
    let mut a = u::CtxCreate { engine: 0, flags: 1, ..Default::default() };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_CTX_CREATE, &mut a), EINVAL, "flags")?;
    let mut a = u::CtxCreate { engine: 0, pad: 1, ..Default::default() };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_CTX_CREATE, &mut a), EINVAL, "pad")?;
    expect_errno(d.ctx_destroy(0), ENOENT, "destroy 0")?;
    expect_errno(d.ctx_destroy(99), ENOENT, "destroy unknown")?;
    let mut a = u::CtxDestroy { ctx_id: 1, pad: 1 };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_CTX_DESTROY, &mut a), EINVAL, "destroy pad")?;
    expect_errno(d.ctx_query(5), ENOENT, "query unknown")?;
    let before = live()?;
    let mut ids = Vec::new();
    for i in 0..64 {
        ids.push(ok(d.ctx_create(i % 3), "CTX_CREATE")?);
    }
    expect_errno(d.ctx_create(0), libc::EBUSY, "65th context")?;
    ensure!(live()?[2] == before[2] + 64, "64 contexts live");
    let q = ok(d.ctx_query(ids[4]), "CTX_QUERY")?;
    ensure!(q.engine == 1 && q.state == u::ctx_state::OK, "query {q:?}");
    for id in &ids {
        ok(d.ctx_destroy(*id), "CTX_DESTROY")?;
    }
    expect_errno(d.ctx_destroy(ids[0]), ENOENT, "destroy twice")?;
    ensure!(live()? == before, "counts back: {before:?} -> {:?}", live()?);
    Ok(())
}

fn submit_errors() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::GFX)?;
    let (ib, dw) = fx.ib(&[Command::Nop { dwords: 0 }])?;
    let start = ok(fx.dev.param(u::param::VA_START), "VA_START")?;
    let end = ok(fx.dev.param(u::param::VA_END), "VA_END")?;
    let max = ok(fx.dev.param(u::param::IB_MAX_DWORDS), "IB_MAX")? as u32;
    let align = ok(fx.dev.param(u::param::IB_ALIGN), "IB_ALIGN")?;
    let d = &fx.dev;
    let before = live()?;
    let s = fx.sync;
    let sub = |ctx, va, n, ins: &[u::Sync], outs: &[u::Sync], flags| {
        d.submit_full(ctx, va, n, ins, outs, flags).map(|_| ())
    };
    expect_errno(sub(99, ib, dw, &[], &[], 0), ENOENT, "unknown context")?;
    expect_errno(sub(0, ib, dw, &[], &[], 0), ENOENT, "context 0")?;
    expect_errno(sub(ctx, ib, 0, &[], &[], 0), EINVAL, "zero size")?;
    expect_errno(sub(ctx, ib, max + 1, &[], &[], 0), EINVAL, "size over IB_MAX_DWORDS")?;
    expect_errno(sub(ctx, ib + 2, dw, &[], &[], 0), EINVAL, "misaligned by 2")?;
    if align > 4 {
        expect_errno(sub(ctx, ib + 4, dw, &[], &[], 0), EINVAL, "4-byte aligned IB on gen2 (32 needed)")?;
    }
    expect_errno(sub(ctx, start - 64, 4, &[], &[], 0), EINVAL, "below VA_START")?;
    expect_errno(sub(ctx, end - 64, 32, &[], &[], 0), EINVAL, "crossing VA_END")?;
    expect_errno(sub(ctx, u64::MAX - 63, 32, &[], &[], 0), EINVAL, "address overflow")?;
    expect_errno(sub(ctx, ib, dw, &[], &[], 1 << 4), EINVAL, "unknown flag")?;
    expect_errno(sub(ctx, ib, dw, &[sync(999, 0)], &[], 0), ENOENT, "unknown in-sync")?;
    expect_errno(sub(ctx, ib, dw, &[], &[sync(999, 1)], 0), ENOENT, "unknown out-sync")?;
    expect_errno(
        sub(ctx, ib, dw, &[u::Sync { handle: s, flags: 1, point: 0 }], &[], 0),
        EINVAL,
        "sync flags",
    )?;
    expect_errno(sub(ctx, ib, dw, &[sync(s, 100)], &[], 0), EINVAL, "unsubmitted timeline point")?;
    expect_errno(sub(ctx, ib, dw, &vec![sync(s, 0); 65], &[], 0), EINVAL, "65 in-syncs")?;
    let mut a = u::Submit {
        ctx_id: ctx,
        ib_va: ib,
        ib_size_dw: dw,
        in_sync_count: 1,
        in_syncs: 8,
        out_fence_fd: -1,
        ..Default::default()
    };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_SUBMIT, &mut a), libc::EFAULT, "bad in-sync pointer")?;
    let outs = [sync(s, 0)];
    let mut a = u::Submit {
        ctx_id: ctx,
        ib_va: ib,
        ib_size_dw: dw,
        out_sync_count: u32::MAX,
        out_syncs: outs.as_ptr() as u64,
        out_fence_fd: -1,
        ..Default::default()
    };
    expect_errno(d.ioctl(u::DRM_IOCTL_REFGPU_SUBMIT, &mut a), EINVAL, "out_sync_count u32::MAX")?;
    ensure!(live()? == before, "failed submits left jobs: {before:?} -> {:?}", live()?);
    // And a valid one still works.
    let p = fx.run(ctx, &[Command::Nop { dwords: 3 }])?;
    fx.wait(p)?;
    Ok(())
}

fn syncobj_errors() -> R {
    let d = open()?;
    expect_errno(d.wait_point(4444, 1, 1_000_000), ENOENT, "TIMELINE_WAIT on an unknown handle")?;
    expect_errno(d.syncobj_destroy(4444), EINVAL, "SYNCOBJ_DESTROY of an unknown handle")?;
    let s = ok(d.syncobj(), "SYNCOBJ_CREATE")?;
    // A point nobody will signal: the wait times out.
    expect_errno(d.wait_point(s, 1, 10_000_000), libc::ETIME, "wait for an unsignalled point")?;
    ok(d.syncobj_destroy(s), "SYNCOBJ_DESTROY")?;
    Ok(())
}

// ----- functional

fn copy_fill_write_data() -> R {
    let mut fx = Fx::new()?;
    for engine in [u::engine::COPY, u::engine::GFX, u::engine::COMPUTE] {
        let ctx = fx.ctx(engine)?;
        let base = DATA_VA + 0x1_0000 * u64::from(engine);
        let off = (base - DATA_VA) as usize;
        let p = fx.run(
            ctx,
            &[
                Command::Fill { dst: base, size: 4096, value: 0x5A5A_0000 | engine },
                write_data(base + 4096, &[1, 2, 3, 4]),
                Command::Copy { src: base + 4096, dst: base + 8192 + 4, size: 16 },
            ],
        )?;
        fx.wait(p)?;
        let m = &fx.data.map;
        for i in 0..1024 {
            ensure!(
                m.r32(off + 4 * i) == 0x5A5A_0000 | engine,
                "engine {engine}: FILL word {i}: {:#x}",
                m.r32(off + 4 * i)
            );
        }
        let got: Vec<u32> = (0..4).map(|i| m.r32(off + 8192 + 4 + 4 * i)).collect();
        ensure!(got == [1, 2, 3, 4], "engine {engine}: DMA_COPY of WRITE_DATA: {got:?}");
        ensure!(m.r32(off + 8192) == 0, "engine {engine}: copy wrote before its destination");
    }
    Ok(())
}

fn timeline_wait() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let first = fx.point + 1;
    for i in 0..8u32 {
        fx.run(ctx, &[write_data(DATA_VA + 4 * u64::from(i), &[100 + i])])?;
    }
    fx.wait(fx.point)?;
    for i in 0..8u32 {
        ensure!(fx.data.map.r32(4 * i as usize) == 100 + i, "job {i} did not run");
    }
    let q = ok(fx.dev.query_point(fx.sync), "SYNCOBJ_QUERY")?;
    ensure!(q == fx.point, "timeline at {q}, expected {}", fx.point);
    ensure!(first + 7 == fx.point, "points");
    Ok(())
}

fn cross_engine_order() -> R {
    let mut fx = Fx::new()?;
    let (a, b) = (fx.ctx(u::engine::GFX)?, fx.ctx(u::engine::COMPUTE)?);
    let flag = DATA_VA + 0x100;
    let x = DATA_VA + 0x200;
    let y = DATA_VA + 0x300;
    // A: wait for the CPU's flag, then write X. B (other engine): after A's
    // point, copy X to Y.
    let pa = fx.run(a, &[wait_eq(flag, 1), write_data(x, &[0xC0FFEE])])?;
    let (ib, dw) = fx.ib(&[Command::Copy { src: x, dst: y, size: 4 }])?;
    fx.point += 1;
    let pb = fx.point;
    ok(fx.dev.submit_full(b, ib, dw, &[sync(fx.sync, pa)], &[sync(fx.sync, pb)], 0), "SUBMIT B")?;
    std::thread::sleep(Duration::from_millis(50));
    ensure!(fx.data.map.r32(0x300) == 0, "B ran before A");
    ensure!(fx.dev.wait_point(fx.sync, pb, 0).is_err(), "B's point signalled before A");
    fx.data.map.w32(0x100, 1);
    fx.wait(pb)?;
    ensure!(fx.data.map.r32(0x300) == 0xC0FFEE, "B copied {:#x}, not A's value", fx.data.map.r32(0x300));
    Ok(())
}

fn sync_file_out() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let flag = DATA_VA + 0x40;
    let (ib, dw) = fx.ib(&[wait_eq(flag, 7), write_data(DATA_VA + 0x80, &[9])])?;
    let s = ok(fx.dev.submit_full(ctx, ib, dw, &[], &[], u::SUBMIT_OUT_SYNC_FILE), "SUBMIT")?;
    ensure!(s.out_fence_fd >= 0, "no sync_file fd");
    let fd = s.out_fence_fd;
    ensure!(ok(drm::sync_file_status(fd), "SYNC_IOC_FILE_INFO")? == 0, "active before the flag");
    ensure!(!drm::poll_in(fd, 20), "poll reported signalled too early");
    fx.data.map.w32(0x40, 7);
    ensure!(drm::poll_in(fd, 10_000), "sync_file never signalled");
    ensure!(ok(drm::sync_file_status(fd), "SYNC_IOC_FILE_INFO")? == 1, "signalled without error");
    ensure!(fx.data.map.r32(0x80) == 9, "the job ran");
    // SAFETY: closing the fd the kernel gave us.
    unsafe { libc::close(fd) };
    let s = ok(fx.dev.submit_full(ctx, ib, dw, &[], &[], 0), "SUBMIT without the flag")?;
    ensure!(s.out_fence_fd == -1, "out_fence_fd without the flag: {}", s.out_fence_fd);
    Ok(())
}

/// While it lives, this thread cannot allocate a `struct file`:
/// `fs.file-max` is 0 (the kernel's quick test of the limit reads a
/// per-CPU counter whose global part may still be 0) and CAP_SYS_ADMIN,
/// which bypasses the limit, is out of the thread's effective set
/// (capabilities are per thread).
struct NoFiles {
    file_max: String,
    caps: [CapData; 2],
}

const FILE_MAX: &str = "/proc/sys/fs/file-max";
const CAP_SYS_ADMIN: u32 = 21;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capget(2) (`get`) or capset(2) of this thread, version 3.
fn caps(data: &mut [CapData; 2], get: bool) -> R {
    let mut h = CapHeader { version: 0x2008_0522, pid: 0 };
    let nr = if get { libc::SYS_capget } else { libc::SYS_capset };
    // SAFETY: a version-3 header and its two data words, both live.
    let r = unsafe { libc::syscall(nr, &mut h as *mut CapHeader, data.as_mut_ptr()) };
    ensure!(r == 0, "{}: errno {}", if get { "capget" } else { "capset" }, drm::errno());
    Ok(())
}

impl NoFiles {
    fn new() -> Result<NoFiles, String> {
        let file_max = std::fs::read_to_string(FILE_MAX).map_err(|e| format!("{FILE_MAX}: {e}"))?;
        let mut c = [CapData::default(); 2];
        caps(&mut c, true)?;
        std::fs::write(FILE_MAX, "0").map_err(|e| format!("{FILE_MAX}: {e}"))?;
        let mut dropped = c;
        dropped[0].effective &= !(1 << CAP_SYS_ADMIN);
        let guard = NoFiles { file_max, caps: c };
        caps(&mut dropped, false)?;
        Ok(guard)
    }
}

impl Drop for NoFiles {
    fn drop(&mut self) {
        let _ = caps(&mut self.caps, false);
        let _ = std::fs::write(FILE_MAX, self.file_max.trim());
    }
}

/// A SUBMIT whose sync_file cannot be made fails with ENOMEM before its
/// job is queued: the job never runs, its seqno is not used. (The file of
/// the sync_file is what cannot be allocated here, [`NoFiles`].) Against a
/// driver that made the sync_file after queuing the job, the job ran.
fn sync_file_failure_queues_nothing() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let (ib, dw) = fx.ib(&[write_data(DATA_VA + 0x40, &[1])])?;
    let first = ok(fx.dev.submit_full(ctx, ib, dw, &[], &[], 0), "SUBMIT")?;
    let (ib, dw) = fx.ib(&[write_data(DATA_VA + 0x80, &[0xBAD])])?;
    let r = {
        let _no_files = NoFiles::new()?;
        // The condition holds: no file can be opened.
        let probe = std::fs::File::open("/proc/self/stat").map(|_| ()).map_err(|e| e.raw_os_error());
        let mut c = [CapData::default(); 2];
        caps(&mut c, true)?;
        ensure!(
            probe == Err(Some(libc::ENFILE)),
            "a file opens with fs.file-max at 0: {probe:?} (effective capabilities {:#x})",
            c[0].effective
        );
        fx.dev.submit_full(ctx, ib, dw, &[], &[], u::SUBMIT_OUT_SYNC_FILE)
    };
    expect_errno(r.map(|s| s.seqno), libc::ENOMEM, "SUBMIT with no file for its sync_file")?;
    let (ib, dw) = fx.ib(&[write_data(DATA_VA + 0xC0, &[2])])?;
    fx.point += 1;
    let next = ok(fx.dev.submit_full(ctx, ib, dw, &[], &[sync(fx.sync, fx.point)], 0), "SUBMIT after")?;
    fx.wait(fx.point)?;
    ensure!(fx.data.map.r32(0xC0) == 2, "the job after the failed SUBMIT did not run");
    ensure!(fx.data.map.r32(0x80) == 0, "the failed SUBMIT's job ran");
    ensure!(
        next.seqno == first.seqno + 1,
        "the failed SUBMIT used a seqno: {} then {}",
        first.seqno,
        next.seqno
    );
    Ok(())
}

fn vm_bind_syncs() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::GFX)?;
    let h = ok(fx.dev.bo_create(8192, 0), "BO_CREATE")?;
    // An out point is signalled when the bind returns.
    let s = ok(fx.dev.syncobj(), "SYNCOBJ_CREATE")?;
    ok(
        fx.dev.vm_bind_syncs(&[map_op(h, 0, 0x4000_0000, 8192, 0)], &[], &[sync(s, 3)]),
        "bind with out point",
    )?;
    ok(fx.dev.wait_point(s, 3, 0), "the bind's out point, at once")?;
    // An in point orders the bind after a job: the job waits for the CPU.
    let flag = DATA_VA + 0x40;
    let p = fx.run(ctx, &[wait_eq(flag, 1)])?;
    let map = &fx.data.map;
    let released = std::sync::atomic::AtomicBool::new(false);
    let r = std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            map.w32(0x40, 1);
        });
        fx.dev.vm_bind_syncs(&[unmap_op(0x4000_0000, 8192)], &[sync(fx.sync, p)], &[sync(s, 4)])
    });
    ok(r, "bind after the job's point")?;
    ensure!(
        released.load(std::sync::atomic::Ordering::SeqCst),
        "the bind returned before the job could finish"
    );
    ok(fx.dev.wait_point(fx.sync, p, 0), "the job's point is signalled once the bind returned")?;
    ok(fx.dev.wait_point(s, 4, 0), "the bind's out point")?;
    Ok(())
}

fn fault_case(fx: &mut Fx, engine: u32, cmds: &[Command<'_>]) -> Result<(u32, u::CtxQuery, i32), String> {
    let ctx = fx.ctx(engine)?;
    let (ib, dw) = fx.ib(cmds)?;
    fx.point += 1;
    let p = fx.point;
    let s = ok(fx.dev.submit_full(ctx, ib, dw, &[], &[sync(fx.sync, p)], u::SUBMIT_OUT_SYNC_FILE), "SUBMIT")?;
    fx.wait(p)?;
    let status = ok(drm::sync_file_status(s.out_fence_fd), "SYNC_IOC_FILE_INFO")?;
    // SAFETY: closing the fd the kernel gave us.
    unsafe { libc::close(s.out_fence_fd) };
    let q = ok(fx.dev.ctx_query(ctx), "CTX_QUERY")?;
    Ok((ctx, q, status))
}

fn read_only_mapping_faults() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let h = ok(fx.dev.bo_create(4096, 0), "BO_CREATE")?;
    let off = ok(fx.dev.mmap_offset(h), "MMAP_OFFSET")?;
    let m = ok(fx.dev.mmap(off, 4096), "mmap")?;
    let va = 0x4000_0000u64;
    ok(fx.dev.map(h, 0, va, 4096, u::VM_BIND_READ_ONLY), "read-only map")?;
    // Reading works.
    let c = fx.ctx(u::engine::COPY)?;
    m.w32(0, 0xAB);
    let p = fx.run(c, &[Command::Copy { src: va, dst: DATA_VA, size: 4 }])?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(0) == 0xAB, "read through a read-only mapping");
    // Writing faults: PERMISSION (2), WRITE (1).
    let (ctx, q, status) = fault_case(&mut fx, u::engine::COPY, &[write_data(va + 16, &[1])])?;
    ensure!(status == -libc::EIO, "fence status {status}, expected -EIO");
    ensure!(q.state == u::ctx_state::GUILTY, "state {}", q.state);
    ensure!(
        q.fault_status & 0x8000_003F == 0x8000_0012,
        "FAULT_STATUS {:#x}: PERMISSION on WRITE",
        q.fault_status
    );
    ensure!(q.fault_addr == va + 16, "FAULT_ADDR {:#x}", q.fault_addr);
    ensure!(m.r32(16) == 0, "the read-only page was written");
    expect_errno(
        fx.dev.submit_full(ctx, fx.ib.va, 1, &[], &[], 0).map(|_| ()),
        libc::ECANCELED,
        "submit on a guilty context",
    )?;
    let dump = fixture::take_devcoredump()?;
    ensure!(
        dump.contains("reason: fault"),
        "devcoredump: {}",
        dump.lines().take(3).collect::<Vec<_>>().join(" | ")
    );
    Ok(())
}

// ----- isolation

fn isolation_two_files() -> R {
    let mut a = Fx::new()?;
    let mut b = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let x = 0x4000_0000u64;
    let ha = ok(a.dev.bo_create(4096, 0), "A BO_CREATE")?;
    let offa = ok(a.dev.mmap_offset(ha), "A MMAP_OFFSET")?;
    let ma = ok(a.dev.mmap(offa, 4096), "A mmap")?;
    ma.w32(0, 0x1234_5678);
    ok(a.dev.map(ha, 0, x, 4096, 0), "A map")?;
    let ca = a.ctx(u::engine::GFX)?;
    // A's handle and context mean nothing in B.
    ensure!(![b.ib.handle, b.data.handle].contains(&ha), "handle numbers: A's {ha} is also one of B's");
    expect_errno(b.dev.mmap_offset(ha), ENOENT, "A's handle in B (MMAP_OFFSET)")?;
    expect_errno(b.dev.map(ha, 0, 0x4100_0000, 4096, 0), ENOENT, "A's handle in B (VM_BIND)")?;
    expect_errno(b.dev.ctx_query(ca), ENOENT, "A's context in B")?;
    // B reading X faults: nothing is mapped there in B's VM.
    let (_, q, status) =
        fault_case(&mut b, u::engine::COPY, &[Command::Copy { src: x, dst: DATA_VA, size: 4 }])?;
    ensure!(q.state == u::ctx_state::GUILTY, "B's reader: state {}", q.state);
    ensure!(
        q.fault_status & 0xF == 1 && q.fault_addr == x,
        "TRANSLATION at X: {:#x} @ {:#x}",
        q.fault_status,
        q.fault_addr
    );
    ensure!(status == -libc::EIO, "fence status {status}");
    ensure!(b.data.map.r32(0) == 0, "B read A's memory");
    let _ = fixture::take_devcoredump()?;
    // B maps its own BO at X and writes: A's BO is untouched.
    let hb = ok(b.dev.bo_create(4096, 0), "B BO_CREATE")?;
    ok(b.dev.map(hb, 0, x, 4096, 0), "B map at X")?;
    let cb = b.ctx(u::engine::COPY)?;
    let p = b.run(cb, &[write_data(x, &[0xBBBB])])?;
    b.wait(p)?;
    ensure!(ma.r32(0) == 0x1234_5678, "A's BO changed to {:#x}", ma.r32(0));
    // A's context still works.
    let p = a.run(ca, &[Command::Copy { src: x, dst: DATA_VA, size: 4 }])?;
    a.wait(p)?;
    ensure!(a.data.map.r32(0) == 0x1234_5678, "A read {:#x}", a.data.map.r32(0));
    Ok(())
}

fn isolation_two_processes() -> R {
    let mut a = Fx::new()?;
    let x = 0x4000_0000u64;
    let ha = ok(a.dev.bo_create(4096, 0), "BO_CREATE")?;
    let offa = ok(a.dev.mmap_offset(ha), "MMAP_OFFSET")?;
    let ma = ok(a.dev.mmap(offa, 4096), "mmap")?;
    ma.w32(0, 0xAAAA_0001);
    ok(a.dev.map(ha, 0, x, 4096, 0), "map")?;
    // SAFETY: fork(2); the child only runs the closure below and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match child_other_process(ha, x) {
            Ok(()) => 0,
            Err(e) => {
                println!("guest: isolation child: {e}");
                1
            }
        };
        // SAFETY: _exit in the child; no destructors of the parent's state.
        unsafe { libc::_exit(code) };
    }
    ensure!(pid > 0, "fork failed: errno {}", drm::errno());
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    ensure!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "child failed (status {st:#x})");
    ensure!(ma.r32(0) == 0xAAAA_0001, "the parent's BO at X changed: {:#x}", ma.r32(0));
    let c = a.ctx(u::engine::COPY)?;
    let p = a.run(c, &[Command::Copy { src: x, dst: DATA_VA, size: 4 }])?;
    a.wait(p)?;
    ensure!(a.data.map.r32(0) == 0xAAAA_0001, "the parent's X reads {:#x}", a.data.map.r32(0));
    Ok(())
}

fn child_other_process(parent_handle: u32, x: u64) -> R {
    let mut b = Fx::new()?;
    // The parent's handle number is either unknown here or one of ours.
    if ![b.ib.handle, b.data.handle].contains(&parent_handle) {
        expect_errno(b.dev.mmap_offset(parent_handle), ENOENT, "the parent's handle")?;
    }
    let hb = ok(b.dev.bo_create(4096, 0), "BO_CREATE")?;
    ok(b.dev.map(hb, 0, x, 4096, 0), "map at the parent's X")?;
    let c = b.ctx(u::engine::GFX)?;
    let p = b.run(c, &[write_data(x, &[0xBBBB_0002]), Command::Copy { src: x, dst: DATA_VA, size: 4 }])?;
    b.wait(p)?;
    ensure!(b.data.map.r32(0) == 0xBBBB_0002, "the child's X");
    Ok(())
}

fn prime_share() -> R {
    let a = Fx::new()?;
    let mut b = Fx::new()?;
    let ha = ok(a.dev.bo_create(8192, 0), "BO_CREATE")?;
    let offa = ok(a.dev.mmap_offset(ha), "MMAP_OFFSET")?;
    let ma = ok(a.dev.mmap(offa, 8192), "mmap")?;
    let fd = ok(a.dev.prime_export(ha), "PRIME_HANDLE_TO_FD")?;
    let hb = ok(b.dev.prime_import(fd.as_raw_fd()), "PRIME_FD_TO_HANDLE")?;
    expect_errno(b.dev.prime_import(12345), libc::EBADF, "import of a bad fd")?;
    let y = 0x4800_0000u64;
    ok(b.dev.map(hb, 0, y, 8192, 0), "B maps the shared BO")?;
    let c = b.ctx(u::engine::COMPUTE)?;
    let p = b.run(c, &[write_data(y + 4096, &[0x5EED])])?;
    b.wait(p)?;
    ensure!(ma.r32(4096) == 0x5EED, "A sees {:#x}", ma.r32(4096));
    // The dma-buf maps for the CPU too.
    let mb = ok(drm::map_fd(fd.as_raw_fd(), 0, 8192), "mmap of the dma-buf")?;
    ensure!(mb.r32(4096) == 0x5EED, "through the dma-buf: {:#x}", mb.r32(4096));
    // Closing A's handle keeps the object alive for B.
    ok(a.dev.gem_close(ha), "A GEM_CLOSE")?;
    let p = b.run(c, &[write_data(y, &[0x77])])?;
    b.wait(p)?;
    ensure!(mb.r32(0) == 0x77, "B still writes it");
    Ok(())
}

// ----- hangs and faults

/// The IB that hangs in `hang_recovery`: a WAIT_MEM on a flag (data
/// offset 0x40) nobody writes (`devcoredump` finds it in the dump).
fn hang_ib() -> [Command<'static>; 1] {
    [wait_eq(DATA_VA + 0x40, 0xDEAD)]
}

fn hang_recovery() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    // Another client, with a context on the engine that hangs and one on
    // another engine: the reset is none of its business.
    let other = Fx::new()?;
    let others = [other.ctx(u::engine::GFX)?, other.ctx(u::engine::COPY)?];
    // H hangs on GFX (a WAIT_MEM nobody satisfies); J queues behind it on
    // GFX; K runs on COPY meanwhile.
    let h = fx.ctx(u::engine::GFX)?;
    let j = fx.ctx(u::engine::GFX)?;
    let k = fx.ctx(u::engine::COPY)?;
    let (ib, dw) = fx.ib(&hang_ib())?;
    fx.point += 1;
    let ph = fx.point;
    let sh =
        ok(fx.dev.submit_full(h, ib, dw, &[], &[sync(fx.sync, ph)], u::SUBMIT_OUT_SYNC_FILE), "SUBMIT H")?;
    let pj = fx.run(j, &[write_data(DATA_VA + 0x80, &[0x1111])])?;
    let pk = fx.run(k, &[write_data(DATA_VA + 0xC0, &[0x2222])])?;
    fx.wait(pk)?;
    ensure!(fx.data.map.r32(0xC0) == 0x2222, "the other engine's work did not complete during the hang");
    // H's point signals (with an error) once the timeout reset the engine.
    fx.wait(ph)?;
    let status = ok(drm::sync_file_status(sh.out_fence_fd), "SYNC_IOC_FILE_INFO")?;
    // SAFETY: closing the fd the kernel gave us.
    unsafe { libc::close(sh.out_fence_fd) };
    ensure!(status == -libc::ETIMEDOUT, "H's fence status {status}, expected -ETIMEDOUT");
    let q = ok(fx.dev.ctx_query(h), "CTX_QUERY H")?;
    ensure!(q.state == u::ctx_state::GUILTY, "H state {}", q.state);
    ensure!(q.guilty_seqno == sh.seqno, "guilty_seqno {} is not H's seqno {}", q.guilty_seqno, sh.seqno);
    ensure!(q.reset_count == 1, "H's reset_count {}, expected 1", q.reset_count);
    for c in others {
        let q = ok(other.dev.ctx_query(c), "CTX_QUERY of the other client")?;
        ensure!(
            q.reset_count == 0 && q.state == u::ctx_state::OK,
            "another client's context (engine {}) sees the reset: reset_count {}, state {}",
            q.engine,
            q.reset_count,
            q.state
        );
    }
    let qk = ok(fx.dev.ctx_query(k), "CTX_QUERY K")?;
    ensure!(qk.reset_count == 0, "K (another engine) has reset_count {}", qk.reset_count);
    expect_errno(
        fx.dev.submit_full(h, ib, dw, &[], &[], 0).map(|_| ()),
        libc::ECANCELED,
        "submit on the guilty context",
    )?;
    // J was queued behind H: it runs after the reset and is not guilty.
    fx.wait(pj)?;
    ensure!(fx.data.map.r32(0x80) == 0x1111, "J's work after the reset");
    let qj = ok(fx.dev.ctx_query(j), "CTX_QUERY J")?;
    ensure!(qj.state == u::ctx_state::INNOCENT || qj.state == u::ctx_state::OK, "J state {}", qj.state);
    // J counts the reset if its job was in the ring (and ran again).
    let want = u64::from(qj.state == u::ctx_state::INNOCENT);
    ensure!(qj.reset_count == want, "J (state {}) has reset_count {}", qj.state, qj.reset_count);
    // The engine keeps working for new contexts.
    let n = fx.ctx(u::engine::GFX)?;
    let p = fx.run(n, &[write_data(DATA_VA + 0x100, &[0x3333])])?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(0x100) == 0x3333, "a new context on the reset engine");
    ensure!(fx.data.map.r32(0x40) == 0, "nobody wrote the flag");
    Ok(())
}

fn devcoredump() -> R {
    // hang_recovery left its dump.
    let dump = fixture::take_devcoredump()?;
    for want in [
        "refgpu devcoredump",
        "reason: timeout",
        "engine: 0 (gfx)",
        "RPTR:",
        "WPTR:",
        "CUR_ADDR:",
        "IB_BASE:",
        "FAULT_STATUS:",
        "ring window",
    ] {
        ensure!(dump.contains(want), "devcoredump lacks {want:?}:\n{dump}");
    }
    // STATUS at the time of the hang: BUSY | WAITING | IN_IB (0xb).
    ensure!(dump.contains("STATUS: 0xb"), "STATUS of a WAIT_MEM hang in an IB:\n{dump}");
    // The culprit's IB is hang_ib(), as this process wrote it.
    let gen = Fx::new()?.gen;
    let d = dump_of_this_process(&dump, gen)?;
    let ib = &d.ib_windows[0];
    let mut want = vec![0u32; 64];
    let mut n = 0;
    for c in hang_ib() {
        n += umd_core::cmd::Encoder::new(gen)
            .encode(&c, &mut want, n, ib.va)
            .map_err(|e| format!("encode {c:?}: {e}"))?;
    }
    ensure!(
        ib.words == want[..n],
        "the dump's IB {:08x?} is not the one written, {:08x?}",
        ib.words,
        &want[..n]
    );
    // umd-dump marks the WAIT_MEM the engine hung on (CUR_ADDR).
    let text = umd_dump::devcoredump::render_text(&d);
    let marked: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("=>")).collect();
    ensure!(
        marked.len() == 2 && marked[1].contains("WAIT_MEM"),
        "umd-dump marks the ring's INDIRECT_BUFFER and the IB's WAIT_MEM:\n{text}"
    );
    Ok(())
}

/// Dwords of an IB a devcoredump shows from its start (`docs/linux.md`).
const DUMP_IB_HEAD_DW: usize = 1024;

/// Parses `dump` with umd-dump's reader and checks what every dump with a
/// culprit of this process holds: the device's generation, this
/// process's pid and command name, and the culprit's IB in the head
/// window, whole or cut at the window limit (the words are the caller's
/// to check).
fn dump_of_this_process(
    dump: &str,
    gen: umd_core::hw::Generation,
) -> Result<umd_dump::devcoredump::Devcoredump, String> {
    let d = umd_dump::devcoredump::parse(dump.as_bytes()).map_err(|e| format!("{e}:\n{dump}"))?;
    ensure!(d.generation == gen, "the dump's generation {} on a {gen} device", d.generation);
    let comm = std::fs::read_to_string("/proc/self/comm").map_err(|e| format!("/proc/self/comm: {e}"))?;
    let job = d.job.as_ref().ok_or_else(|| format!("the dump names no culprit:\n{dump}"))?;
    ensure!(
        u32::try_from(job.pid) == Ok(std::process::id()) && job.comm == comm.trim_end(),
        "the dump's process {} ({}), this one {} ({})",
        job.pid,
        job.comm,
        std::process::id(),
        comm.trim_end()
    );
    let ib = d.ib_windows.first().ok_or_else(|| format!("no IB window:\n{dump}"))?;
    let shown = (job.ib_size_dw as usize).min(DUMP_IB_HEAD_DW);
    let end = if shown == job.ib_size_dw as usize {
        umd_dump::devcoredump::WindowEnd::Complete
    } else {
        umd_dump::devcoredump::WindowEnd::Cut { at: ib.va + 4 * shown as u64, reason: "window limit".into() }
    };
    ensure!(
        ib.name == "head" && ib.va == job.ib_va && ib.words.len() == shown && ib.end == end,
        "the head window is not the IB's first {shown} dwords ending {end:?}:\n{dump}"
    );
    Ok(d)
}

/// The dwords of `fx`'s IB buffer at GPU address `va`.
fn ib_words(fx: &Fx, va: u64, n: usize) -> Result<Vec<u32>, String> {
    let off = va.checked_sub(fx.ib.va).filter(|o| o + 4 * n as u64 <= fx.ib.size);
    let off = off.ok_or_else(|| format!("{va:#x} + {n} dwords is not in the IB buffer"))? as usize;
    Ok((0..n).map(|i| fx.ib.map.r32(off + 4 * i)).collect())
}

fn fault_recovery() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let unmapped = 0x7000_0000u64;
    let (ctx, q, status) = fault_case(
        &mut fx,
        u::engine::COMPUTE,
        &[write_data(DATA_VA, &[1]), Command::Copy { src: unmapped, dst: DATA_VA + 64, size: 8 }],
    )?;
    ensure!(status == -libc::EIO, "fence status {status}, expected -EIO");
    ensure!(q.state == u::ctx_state::GUILTY, "state {}", q.state);
    ensure!(
        q.fault_status & 0x8000_003F == 0x8000_0001,
        "FAULT_STATUS {:#x}: TRANSLATION on READ",
        q.fault_status
    );
    ensure!(q.fault_addr == unmapped, "FAULT_ADDR {:#x}", q.fault_addr);
    ensure!(q.guilty_seqno == 1, "guilty_seqno {}: the context's first job faulted", q.guilty_seqno);
    ensure!(fx.data.map.r32(0) == 1, "the packet before the fault ran");
    expect_errno(
        fx.dev.submit_full(ctx, fx.ib.va, 1, &[], &[], 0).map(|_| ()),
        libc::ECANCELED,
        "submit on the guilty context",
    )?;
    let dump = fixture::take_devcoredump()?;
    ensure!(dump.contains("reason: fault") && dump.contains("engine: 1 (compute)"), "devcoredump:\n{dump}");
    // The culprit's IB, word for word as written into the IB buffer; the
    // faulting DMA_COPY at CUR_ADDR.
    let d = dump_of_this_process(&dump, fx.gen)?;
    let ib = &d.ib_windows[0];
    let written = ib_words(&fx, ib.va, ib.words.len())?;
    ensure!(ib.words == written, "the dump's IB {:08x?}, written {written:08x?}", ib.words);
    let text = umd_dump::devcoredump::render_text(&d);
    ensure!(
        text.lines().any(|l| l.trim_start().starts_with("=>") && l.contains("DMA_COPY")),
        "umd-dump marks the faulting DMA_COPY:\n{text}"
    );
    // Another context on the same engine works.
    let c = fx.ctx(u::engine::COMPUTE)?;
    let p = fx.run(c, &[write_data(DATA_VA + 128, &[0x600D])])?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(128) == 0x600D, "the engine after the fault");
    // An IB larger than the head window faulting past it: the head is cut
    // at the window limit, and a second window starts at CUR_ADDR, on the
    // faulting DMA_COPY.
    let fill = [0x5EEDu32; 200];
    let mut big: Vec<Command<'_>> = (0..6).map(|i| write_data(DATA_VA + 0x1000 + 0x400 * i, &fill)).collect();
    big.push(Command::Copy { src: unmapped, dst: DATA_VA + 64, size: 8 });
    let (_, q, status) = fault_case(&mut fx, u::engine::COMPUTE, &big)?;
    ensure!(status == -libc::EIO && q.state == u::ctx_state::GUILTY, "the large IB's fault: {status}");
    let dump = fixture::take_devcoredump()?;
    let d = dump_of_this_process(&dump, fx.gen)?;
    let job = d.job.as_ref().ok_or("no culprit")?;
    ensure!(job.ib_size_dw as usize > DUMP_IB_HEAD_DW, "the large IB has {} dwords", job.ib_size_dw);
    let head = &d.ib_windows[0];
    ensure!(head.words == ib_words(&fx, head.va, head.words.len())?, "the large IB's head:\n{dump}");
    let cur = d.register("CUR_ADDR").ok_or("no CUR_ADDR")?;
    let w = d.ib_windows.get(1).ok_or_else(|| format!("no window at CUR_ADDR:\n{dump}"))?;
    let left = (job.ib_va + 4 * u64::from(job.ib_size_dw))
        .checked_sub(cur)
        .filter(|_| cur >= job.ib_va)
        .ok_or_else(|| format!("CUR_ADDR {cur:#x} is not in the IB:\n{dump}"))? as usize
        / 4;
    ensure!(
        w.name == "cur"
            && w.va == cur
            && w.words.len() >= left
            && w.words[..left] == ib_words(&fx, cur, left)?[..],
        "the window at CUR_ADDR {cur:#x} is not the IB's last {left} dwords:\n{dump}"
    );
    let text = umd_dump::devcoredump::render_text(&d);
    ensure!(
        text.lines().any(|l| l.trim_start().starts_with("=>") && l.contains("DMA_COPY")),
        "umd-dump marks the large IB's faulting DMA_COPY:\n{text}"
    );
    Ok(())
}

// ----- teardown

fn teardown_killed_process() -> R {
    let base = live()?;
    let mut pipe = [0i32; 2];
    // SAFETY: pipe(2) into a two-element array.
    ensure!(unsafe { libc::pipe(pipe.as_mut_ptr()) } == 0, "pipe");
    // SAFETY: fork(2); the child runs `busy_child` and _exits or is killed.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let r = busy_child(pipe[1]);
        println!("guest: teardown child ended on its own: {r:?}");
        // SAFETY: _exit in the child.
        unsafe { libc::_exit(1) };
    }
    ensure!(pid > 0, "fork");
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(pipe[1]) };
    let mut f = {
        use std::os::fd::FromRawFd;
        // SAFETY: the read end is ours.
        unsafe { std::fs::File::from_raw_fd(pipe[0]) }
    };
    let mut b = [0u8; 1];
    ensure!(f.read_exact(&mut b).is_ok(), "the child did not report its submissions");
    let busy = live()?;
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
    }
    ensure!(
        busy[0] > base[0] && busy[1] > base[1],
        "the child's objects were not live: {base:?} -> {busy:?}"
    );
    let t0 = Instant::now();
    loop {
        let now = live()?;
        if now == base {
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(20),
            "leak after the kill: {base:?} -> {now:?} (bos, vms, contexts, jobs)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// SUBMIT on a context while another thread destroys it, round after
/// round with the destroy a little later each time: every SUBMIT either
/// fails with ENOENT or its job runs and its out-point signals, and no job
/// or context is left behind. (A job accepted after the destroy killed the
/// scheduler entity would be dropped with its fence already in the
/// syncobj, never to signal.) Each SUBMIT waits for 64 signalled points,
/// which widens the window between its context lookup and its push.
fn submit_racing_ctx_destroy() -> R {
    const ROUNDS: u32 = 100;
    const SUBMITS: u64 = 32;
    let mut fx = Fx::new()?;
    let base = live()?;
    let (ib, dw) = fx.ib(&[write_data(DATA_VA, &[1])])?;
    // 64 in-syncs on a point that has signalled.
    let c0 = fx.ctx(u::engine::COPY)?;
    let p0 = fx.run(c0, &[Command::Nop { dwords: 0 }])?;
    fx.wait(p0)?;
    ok(fx.dev.ctx_destroy(c0), "CTX_DESTROY")?;
    let ins = vec![sync(fx.sync, p0); 64];
    let (mut raced, mut ran) = (0u32, 0u64);
    for round in 0..ROUNDS {
        let ctx = fx.ctx(u::engine::COPY)?;
        let first = fx.point + 1;
        let (dev, sync_h, ins) = (&fx.dev, fx.sync, &ins);
        let ((last_ok, end), destroyed) = std::thread::scope(|s| {
            let submitter = s.spawn(move || {
                let mut last_ok = None;
                for p in first..first + SUBMITS {
                    match dev.submit_full(ctx, ib, dw, ins, &[sync(sync_h, p)], 0) {
                        Ok(_) => last_ok = Some(p),
                        Err(e) => return (last_ok, Some(e)),
                    }
                }
                (last_ok, None)
            });
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(u64::from(round % 20) * 25) {
                std::hint::spin_loop();
            }
            let destroyed = dev.ctx_destroy(ctx);
            (submitter.join().unwrap_or((None, Some(-1))), destroyed)
        });
        ok(destroyed, "CTX_DESTROY")?;
        ensure!(
            matches!(end, None | Some(ENOENT)),
            "round {round}: SUBMIT failed with errno {end:?}, not ENOENT"
        );
        if let Some(p) = last_ok {
            fx.wait(p).map_err(|e| format!("round {round}: the last accepted job never signalled: {e}"))?;
            ran += p + 1 - first;
            raced += u32::from(end.is_some());
        }
        fx.point = first + SUBMITS;
    }
    println!("guest: submit_racing_ctx_destroy: {ran} jobs ran, {raced} of {ROUNDS} rounds ended in ENOENT after accepted jobs");
    let t0 = Instant::now();
    while live()? != base {
        ensure!(
            t0.elapsed() < Duration::from_secs(20),
            "leak: {base:?} -> {:?} (bos, vms, contexts, jobs)",
            live()?
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn busy_child(fd: i32) -> R {
    let mut fx = Fx::new()?;
    let mut bufs = Vec::new();
    for i in 0..4u64 {
        bufs.push(buf(&fx.dev, 1 << 20, 0x6000_0000 + (i << 24))?);
    }
    let ctxs = [fx.ctx(u::engine::GFX)?, fx.ctx(u::engine::COPY)?, fx.ctx(u::engine::COMPUTE)?];
    // Work in flight: 3 x 16 jobs of 4 MiB of FILL.
    for i in 0..16u32 {
        for (k, c) in ctxs.iter().enumerate() {
            let cmds: Vec<Command<'_>> = bufs
                .iter()
                .map(|b| Command::Fill { dst: b.va, size: 1 << 20, value: i ^ k as u32 })
                .collect();
            fx.run(*c, &cmds)?;
        }
    }
    // SAFETY: writing one byte to the pipe.
    unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
    fx.wait(fx.point)?;
    std::thread::sleep(Duration::from_secs(60));
    Ok(())
}

// ----- benchmarks (ratios, printed; failure guards only)

fn per_op(n: u32, f: &mut dyn FnMut() -> Result<(), String>) -> Result<f64, String> {
    let t0 = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(t0.elapsed().as_nanos() as f64 / f64::from(n))
}

fn bench_submit_vs_null_ioctl() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let (ib, dw) = fx.ib(&[Command::Nop { dwords: 0 }])?;
    let n = 2000;
    let null = per_op(n, &mut || fx.dev.version_null().map_err(|e| format!("VERSION: errno {e}")))?;
    let d = &fx.dev;
    let submit = per_op(n, &mut || {
        d.submit_full(ctx, ib, dw, &[], &[], 0).map(|_| ()).map_err(|e| format!("SUBMIT: errno {e}"))
    })?;
    let s = fx.sync;
    let mut point = fx.point;
    let submit_sync = per_op(n, &mut || {
        point += 1;
        d.submit(ctx, ib, dw, s, point).map_err(|e| format!("SUBMIT: errno {e}"))
    })?;
    fx.point = point;
    fx.wait(fx.point)?;
    println!(
        "@@ BENCH submit_vs_null_ioctl null_ioctl_ns={null:.0} submit_ns={submit:.0} submit_timeline_out_ns={submit_sync:.0} ratio={:.1} ratio_with_out_sync={:.1} n={n}",
        submit / null,
        submit_sync / null
    );
    Ok(())
}

fn bench_wait_syncobj_vs_poll() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let n = 200u32;
    let slot = DATA_VA + 0x400;
    let mut wait_ns = 0f64;
    for i in 1..=n {
        let p = fx.run(ctx, &[write_data(slot, &[i])])?;
        let t0 = Instant::now();
        fx.wait(p)?;
        wait_ns += t0.elapsed().as_nanos() as f64;
        ensure!(fx.data.map.r32(0x400) == i, "value after the wait");
    }
    let mut poll_ns = 0f64;
    for i in 1..=n {
        let v = 0x1000 + i;
        fx.run(ctx, &[write_data(slot, &[v])])?;
        let t0 = Instant::now();
        while fx.data.map.r32(0x400) != v {
            ensure!(t0.elapsed() < Duration::from_secs(10), "polling: the value never arrived");
            std::hint::spin_loop();
        }
        poll_ns += t0.elapsed().as_nanos() as f64;
    }
    fx.wait(fx.point)?;
    let (w, p) = (wait_ns / f64::from(n), poll_ns / f64::from(n));
    println!(
        "@@ BENCH wait_syncobj_vs_poll timeline_wait_us={:.1} poll_us={:.1} ratio={:.2} n={n}",
        w / 1e3,
        p / 1e3,
        w / p
    );
    Ok(())
}

fn bench_vm_bind_batched() -> R {
    let d = open()?;
    let n = 1000u64;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(ok(d.bo_create(4096, 0), "BO_CREATE")?);
    }
    let va = |i: u64| 0x1_0000_0000 + i * 0x2000;
    let t0 = Instant::now();
    for (i, h) in handles.iter().enumerate() {
        ok(d.map(*h, 0, va(i as u64), 4096, 0), "VM_BIND one")?;
    }
    let one = t0.elapsed();
    let unmaps: Vec<u::VmBindOp> = (0..n).map(|i| unmap_op(va(i), 4096)).collect();
    ok(d.vm_bind(&unmaps), "batched unmap")?;
    let maps: Vec<u::VmBindOp> =
        handles.iter().enumerate().map(|(i, h)| map_op(*h, 0, va(i as u64), 4096, 0)).collect();
    let t0 = Instant::now();
    ok(d.vm_bind(&maps), "VM_BIND batched")?;
    let batched = t0.elapsed();
    // Every buffer is mapped once: a second batch fails as a whole.
    expect_errno(d.vm_bind(&maps), libc::EEXIST, "mapping them again")?;
    println!(
        "@@ BENCH vm_bind_batched one_by_one_ms={:.2} batched_ms={:.2} ratio={:.1} n={n}",
        one.as_secs_f64() * 1e3,
        batched.as_secs_f64() * 1e3,
        one.as_secs_f64() / batched.as_secs_f64()
    );
    Ok(())
}

// ----- kernel log

static KMSG: Mutex<Option<std::fs::File>> = Mutex::new(None);

/// Opens /dev/kmsg and skips what the kernel logged before the modules.
pub fn kmsg_start() {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(mut f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg")
    {
        let _ = read_records(&mut f);
        if let Ok(mut k) = KMSG.lock() {
            *k = Some(f);
        }
    }
}

/// (level, sequence number, first line of the message) of every record of
/// /dev/kmsg until EAGAIN (records are "<prio>,<seq>,<usec>,<flags>;<message>").
pub(crate) fn read_records(f: &mut std::fs::File) -> Vec<(u32, u64, String)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
                let (head, msg) = rec.split_once(';').unwrap_or(("", &rec));
                let mut fields = head.split(',');
                let prio: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let seq: u64 = fields.next().and_then(|q| q.parse().ok()).unwrap_or(0);
                out.push((prio & 7, seq, msg.lines().next().unwrap_or("").to_string()));
            }
            // Records overwritten while reading: go on with the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    out
}

/// Messages the suite provokes on purpose.
const EXPECTED: &[&str] = &[
    "hung, resetting",
    "faulted, resetting",
    "ran past job_max_ms, resetting",
    "device lost:",
    "loading out-of-tree module taints kernel",
    "module verification failed",
];

/// The debug kernel's report markers (lockdep, KASAN, kmemleak,
/// DEBUG_OBJECTS, DMA-API debugging, fault injection, lockdep switching
/// itself off): unexpected at any log level. Lockdep prints its reports
/// without a WARN, some at KERN_INFO ("INFO: lockdep is turned off").
const DEBUG_MARKERS: &[&str] = &[
    "BUG:",
    "WARNING:",
    "INFO:",
    "lockdep",
    "locking correctness validator",
    "KASAN",
    "kmemleak",
    "ODEBUG",
    "DMA-API",
    "FAULT_INJECTION",
];

/// The kernel logged nothing alarming since the modules were loaded but
/// what the suite provokes on purpose (resets), and did log resets.
pub fn kmsg_clean() -> R {
    let mut k = KMSG.lock().map_err(|_| "kmsg lock".to_string())?;
    let f = k.as_mut().ok_or("/dev/kmsg was not opened")?;
    let recs = read_records(f);
    let bad: Vec<String> = recs
        .iter()
        .filter(|(lvl, _, m)| {
            let alarming =
                ["BUG", "WARNING:", "Oops", "Call Trace", "general protection", "refgpu", "drm", "sched"]
                    .iter()
                    .any(|w| m.contains(w));
            let report = DEBUG_MARKERS.iter().any(|w| m.contains(w));
            (*lvl <= 3 || (alarming && *lvl <= 4) || report) && !EXPECTED.iter().any(|e| m.contains(e))
        })
        .map(|(l, _, m)| format!("<{l}> {m}"))
        .collect();
    let warns = recs
        .iter()
        .filter(|(_, _, m)| m.contains("hung, resetting") || m.contains("faulted, resetting"))
        .count();
    ensure!(bad.is_empty(), "unexpected kernel messages: {}", bad.join(" || "));
    ensure!(warns >= 3, "expected the hang and fault reset messages, saw {warns}");
    Ok(())
}

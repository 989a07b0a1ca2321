//! VM page tables: freed once empty, bounded per VM (`vm_max_pt_pages`),
//! and charged to the binding process's memory cgroup. The table count is
//! each VM's `pt_pages` in debugfs `vms`.

use std::collections::BTreeMap;

use refgpu_uapi as u;
use umd_core::cmd::Command;

use crate::drm::{map_op, unmap_op, Dev};
use crate::ensure;
use crate::fixture::{self, expect_errno, Fx, DATA_VA};
use crate::R;

/// The per-VM page-table limit, as the module has it.
const MAX_PT_PAGES: &str = "/sys/module/refgpu/parameters/vm_max_pt_pages";

/// `pt_pages` of every VM in debugfs `vms`, by the VM's (hashed) pointer.
fn vms() -> Result<BTreeMap<String, u64>, String> {
    let p = fixture::debugfs_dir()?.join("vms");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    let mut out = BTreeMap::new();
    for l in s.lines().filter(|l| l.starts_with("vm ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        let n = w
            .iter()
            .position(|t| *t == "pt_pages")
            .and_then(|i| w.get(i + 1))
            .and_then(|v| v.parse().ok())
            .ok_or(format!("debugfs vms: no pt_pages in {l:?}"))?;
        out.insert(w[1].to_string(), n);
    }
    Ok(out)
}

/// Runs `open` and names the one VM it created.
fn new_vm<T>(open: impl FnOnce() -> Result<T, String>) -> Result<(T, String), String> {
    let before = vms()?;
    let t = open()?;
    let new: Vec<String> = vms()?.into_keys().filter(|k| !before.contains_key(k)).collect();
    match new.as_slice() {
        [vm] => Ok((t, vm.clone())),
        _ => Err(format!("expected one new VM in debugfs vms, found {new:?}")),
    }
}

/// The page tables `vm` holds.
fn pt_pages(vm: &str) -> Result<u64, String> {
    vms()?.get(vm).copied().ok_or(format!("VM {vm} not in debugfs vms"))
}

fn ok<T>(r: Result<T, i32>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: errno {e}"))
}

/// Maps and unmaps one page 2,000 times, each time in another 2 MiB region
/// (and another GiB every 64 regions): the tables each map creates go with
/// its unmap, so the VM ends with the tables it started with.
pub fn vm_bind_frees_page_tables() -> R {
    let (d, vm) = new_vm(|| Dev::open().map_err(|e| format!("open: errno {e}")))?;
    let h = ok(d.bo_create(4096, 0), "BO_CREATE")?;
    let end = ok(d.param(u::param::VA_END), "VA_END")?;
    let base = pt_pages(&vm)?;
    let n = 2000u64;
    let va = |i: u64| (4u64 << 30) + i * (2 << 20) + (i / 64) * (1 << 30);
    ensure!(va(n - 1) + 4096 <= end, "VA_END {end:#x} below the range");
    for i in 0..n {
        ok(d.map(h, 0, va(i), 4096, 0), "map")?;
        if i % 500 == 0 {
            let p = pt_pages(&vm)?;
            ensure!(p > base, "cycle {i}: a map in a new 2 MiB region made no table ({p}, {base} before)");
        }
        ok(d.unmap(va(i), 4096), "unmap")?;
    }
    let after = pt_pages(&vm)?;
    ensure!(after == base, "{n} map/unmap cycles: {after} page tables, {base} before");
    // One call that maps 64 regions, another that unmaps them.
    let maps: Vec<u::VmBindOp> = (0..64).map(|i| map_op(h, 0, va(i * 31), 4096, 0)).collect();
    let unmaps: Vec<u::VmBindOp> = (0..64).map(|i| unmap_op(va(i * 31), 4096)).collect();
    ok(d.vm_bind(&maps), "batched map")?;
    let p = pt_pages(&vm)?;
    ensure!(p >= base + 64, "64 regions mapped: {p} page tables, {base} before");
    ok(d.vm_bind(&unmaps), "batched unmap")?;
    let after = pt_pages(&vm)?;
    ensure!(after == base, "batched map and unmap: {after} page tables, {base} before");
    // A table shared by two mappings stays while one of them does.
    ok(d.vm_bind(&[map_op(h, 0, va(0), 4096, 0), map_op(h, 0, va(0) + 8192, 4096, 0)]), "two maps")?;
    let two = pt_pages(&vm)?;
    ok(d.unmap(va(0), 4096), "unmap one")?;
    ensure!(pt_pages(&vm)? == two, "a table still in use was freed");
    ok(d.unmap(va(0) + 8192, 4096), "unmap the other")?;
    ensure!(pt_pages(&vm)? == base, "the last unmap left the tables");
    Ok(())
}

/// Restores the table limit when dropped.
struct Limit(String);

impl Limit {
    fn set(n: u64) -> Result<Limit, String> {
        let old = std::fs::read_to_string(MAX_PT_PAGES).map_err(|e| format!("{MAX_PT_PAGES}: {e}"))?;
        std::fs::write(MAX_PT_PAGES, n.to_string()).map_err(|e| format!("{MAX_PT_PAGES}: {e}"))?;
        Ok(Limit(old.trim().to_string()))
    }
}

impl Drop for Limit {
    fn drop(&mut self) {
        let _ = std::fs::write(MAX_PT_PAGES, &self.0);
    }
}

/// Past `vm_max_pt_pages`, VM_BIND fails with ENOSPC and changes nothing;
/// the VM works on, and a table freed makes room again.
pub fn vm_bind_table_limit() -> R {
    let (mut fx, vm) = new_vm(Fx::new)?;
    let base = pt_pages(&vm)?;
    let limit = Limit::set(base + 2)?;
    let h = ok(fx.dev.bo_create(8192, 0), "BO_CREATE")?;
    let off = ok(fx.dev.mmap_offset(h), "MMAP_OFFSET")?;
    let m = ok(fx.dev.mmap(off, 8192), "mmap")?;
    // At 300 GiB: a level-2 and a level-3 table each; 2 MiB on, one more.
    let (x, y) = (300u64 << 30, (300u64 << 30) + (2 << 20));
    expect_errno(
        fx.dev.vm_bind(&[map_op(h, 0, x, 4096, 0), map_op(h, 4096, y, 4096, 0)]),
        libc::ENOSPC,
        "three tables past a limit of two more",
    )?;
    ensure!(pt_pages(&vm)? == base, "the failed call left tables: {} ({base} before)", pt_pages(&vm)?);
    ok(fx.dev.map(h, 0, x, 4096, 0), "two tables, up to the limit")?;
    ensure!(pt_pages(&vm)? == base + 2, "at the limit: {} tables", pt_pages(&vm)?);
    expect_errno(fx.dev.map(h, 4096, y, 4096, 0), libc::ENOSPC, "one table past the limit")?;
    // No new table needed: still fine.
    ok(fx.dev.map(h, 4096, x + 4096, 4096, 0), "a map in an existing table")?;
    ok(fx.dev.unmap(x, 8192), "unmap")?;
    ensure!(pt_pages(&vm)? == base, "after the unmap: {} tables, {base} before", pt_pages(&vm)?);
    ok(fx.dev.map(h, 4096, y, 4096, 0), "room again")?;
    // The VM still runs jobs, through the old tables and the new ones.
    let ctx = fx.ctx(u::engine::COPY)?;
    let p = fx.run(
        ctx,
        &[
            Command::Fill { dst: DATA_VA, size: 4096, value: 0x7AB1_E500 },
            Command::Fill { dst: y, size: 4096, value: 0x7AB1_E501 },
        ],
    )?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(4092) == 0x7AB1_E500, "FILL of the data buffer: {:#x}", fx.data.map.r32(4092));
    ensure!(m.r32(4096 + 4092) == 0x7AB1_E501, "FILL through the new tables: {:#x}", m.r32(4096 + 4092));
    drop(limit);
    ok(fx.dev.unmap(y, 4096), "unmap")?;
    ensure!(pt_pages(&vm)? == base, "at the end: {} tables, {base} before", pt_pages(&vm)?);
    Ok(())
}

/// The memory cgroup `vm_bind_charges_page_tables` binds in.
const CGROUP: &str = "/sys/fs/cgroup/refgpu-test";

/// Runs `f` in a child process in the memory cgroup `cgroup` (a directory
/// under `/sys/fs/cgroup`, created and removed here; cgroup v2 is mounted
/// and its memory controller enabled first if needed).
pub fn in_memory_cgroup(cgroup: &'static str, f: impl FnOnce() -> R) -> R {
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        crate::mount("cgroup2", "/sys/fs/cgroup", "cgroup2");
    }
    let ctl = "/sys/fs/cgroup/cgroup.subtree_control";
    std::fs::write(ctl, "+memory").map_err(|e| format!("{ctl}: {e}"))?;
    if !std::path::Path::new(cgroup).exists() {
        std::fs::create_dir(cgroup).map_err(|e| format!("{cgroup}: {e}"))?;
    }
    let r = fixture::in_child(|| {
        let procs = format!("{cgroup}/cgroup.procs");
        std::fs::write(&procs, "0").map_err(|e| format!("{procs}: {e}"))?;
        f()
    });
    let rm = std::fs::remove_dir(cgroup).map_err(|e| format!("rmdir {cgroup}: {e}"));
    r.and(rm)
}

/// Page tables a process makes with VM_BIND are charged to its memory
/// cgroup: the process binds one page in 2,000 2 MiB regions (a table
/// each) from a cgroup of its own, whose `memory.current` grows by at
/// least those tables' pages (other allocations only add to it), less the
/// charge batches taken before ([`charge_batches`]).
pub fn vm_bind_charges_page_tables() -> R {
    in_memory_cgroup(CGROUP, charged_child)
}

/// The `memory.current` of `cgroup`.
pub fn memory_current(cgroup: &str) -> Result<u64, String> {
    let p = format!("{cgroup}/memory.current");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
    s.trim().parse().map_err(|e| format!("{p}: {s:?}: {e}"))
}

/// What a cgroup's `memory.current` may lag behind its charges: they are
/// taken from the counter in batches of 64 pages per CPU
/// (MEMCG_CHARGE_BATCH), and a batch taken before a first reading may pay
/// for what is allocated after it.
pub fn charge_batches() -> u64 {
    // SAFETY: sysconf(3) has no memory arguments.
    let cpus = u64::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(1).max(1);
    64 * 4096 * cpus
}

/// `vm_bind_charges_page_tables`' process, in the cgroup.
fn charged_child() -> R {
    let (d, vm) = new_vm(|| Dev::open().map_err(|e| format!("open: errno {e}")))?;
    let h = ok(d.bo_create(4096, 0), "BO_CREATE")?;
    // The buffer's page is allocated before the count starts.
    ok(d.map(h, 0, 4u64 << 30, 4096, 0), "first map")?;
    let n = 2000u64;
    let va = |i: u64| (4u64 << 30) + (i + 1) * (2 << 20) + (i / 64) * (1 << 30);
    let (mem0, pt0) = (memory_current(CGROUP)?, pt_pages(&vm)?);
    let maps: Vec<u::VmBindOp> = (0..n).map(|i| map_op(h, 0, va(i), 4096, 0)).collect();
    for chunk in maps.chunks(250) {
        ok(d.vm_bind(chunk), "map")?;
    }
    let (mem1, pt1) = (memory_current(CGROUP)?, pt_pages(&vm)?);
    ensure!(pt1 >= pt0 + n, "{n} regions mapped: {pt1} page tables, {pt0} before");
    let tables = (pt1 - pt0) * 4096;
    let batches = charge_batches();
    ensure!(
        mem1 + batches >= mem0 + tables,
        "{} new page tables ({tables} bytes) but the cgroup's memory.current grew by {} bytes",
        pt1 - pt0,
        mem1.saturating_sub(mem0)
    );
    Ok(())
}

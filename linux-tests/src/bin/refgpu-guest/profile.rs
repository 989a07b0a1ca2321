//! Where a SUBMIT's time goes: the profile suite (`rgtest.suite=profile`,
//! `cargo test -p linux-tests --test profile -- --ignored --nocapture`).
//!
//! The SUBMIT benchmark of the main suite (2,000 SUBMITs of a NOP IB
//! without syncs, then 2,000 each signalling its own timeline point,
//! queued without waiting), once untraced for the figures and then under
//! ftrace's `function_graph` tracer restricted (`set_ftrace_filter`) to
//! the functions of [`COARSE`], then of [`TRACED`], and to this process
//! (`set_ftrace_pid`): each traced call's duration includes its children,
//! traced or not (and the tracer's cost for the traced ones). The guest
//! prints one `@@ PROFILE <pass>-<phase> <function> calls=<per SUBMIT>
//! us=<per SUBMIT> share=<of refgpu_ioctl_submit> depth=<below it>` line
//! per function seen under the ioctl, slowest first, and `@@ BENCH
//! submit_profile*` lines with the figures and the points of the timeline
//! submitted and not yet signalled when a timeline SUBMIT ran (what
//! `drm_syncobj_add_point()` walks, read with SYNCOBJ_QUERY every tenth
//! SUBMIT).

use std::collections::HashMap;
use std::io::Write;
use std::time::Instant;

use refgpu_uapi as u;
use umd_core::cmd::Command;

use crate::drm::Dev;
use crate::ensure;
use crate::fixture::Fx;
use crate::R;

/// The suite of `rgtest.suite=profile`, in order
/// (`linux_tests::PROFILE_TESTS`).
pub fn all() -> Vec<crate::tests::Test> {
    vec![("submit_profile", submit_profile)]
}

/// SUBMITs per phase.
const N: u32 = 2000;

/// tracefs, mounted by [`submit_profile`].
const TRACING: &str = "/sys/kernel/tracing";

/// The functions traced: the ioctl, the driver's submit steps, what it
/// calls in DRM core, the scheduler and the dma-fence helpers, and the
/// allocator entry points and SLUB debugging steps below them. A name the
/// kernel does not have (inlined, renamed) is skipped and reported.
const TRACED: &[&str] = &[
    "refgpu_ioctl_submit",
    "refgpu_copy_syncs",
    "refgpu_out_syncs_init",
    "refgpu_out_syncs_resolve",
    "refgpu_out_syncs_signal",
    "refgpu_out_syncs_fini",
    "refgpu_job_create",
    "refgpu_ctx_lookup",
    "refgpu_ctx_put",
    "drm_sched_job_init",
    "drm_sched_job_arm",
    "drm_sched_entity_push_job",
    "drm_sched_wakeup",
    "drm_sched_fence_alloc",
    "drm_sched_fence_init",
    "drm_syncobj_find",
    "drm_syncobj_add_point",
    "drm_syncobj_replace_fence",
    "drm_syncobj_free",
    "dma_fence_chain_init",
    "dma_fence_chain_find_seqno",
    "dma_fence_context_alloc",
    "vmemdup_user",
    "memdup_user",
    "__kmalloc_noprof",
    "__kmalloc_cache_noprof",
    "kmem_cache_alloc_noprof",
    "__kvmalloc_node_noprof",
    "kfree",
    "kvfree",
    "kmem_cache_free",
    "__kfence_alloc",
    "stack_depot_save_flags",
    "alloc_debug_processing",
    "free_to_partial_list",
    "__queue_work",
    "try_to_wake_up",
    "mutex_lock",
    "mutex_unlock",
];

fn tracefs(file: &str, value: &str) -> R {
    std::fs::write(format!("{TRACING}/{file}"), value)
        .map_err(|e| format!("{TRACING}/{file} <- {value}: {e}"))
}

/// Sets the filter to `names`, one at a time (a name the kernel cannot
/// trace is refused alone); returns the names refused.
fn set_filter(names: &[&'static str]) -> Result<Vec<&'static str>, String> {
    tracefs("set_ftrace_filter", "")?;
    let mut skipped = Vec::new();
    for f in names {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(format!("{TRACING}/set_ftrace_filter"))
            .map_err(|e| format!("set_ftrace_filter: {e}"))?;
        if file.write_all(f.as_bytes()).is_err() {
            skipped.push(*f);
        }
    }
    Ok(skipped)
}

/// One finished call of the trace: its function, its duration (µs) and
/// the functions open around it on its CPU, innermost last.
struct Call {
    name: String,
    us: f64,
    stack: Vec<String>,
}

/// Parses `function_graph` output (with `funcgraph-tail`): entries
/// `func() {`, exits `} /* func */` and leaves `func();`, a duration
/// before the `|` of exits and leaves, per CPU (`N)` first).
fn parse(trace: &str) -> Vec<Call> {
    let mut stacks: HashMap<String, Vec<String>> = HashMap::new();
    let mut calls = Vec::new();
    for line in trace.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((head, body)) = line.split_once('|') else { continue };
        let Some((cpu, dur)) = head.split_once(')') else { continue };
        let cpu = cpu.trim().to_string();
        let us = dur.split_whitespace().find_map(|w| w.parse::<f64>().ok()).map(|v| {
            if dur.contains(" ms") {
                v * 1e3
            } else {
                v
            }
        });
        let body = body.trim();
        let name_of = |s: &str| s.split(['(', ' ']).next().unwrap_or("").to_string();
        let stack = stacks.entry(cpu).or_default();
        if let Some(rest) = body.strip_prefix("} /* ") {
            let name = name_of(rest.trim_end_matches(" */"));
            if stack.last() == Some(&name) {
                stack.pop();
                if let Some(us) = us {
                    calls.push(Call { name, us, stack: stack.clone() });
                }
            } else {
                // An exit whose entry the buffer lost (or another CPU's).
                stack.clear();
            }
        } else if body.ends_with(") {") {
            stack.push(name_of(body));
        } else if body.ends_with(");") {
            if let Some(us) = us {
                calls.push(Call { name: name_of(body), us, stack: stack.clone() });
            }
        }
    }
    calls
}

/// Prints the functions called under `refgpu_ioctl_submit` in `calls`,
/// per SUBMIT, slowest first; returns the ioctl's µs per SUBMIT.
fn report(phase: &str, calls: &[Call]) -> Result<f64, String> {
    let top = "refgpu_ioctl_submit";
    let submits: Vec<&Call> = calls.iter().filter(|c| c.name == top).collect();
    ensure!(!submits.is_empty(), "{phase}: no {top} in the trace");
    let n = submits.len() as f64;
    let total: f64 = submits.iter().map(|c| c.us).sum::<f64>() / n;
    // Direct children of the ioctl, and everything below it by name.
    let mut by_name: HashMap<String, (f64, f64, usize)> = HashMap::new();
    let mut children = 0.0;
    for c in calls.iter().filter(|c| c.stack.iter().any(|s| s == top)) {
        let depth = c.stack.len() - c.stack.iter().position(|s| s == top).unwrap_or(0);
        let e = by_name.entry(c.name.clone()).or_insert((0.0, 0.0, depth));
        e.0 += 1.0;
        e.1 += c.us;
        e.2 = e.2.min(depth);
        if depth == 1 {
            children += c.us;
        }
    }
    println!("@@ PROFILE {phase} {top} calls=1 us={total:.2} share=1.000 depth=0 submits={}", submits.len());
    let mut rows: Vec<_> = by_name.into_iter().collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (name, (count, us, depth)) in rows {
        println!(
            "@@ PROFILE {phase} {name} calls={:.2} us={:.2} share={:.3} depth={depth}",
            count / n,
            us / n,
            us / n / total
        );
    }
    println!(
        "@@ PROFILE {phase} (refgpu_ioctl_submit itself) calls=1 us={:.2} share={:.3} depth=1",
        total - children / n,
        (total - children / n) / total
    );
    Ok(total)
}

/// The two phases of the SUBMIT benchmark on `ctx`; returns the
/// nanoseconds per SUBMIT of each and the mean number of points of the
/// timeline submitted and not signalled when a timeline SUBMIT ran (read
/// with SYNCOBJ_QUERY every `query_every` SUBMITs; 0 for none).
fn phases(fx: &mut Fx, ctx: u32, ib: u64, dw: u32, query_every: u32) -> Result<(f64, f64, f64), String> {
    let d = &fx.dev;
    let t0 = Instant::now();
    for _ in 0..N {
        d.submit_full(ctx, ib, dw, &[], &[], 0).map_err(|e| format!("SUBMIT: errno {e}"))?;
    }
    let plain = t0.elapsed().as_nanos() as f64 / f64::from(N);
    marker("timeline")?;
    let (s, mut point) = (fx.sync, fx.point);
    let (mut pending, mut samples) = (0u64, 0u64);
    let mut timed = 0u128;
    for i in 0..N {
        if query_every != 0 && i % query_every == 0 {
            let done = d.query_point(s).map_err(|e| format!("SYNCOBJ_QUERY: errno {e}"))?;
            pending += point - done;
            samples += 1;
        }
        point += 1;
        let t0 = Instant::now();
        d.submit(ctx, ib, dw, s, point).map_err(|e| format!("SUBMIT: errno {e}"))?;
        timed += t0.elapsed().as_nanos();
    }
    fx.point = point;
    fx.wait(point)?;
    let pending = if samples == 0 { 0.0 } else { pending as f64 / samples as f64 };
    Ok((plain, timed as f64 / f64::from(N), pending))
}

fn marker(text: &str) -> R {
    // The marker file exists only while tracefs is mounted; untraced runs
    // have nothing to mark.
    if std::path::Path::new(&format!("{TRACING}/trace_marker")).exists() {
        tracefs("trace_marker", &format!("phase {text}"))?;
    }
    Ok(())
}

fn null_ioctl_ns(d: &Dev) -> Result<f64, String> {
    let t0 = Instant::now();
    for _ in 0..N {
        d.version_null().map_err(|e| format!("VERSION: errno {e}"))?;
    }
    Ok(t0.elapsed().as_nanos() as f64 / f64::from(N))
}

/// The submit path's steps alone (the ioctl's direct children and
/// `drm_syncobj_add_point()`): few traced calls, so the SUBMITs keep
/// nearly their untraced pace and the GPU falls behind as far as untraced
/// (the timeline walk's length), where [`TRACED`]'s overhead lets it keep
/// up.
const COARSE: &[&str] = &[
    "refgpu_ioctl_submit",
    "refgpu_job_create",
    "refgpu_out_syncs_resolve",
    "refgpu_out_syncs_signal",
    "drm_syncobj_add_point",
    "drm_sched_job_arm",
    "drm_sched_entity_push_job",
];

/// The benchmark's two phases traced with `filter`; prints the table of
/// each (`<pass>-plain`, `<pass>-timeline`) and the run's figures.
fn traced_run(fx: &mut Fx, ctx: u32, ib: u64, dw: u32, pass: &str, filter: &[&'static str]) -> R {
    tracefs("tracing_on", "0")?;
    tracefs("current_tracer", "nop")?;
    let skipped = set_filter(filter)?;
    if !skipped.is_empty() {
        println!("@@ PROFILE {pass} not traceable here: {}", skipped.join(" "));
    }
    tracefs("set_ftrace_pid", &std::process::id().to_string())?;
    tracefs("buffer_size_kb", "32768")?;
    tracefs("options/funcgraph-tail", "1")?;
    tracefs("options/funcgraph-irqs", "0")?;
    // A call's time is its CPU's, not the time its task was scheduled out.
    tracefs("options/sleep-time", "0")?;
    tracefs("trace", "")?;
    tracefs("current_tracer", "function_graph")?;
    tracefs("tracing_on", "1")?;
    // trace_marker refuses writes while tracing is off.
    marker("plain")?;
    let run = phases(fx, ctx, ib, dw, 10);
    tracefs("tracing_on", "0")?;
    let (plain, timeline, pending) = run?;
    let trace = std::fs::read_to_string(format!("{TRACING}/trace")).map_err(|e| format!("trace: {e}"))?;
    tracefs("current_tracer", "nop")?;
    tracefs("set_ftrace_filter", "")?;
    tracefs("set_ftrace_pid", "")?;
    let cut = trace.find("phase timeline").ok_or("no timeline marker in the trace")?;
    let lost = trace.contains("LOST");
    let p = report(&format!("{pass}-plain"), &parse(&trace[..cut]))?;
    let t = report(&format!("{pass}-timeline"), &parse(&trace[cut..]))?;
    println!(
        "@@ BENCH submit_profile_{pass} submit_ns={plain:.0} submit_timeline_out_ns={timeline:.0} ioctl_us_plain={p:.2} ioctl_us_timeline={t:.2} pending_points_per_timeline_submit={pending:.0} lost_events={lost}"
    );
    Ok(())
}

/// The profile: the benchmark untraced (figures, then the points pending
/// per timeline SUBMIT in a run with queries), then traced twice, with
/// [`COARSE`] and with [`TRACED`]; each trace is split at the
/// `phase timeline` marker.
fn submit_profile() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let (ib, dw) = fx.ib(&[Command::Nop { dwords: 0 }])?;
    let null = null_ioctl_ns(&fx.dev)?;
    let (plain, timeline, _) = phases(&mut fx, ctx, ib, dw, 0)?;
    let (_, _, pending) = phases(&mut fx, ctx, ib, dw, 10)?;
    println!(
        "@@ BENCH submit_profile null_ioctl_ns={null:.0} submit_ns={plain:.0} submit_timeline_out_ns={timeline:.0} ratio={:.1} ratio_with_out_sync={:.1} pending_points_per_timeline_submit={pending:.0} n={N}",
        plain / null,
        timeline / null
    );
    crate::mount("tracefs", TRACING, "tracefs");
    traced_run(&mut fx, ctx, ib, dw, "coarse", COARSE)?;
    traced_run(&mut fx, ctx, ib, dw, "fine", TRACED)
}

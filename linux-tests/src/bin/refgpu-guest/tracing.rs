//! The driver's tracepoints (docs/linux.md, "Tracepoints"): enabled
//! through tracefs around one job, a hang and a fault, and the events read
//! back from `trace`. Each test turns the events off and empties the
//! buffer again when it ends, whatever its result.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::Command;

use crate::drm::{map_op, sync};
use crate::ensure;
use crate::fixture::{self, Fx, DATA_VA};
use crate::tests::{wait_eq, write_data};
use crate::R;

/// Where tracefs is (mounted by the test when it is not).
const TRACEFS: &str = "/sys/kernel/tracing";
/// The event groups the tests turn on: the driver's and drm_sched's.
const GROUPS: &[&str] = &["refgpu", "gpu_scheduler"];
/// How long an event may take to show up after the fence that follows it
/// signalled (a failure guard).
const GUARD: Duration = Duration::from_secs(5);

/// One event from `trace`: its name and its `key=value` fields
/// (drm_sched's `key=value,` too).
#[derive(Debug)]
struct Event {
    name: String,
    fields: BTreeMap<String, String>,
}

impl Event {
    fn get(&self, key: &str) -> &str {
        self.fields.get(key).map_or("", String::as_str)
    }
}

/// The driver's and drm_sched's events turned on, the buffer empty; off
/// and empty again when dropped.
struct Tracing;

impl Tracing {
    fn start() -> Result<Tracing, String> {
        if std::fs::metadata(format!("{TRACEFS}/events")).is_err() {
            crate::mount("tracefs", TRACEFS, "tracefs");
        }
        let t = Tracing;
        clear()?;
        for g in GROUPS {
            write(&format!("events/{g}/enable"), "1")?;
        }
        write("tracing_on", "1")?;
        Ok(t)
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        for g in GROUPS {
            let _ = write(&format!("events/{g}/enable"), "0");
        }
        let _ = clear();
    }
}

fn write(file: &str, value: &str) -> R {
    std::fs::write(format!("{TRACEFS}/{file}"), value).map_err(|e| format!("{TRACEFS}/{file}: {e}"))
}

/// Empties the trace buffer (opening `trace` for writing truncates it).
fn clear() -> R {
    write("trace", "")
}

/// The events in `trace` so far, in order.
fn events() -> Result<Vec<Event>, String> {
    let text =
        std::fs::read_to_string(format!("{TRACEFS}/trace")).map_err(|e| format!("{TRACEFS}/trace: {e}"))?;
    Ok(text.lines().filter(|l| !l.starts_with('#')).filter_map(parse).collect())
}

/// `  task-pid  [cpu] flags  time: name: k=v k=v ...`.
fn parse(line: &str) -> Option<Event> {
    let (_, rest) = line.split_once(": ")?;
    let (name, body) = rest.split_once(": ")?;
    let fields = body
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches(',').split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some(Event { name: name.to_string(), fields })
}

/// Waits (up to [`GUARD`]) until `trace` holds an event that `done`
/// accepts; returns every event read.
fn events_until(what: &str, done: impl Fn(&Event) -> bool) -> Result<Vec<Event>, String> {
    let t0 = Instant::now();
    loop {
        let ev = events()?;
        if ev.iter().any(&done) {
            return Ok(ev);
        }
        if t0.elapsed() > GUARD {
            let names: Vec<String> = ev.iter().map(|e| format!("{} {:?}", e.name, e.fields)).collect();
            return Err(format!("no {what} in the trace; it holds: {}", names.join(" / ")));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The index of the one event named `name` that `pred` accepts.
fn find_one(ev: &[Event], name: &str, what: &str, pred: impl Fn(&Event) -> bool) -> Result<usize, String> {
    let hits: Vec<usize> =
        ev.iter().enumerate().filter(|(_, e)| e.name == name && pred(e)).map(|(i, _)| i).collect();
    match hits[..] {
        [i] => Ok(i),
        _ => Err(format!("{} {name} events for {what} (expected one)", hits.len())),
    }
}

/// The engine's name in the events.
fn engine_name(engine: u32) -> &'static str {
    match engine {
        u::engine::GFX => "gfx",
        u::engine::COMPUTE => "compute",
        _ => "copy",
    }
}

/// A job of `ctx`, run to its end: its IB as the events print it
/// (`va+dwords`) and the seqno SUBMIT returned.
fn run(fx: &mut Fx, ctx: u32, cmds: &[Command<'_>]) -> Result<(String, u64), String> {
    let (ib, dw) = fx.ib(cmds)?;
    fx.point += 1;
    let s = fx
        .dev
        .submit_full(ctx, ib, dw, &[], &[sync(fx.sync, fx.point)], 0)
        .map_err(|e| format!("SUBMIT: errno {e}"))?;
    fx.wait(fx.point)?;
    Ok((format!("{ib:#x}+{dw}"), s.seqno))
}

/// Reads the events until the job `seqno` of context `ctx` has completed;
/// returns them and the job's out fence (`context:seqno`) as its
/// `refgpu_submit` names it.
fn job_events(ctx: u32, seqno: u64) -> Result<(Vec<Event>, String), String> {
    let ours = |e: &Event| e.get("ctx") == ctx.to_string() && e.get("fence").ends_with(&format!(":{seqno}"));
    let ev = events_until("refgpu_complete of the job", |e| e.name == "refgpu_complete" && ours(e))?;
    let sub = find_one(&ev, "refgpu_submit", "the job", ours)?;
    let fence = ev[sub].get("fence").to_string();
    Ok((ev, fence))
}

/// One job followed through the events: a VM_BIND of a new buffer, then a
/// job writing to it. `refgpu_bind` names the mapping, `refgpu_submit`
/// the job (its context, engine, out fence, IB), drm_sched's
/// `drm_sched_job` and `drm_run_job` its id, `refgpu_run` the same job and
/// its hardware fence, `refgpu_complete` that fence with no error, in
/// that order.
pub fn tracepoints_follow_a_job() -> R {
    let mut fx = Fx::new()?;
    let _t = Tracing::start()?;
    let (size, va) = (64u64 << 10, 0x3000_0000u64);
    let bo = fx.dev.bo_create(size, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    fx.dev.vm_bind(&[map_op(bo, 0, va, size, 0)]).map_err(|e| format!("VM_BIND: errno {e}"))?;
    let engine = u::engine::COPY;
    let ctx = fx.ctx(engine)?;
    let (ib, seqno) = run(&mut fx, ctx, &[write_data(va, &[0x7ACE]), write_data(DATA_VA, &[1])])?;
    ensure!(fx.data.map.r32(0) == 1, "the job did not run");
    let (ev, fence) = job_events(ctx, seqno)?;
    let bind = find_one(&ev, "refgpu_bind", "the mapping", |e| e.get("va") == format!("{va:#x}"))?;
    let b = &ev[bind];
    ensure!(
        b.get("op") == "map"
            && b.get("size") == format!("{size:#x}")
            && b.get("handle") == bo.to_string()
            && b.get("bo_size") == format!("{size:#x}")
            && b.get("bo_offset") == "0x0",
        "refgpu_bind fields: {:?}",
        b.fields
    );
    let sub = find_one(&ev, "refgpu_submit", "the job", |e| e.get("fence") == fence)?;
    let sb = &ev[sub];
    let pid = std::process::id().to_string();
    ensure!(
        sb.get("ctx") == ctx.to_string()
            && sb.get("engine") == engine_name(engine)
            && sb.get("pid") == pid
            && sb.get("ib") == ib
            && sb.get("client") == b.get("client")
            && sb.get("client") != "0",
        "refgpu_submit fields {:?} (ctx {ctx}, pid {pid}, ib {ib}, the bind's client {})",
        sb.fields,
        b.get("client")
    );
    let job = sb.get("job").to_string();
    let run = find_one(&ev, "refgpu_run", "the job", |e| e.get("fence") == fence)?;
    let r = &ev[run];
    ensure!(
        r.get("ctx") == ctx.to_string() && r.get("engine") == engine_name(engine) && r.get("job") == job,
        "refgpu_run fields {:?} (ctx {ctx}, job {job})",
        r.fields
    );
    ensure!(r.get("error") == "0", "refgpu_run error {}", r.get("error"));
    let hw = r.get("hw").to_string();
    let done = find_one(&ev, "refgpu_complete", "the job", |e| e.get("fence") == fence)?;
    let c = &ev[done];
    ensure!(
        c.get("ctx") == ctx.to_string() && c.get("engine") == engine_name(engine) && c.get("hw") == hw,
        "refgpu_complete fields {:?} (ctx {ctx}, hw fence {hw})",
        c.fields
    );
    ensure!(c.get("error") == "0", "refgpu_complete error {}", c.get("error"));
    ensure!(
        bind < sub && sub < run && run < done,
        "order bind {bind}, submit {sub}, run {run}, complete {done}"
    );
    // drm_sched's events name the same job by its id, between submit and run.
    let queued = find_one(&ev, "drm_sched_job", "the job", |e| e.get("id") == job)?;
    let sched_run = find_one(&ev, "drm_run_job", "the job", |e| e.get("id") == job)?;
    ensure!(
        sub < queued && queued < sched_run && sched_run < done,
        "drm_sched order: submit {sub}, drm_sched_job {queued}, drm_run_job {sched_run}, complete {done}"
    );
    fx.dev.unmap(va, size).map_err(|e| format!("VM_BIND unmap: errno {e}"))?;
    fx.dev.gem_close(bo).map_err(|e| format!("GEM_CLOSE: errno {e}"))?;
    Ok(())
}

/// Waits for a job that fails, then checks that `refgpu_reset` names it
/// as the culprit with `reason`, and `refgpu_complete` its error. Returns
/// the events read.
fn check_reset(
    fx: &mut Fx,
    engine: u32,
    cmds: &[Command<'_>],
    reason: &str,
    errno: i32,
) -> Result<Vec<Event>, String> {
    let ctx = fx.ctx(engine)?;
    let (_, seqno) = run(fx, ctx, cmds)?;
    let (ev, fence) = job_events(ctx, seqno)?;
    let run = find_one(&ev, "refgpu_run", "the culprit", |e| e.get("fence") == fence)?;
    let reset = find_one(&ev, "refgpu_reset", "the culprit", |e| e.get("fence") == fence)?;
    let done = find_one(&ev, "refgpu_complete", "the culprit", |e| e.get("fence") == fence)?;
    let (r, c) = (&ev[reset], &ev[done]);
    ensure!(
        r.get("engine") == engine_name(engine)
            && r.get("reason") == reason
            && r.get("culprit") == "job"
            && r.get("ctx") == ctx.to_string()
            && r.get("hw_seqno") == ev[run].get("hw").rsplit(':').next().unwrap_or(""),
        "refgpu_reset fields {:?} (engine {}, reason {reason}, ctx {ctx}, the job's run {:?})",
        r.fields,
        engine_name(engine),
        ev[run].fields
    );
    ensure!(c.get("error") == format!("-{errno}"), "the culprit's refgpu_complete: {:?}", c.fields);
    ensure!(run < reset && reset < done, "order run {run}, reset {reset}, complete {done}");
    Ok(ev)
}

/// A hang (a WAIT_MEM nobody satisfies) and a fault (a copy from an
/// unmapped address): `refgpu_reset` names each job as the culprit, with
/// reason `stall` and `fault`; the fault's `refgpu_fault` comes first,
/// with its address; each job's `refgpu_complete` carries its error.
pub fn tracepoints_name_resets() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let r = (|| {
        let _t = Tracing::start()?;
        check_reset(&mut fx, u::engine::GFX, &[wait_eq(DATA_VA + 0x40, 0xDEAD)], "stall", libc::ETIMEDOUT)?;
        clear()?;
        let unmapped = 0x7000_0000u64;
        let ev = check_reset(
            &mut fx,
            u::engine::COMPUTE,
            &[Command::Copy { src: unmapped, dst: DATA_VA, size: 8 }],
            "fault",
            libc::EIO,
        )?;
        let fault = find_one(&ev, "refgpu_fault", "the fault", |e| e.get("engine") == "compute")?;
        let reset = find_one(&ev, "refgpu_reset", "the fault", |_| true)?;
        ensure!(
            ev[fault].get("addr") == format!("{unmapped:#x}") && fault < reset,
            "refgpu_fault {:?} at {fault}, reset at {reset}",
            ev[fault].fields
        );
        Ok(())
    })();
    fixture::clear_devcoredumps()?;
    r
}

// SPDX-License-Identifier: GPL-2.0 OR MIT
/* Copyright the refgpu authors */
/*
 * Contexts, jobs and the rings: one drm_gpu_scheduler per engine, one
 * scheduler entity per context. run_job writes INDIRECT_BUFFER + FENCE
 * (docs/refgpu.md 6.8, 6.5) into the engine's ring; the FENCE raises the
 * engine's interrupt, and a job is complete once the engine's RPTR has
 * passed its INDIRECT_BUFFER (never from memory user work can write).
 * Hangs (checked once per job_timeout_ms by the engine's watchdog, which
 * gives an engine that still makes progress more time, up to a hard
 * bound) and faults (the fault interrupt) are recovered only in the
 * scheduler's timeout handler: it stops the
 * engine, fails the job whose IB it was executing and marks that job's
 * context guilty, resets the engine and writes the jobs that had not
 * started into the ring again, with the fences they already had. No job
 * runs twice.
 */

#include <linux/devcoredump.h>
#include <linux/dma-mapping.h>
#include <linux/file.h>
#include <linux/iopoll.h>
#include <linux/module.h>
#include <linux/seq_file.h>
#include <linux/sync_file.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

#include <drm/drm_debugfs.h>
#include <drm/drm_file.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>
#include <drm/drm_syncobj.h>

#include "refgpu_drv.h"
#include "refgpu_trace.h"

static unsigned int job_timeout_ms = 1000;
module_param(job_timeout_ms, uint, 0444);
MODULE_PARM_DESC(job_timeout_ms, "a job whose engine makes no progress for this long is a hang (default 1000)");

static unsigned int job_max_ms = 10000;
module_param(job_max_ms, uint, 0644);
MODULE_PARM_DESC(job_max_ms, "a job running longer is a hang, progress or not (default 10000; 0: no bound)");

/*
 * Jobs one open file may have (queued, in a ring, or ended and not yet
 * freed): a SUBMIT past it fails with -EBUSY (not -EAGAIN, which libdrm's
 * drmIoctl() retries at once: a client would spin in the ioctl).
 * ring_saturation queues 2,403 in one file.
 */
static unsigned int file_max_jobs = 4096;

/* A file may always have one job: 0 is refused (-EINVAL), the value kept. */
static int refgpu_file_max_jobs_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, UINT_MAX);
}

static const struct kernel_param_ops refgpu_file_max_jobs_ops = {
	.set = refgpu_file_max_jobs_set,
	.get = param_get_uint,
};
module_param_cb(file_max_jobs, &refgpu_file_max_jobs_ops, &file_max_jobs, 0644);
MODULE_PARM_DESC(file_max_jobs,
		 "jobs one open file may have queued or running, SUBMIT fails with EBUSY past it (default 4096, at least 1)");

static const char * const refgpu_engine_names[REFGPU_ENGINES] = { "gfx", "compute", "copy" };

/* ----- hardware fences */

static const char *refgpu_fence_get_driver_name(struct dma_fence *fence)
{
	return "refgpu";
}

static const char *refgpu_fence_get_timeline_name(struct dma_fence *fence)
{
	return refgpu_engine_names[container_of(fence, struct refgpu_fence, base)->engine];
}

/* ----- busy time per open file (fdinfo; docs/linux.md, "fdinfo") */

/**
 * refgpu_file_stats_create() - the engine time of a new open file
 *
 * Return: the stats with one reference (the file's), or NULL.
 */
struct refgpu_file_stats *refgpu_file_stats_create(void)
{
	struct refgpu_file_stats *stats = kzalloc(sizeof(*stats), GFP_KERNEL_ACCOUNT);

	if (stats)
		kref_init(&stats->ref);
	return stats;
}

static void refgpu_file_stats_release(struct kref *ref)
{
	kfree(container_of(ref, struct refgpu_file_stats, ref));
}

/**
 * refgpu_file_stats_put() - drop a reference to a file's engine time
 * @stats: the stats, or NULL
 *
 * Any context: the last reference may go with a fence, in an interrupt.
 */
void refgpu_file_stats_put(struct refgpu_file_stats *stats)
{
	if (stats)
		kref_put(&stats->ref, refgpu_file_stats_release);
}

/*
 * @f became its engine's next work (written into an empty ring, or the
 * jobs before it ended): its run time for job_max_ms and its busy time
 * start. Under the engine's lock.
 */
static void refgpu_fence_begin(struct refgpu_fence *f)
{
	f->started = jiffies;
	f->busy_since = ktime_get_ns();
}

/*
 * @f leaves its engine's ring (completed, failed, or taken out by a
 * reset): the time since it became the engine's next work goes to its
 * file. Only the first job of a ring has begun; the others add nothing.
 * Under the engine's lock, before the fence signals (a waiter then reads
 * the time).
 */
static void refgpu_fence_end(struct refgpu_engine *eng, struct refgpu_fence *f)
{
	lockdep_assert_held(&eng->lock);
	if (!f->busy_since)
		return;
	f->stats->busy_ns[eng->id] += ktime_get_ns() - f->busy_since;
	f->busy_since = 0;
}

/**
 * refgpu_show_engine_fdinfo() - the drm-engine-* keys of an open file
 * @p: the fdinfo printer
 * @rfile: the file
 *
 * Per engine, the busy time of the file's jobs that left the ring, plus
 * that of its job the engine is on now, if any: the value grows while a
 * long job runs, and never goes back (its end adds the same time, and
 * more).
 */
void refgpu_show_engine_fdinfo(struct drm_printer *p, struct refgpu_file *rfile)
{
	struct refgpu_file_stats *stats = rfile->stats;
	u32 e;

	for (e = 0; e < REFGPU_ENGINES; e++) {
		struct refgpu_engine *eng = &rfile->rdev->engines[e];
		struct refgpu_fence *f;
		u64 ns;

		spin_lock_irq(&eng->lock);
		ns = stats->busy_ns[e];
		f = list_first_entry_or_null(&eng->inflight, struct refgpu_fence, node);
		if (f && f->stats == stats && f->busy_since)
			ns += ktime_get_ns() - f->busy_since;
		spin_unlock_irq(&eng->lock);
		drm_printf(p, "drm-engine-%s:\t%llu ns\n", refgpu_engine_names[e], ns);
	}
}

/* The fence holds its file's stats: the file may be closed first. */
static void refgpu_fence_release(struct dma_fence *fence)
{
	refgpu_file_stats_put(container_of(fence, struct refgpu_fence, base)->stats);
	dma_fence_free(fence);
}

static const struct dma_fence_ops refgpu_fence_ops = {
	.get_driver_name = refgpu_fence_get_driver_name,
	.get_timeline_name = refgpu_fence_get_timeline_name,
	.release = refgpu_fence_release,
};

/*
 * The engine's read position: RPTR (docs/refgpu.md 4.1) as a ring
 * position in [head, tail]. RPTR only moves forward and never past WPTR,
 * and the ring never holds more than REFGPU_RING_SIZE - 4 bytes, so
 * exactly one position in that range has RPTR's offset. False for a value
 * the engine cannot report: nothing is taken from it.
 */
static bool refgpu_engine_read_pos(struct refgpu_engine *eng, u64 *pos)
{
	u32 rptr = rg_eread(eng->rdev, eng->id, REFGPU_RING_RPTR);
	u64 p;

	if (rptr >= REFGPU_RING_SIZE || rptr % 4)
		return false;
	p = eng->head + (((u64)rptr - eng->head) & (REFGPU_RING_SIZE - 1));
	if (p > eng->tail)
		return false;
	*pos = p;
	return true;
}

/*
 * Signals the in-flight fences whose IB the engine has left. Completion
 * comes from RPTR, which only the engine moves: it passes a job's
 * INDIRECT_BUFFER packet once the IB has ended, every memory write of it
 * complete (docs/refgpu.md 4.1, 4.3). Fence slots in memory are not read:
 * user work can write them (they are in its VM). Jobs of one engine run
 * in ring order, so the fences signal in order.
 */
static void refgpu_engine_signal_locked(struct refgpu_engine *eng)
{
	struct refgpu_fence *f, *tmp;
	bool signalled = false;
	u64 pos;

	lockdep_assert_held(&eng->lock);
	if (eng->frozen)
		return;
	if (!refgpu_engine_read_pos(eng, &pos)) {
		drm_err_ratelimited(&eng->rdev->drm, "engine %u: RPTR %#x outside its ring's work, ignored\n",
				    eng->id, rg_eread(eng->rdev, eng->id, REFGPU_RING_RPTR));
		return;
	}
	/* What the IBs wrote is read after the RPTR that says they ended. */
	dma_rmb();
	eng->head = pos;
	list_for_each_entry_safe(f, tmp, &eng->inflight, node) {
		if (f->ring_done > pos) {
			/* The next job's run time starts when this one's ended. */
			if (signalled)
				refgpu_fence_begin(f);
			break;
		}
		refgpu_fence_end(eng, f);
		list_del_init(&f->node);
		eng->completed = f->base.seqno;
		dma_fence_signal_locked(&f->base);
		trace_refgpu_complete(f);
		dma_fence_put(&f->base);
		signalled = true;
	}
}

/* Fails every fence still in flight: the ring that held them was reset. */
static void refgpu_engine_cancel_locked(struct refgpu_engine *eng, int error)
{
	struct refgpu_fence *f, *tmp;

	lockdep_assert_held(&eng->lock);
	list_for_each_entry_safe(f, tmp, &eng->inflight, node) {
		refgpu_fence_end(eng, f);
		list_del_init(&f->node);
		dma_fence_set_error(&f->base, error);
		dma_fence_signal_locked(&f->base);
		trace_refgpu_complete(f);
		dma_fence_put(&f->base);
	}
}

/**
 * refgpu_engine_freeze() - signal what an engine completed, then stop reading RPTR
 * @eng: the engine, about to be reset or stopped (its registers mapped)
 */
void refgpu_engine_freeze(struct refgpu_engine *eng)
{
	spin_lock_irq(&eng->lock);
	refgpu_engine_signal_locked(eng);
	eng->frozen = true;
	spin_unlock_irq(&eng->lock);
}

/**
 * refgpu_engine_ring_reset() - the software side of an engine reset
 * @eng: the engine, frozen and just reset (RPTR = WPTR = 0)
 * @error: the error of the fences still in flight
 *
 * In one step for the interrupt handler: the fences fail, both ends of
 * the ring move to offset 0 and RPTR is read again.
 */
void refgpu_engine_ring_reset(struct refgpu_engine *eng, int error)
{
	spin_lock_irq(&eng->lock);
	refgpu_engine_cancel_locked(eng, error);
	eng->tail = round_up(eng->tail, REFGPU_RING_SIZE);
	eng->head = eng->tail;
	eng->faulted = false;
	eng->frozen = false;
	spin_unlock_irq(&eng->lock);
}

/**
 * refgpu_engine_fail_inflight() - end every fence in a stopped engine's ring
 * @eng: the engine, stopped or unreachable (its device removed or lost)
 * @error: the error of the fences
 *
 * RPTR is not read (the registers may be gone): what the engine completed
 * since the last interrupt fails too. remove signals what it can first
 * (refgpu_engine_freeze()).
 */
void refgpu_engine_fail_inflight(struct refgpu_engine *eng, int error)
{
	spin_lock_irq(&eng->lock);
	eng->frozen = true;
	refgpu_engine_cancel_locked(eng, error);
	spin_unlock_irq(&eng->lock);
}

/**
 * refgpu_engine_irq() - interrupt of one engine
 * @eng: the engine
 * @status: its IRQ_STATUS bits, already cleared
 *
 * A FENCE interrupt is only a hint to read RPTR again: user work can raise
 * it too (FENCE with IRQ is legal in an IB), and gains nothing by it.
 */
void refgpu_engine_irq(struct refgpu_engine *eng, u32 status)
{
	struct refgpu_device *rdev = eng->rdev;
	unsigned long flags;

	spin_lock_irqsave(&eng->lock, flags);
	if (status & REFGPU_IRQ_FAULT(eng->id)) {
		eng->fault_status = rg_eread(rdev, eng->id, REFGPU_FAULT_STATUS);
		eng->fault_addr = rg_eread(rdev, eng->id, REFGPU_FAULT_ADDR_LO) |
				  (u64)rg_eread(rdev, eng->id, REFGPU_FAULT_ADDR_HI) << 32;
		eng->faulted = true;
		trace_refgpu_fault(eng);
	}
	refgpu_engine_signal_locked(eng);
	spin_unlock_irqrestore(&eng->lock, flags);

	/* A halted engine fetches nothing more: recover at once. */
	if (status & REFGPU_IRQ_FAULT(eng->id))
		drm_sched_fault(&eng->sched);
}

/*
 * The engine's hang checks: while jobs are in its ring, the scheduler's
 * timeout handler runs once per job_timeout_ms (drm_sched_fault() queues
 * it at once). The scheduler's own timeout is not used: 6.12's drm_sched
 * re-arms it a whole window ahead on every run_job (and at the end of
 * every timeout handler), so a client that keeps submitting behind a
 * hung job kept it from ever being checked, and a fault raised while the
 * handler recovered from the one before waited for the window.
 */
static void refgpu_engine_watchdog(struct work_struct *work)
{
	struct refgpu_engine *eng = container_of(to_delayed_work(work), struct refgpu_engine,
						 watchdog);
	bool busy;

	spin_lock_irq(&eng->lock);
	busy = !list_empty(&eng->inflight);
	spin_unlock_irq(&eng->lock);
	if (!busy)
		return;
	drm_sched_fault(&eng->sched);
	queue_delayed_work(eng->rdev->reset_wq, &eng->watchdog, eng->period);
}

/*
 * Arms the watchdog for a job just put in flight; a pending check keeps
 * its time (an idle engine's watchdog stops once it finds the ring empty,
 * which it checks after this job was added, or this queues it again).
 */
static void refgpu_engine_watch(struct refgpu_engine *eng)
{
	queue_delayed_work(eng->rdev->reset_wq, &eng->watchdog, eng->period);
}

/* ----- the ring */

static u32 refgpu_hdr(struct refgpu_device *rdev, u32 op1, u32 op2, u32 flags, u32 ndw)
{
	if (rdev->gen == 1)
		return op1 << 24 | flags << 16 | ndw;
	return 0x7u << 28 | ndw << 16 | flags << 8 | op2;
}

static void refgpu_ring_put(struct refgpu_engine *eng, const u32 *dw, u32 n)
{
	u32 off = eng->tail & (REFGPU_RING_SIZE - 1), i;

	for (i = 0; i < n; i++)
		WRITE_ONCE(eng->ring[off / 4 + i], dw[i]);
	eng->tail += 4 * n;
}

/* INDIRECT_BUFFER + FENCE(IRQ): 4 + 5 dwords, no packet crosses the end. */
#define REFGPU_JOB_DW	9
/* At most 8 dwords of NOP before them, to the end of the ring. */
#define REFGPU_JOB_MAX_BYTES	(4 * (2 * REFGPU_JOB_DW - 1))
static_assert(REFGPU_JOBS_IN_FLIGHT * REFGPU_JOB_MAX_BYTES <= REFGPU_RING_SIZE - 4);

/*
 * Whether the job's packets fit before RPTR. The ring holds at most
 * REFGPU_RING_SIZE - 4 bytes (docs/refgpu.md 4.1); the scheduler's credits
 * keep the jobs of a ring below that, and their fences signal only once
 * RPTR has passed their IBs, so this holds unless the device misbehaves.
 */
static bool refgpu_ring_fits_locked(struct refgpu_engine *eng)
{
	lockdep_assert_held(&eng->lock);
	if (eng->tail + REFGPU_JOB_MAX_BYTES - eng->head <= REFGPU_RING_SIZE - 4)
		return true;
	refgpu_engine_signal_locked(eng);
	return eng->tail + REFGPU_JOB_MAX_BYTES - eng->head <= REFGPU_RING_SIZE - 4;
}

/*
 * Writes the packets of @fence's job after any padding, records where they
 * are in @fence and publishes them; without @run the INDIRECT_BUFFER is a
 * NOP (the job's fence then signals with the error it was given). The FENCE writes the job's sequence number
 * into the running VM's fence slot, for debugging only, and raises the
 * interrupt. Caller holds the engine's lock and checked the space.
 */
static void refgpu_ring_job_locked(struct refgpu_engine *eng, struct refgpu_fence *fence, bool run)
{
	struct refgpu_device *rdev = eng->rdev;
	u64 slot = REFGPU_KVA_FENCE(rdev) + REFGPU_FENCE_SLOT(eng->id);
	u64 seqno = fence->base.seqno;
	u32 left = (REFGPU_RING_SIZE - (eng->tail & (REFGPU_RING_SIZE - 1))) / 4;
	u32 dw[REFGPU_JOB_DW];

	lockdep_assert_held(&eng->lock);
	if (left < REFGPU_JOB_DW) {
		/* One NOP to the end of the ring; its payload is ignored. */
		dw[0] = refgpu_hdr(rdev, REFGPU_OP_NOP, 0, left - 1);
		refgpu_ring_put(eng, dw, 1);
		eng->tail += 4 * (left - 1);
	}
	fence->ring_start = eng->tail;
	fence->ring_done = eng->tail + 4 * 4;
	/* A job cancelled by a reset keeps its place as a NOP of that size. */
	dw[0] = run ? refgpu_hdr(rdev, REFGPU_OP_INDIRECT_BUFFER, 0, 3) :
		      refgpu_hdr(rdev, REFGPU_OP_NOP, 0, 3);
	dw[1] = lower_32_bits(fence->ib_va);
	dw[2] = upper_32_bits(fence->ib_va);
	dw[3] = fence->ib_dw;
	dw[4] = refgpu_hdr(rdev, REFGPU_OP_FENCE, REFGPU_FENCE_FLAG_IRQ, 4);
	dw[5] = lower_32_bits(slot);
	dw[6] = upper_32_bits(slot);
	dw[7] = lower_32_bits(seqno);
	dw[8] = upper_32_bits(seqno);
	refgpu_ring_put(eng, dw, REFGPU_JOB_DW);
	/* Packets before WPTR (the doorbell orders them before itself). */
	wmb();
	rg_ewrite(rdev, eng->id, REFGPU_RING_WPTR, eng->tail & (REFGPU_RING_SIZE - 1));
}

/* ----- scheduler backend */

static struct refgpu_engine *refgpu_job_engine(struct refgpu_job *job)
{
	return &job->ctx->rdev->engines[job->ctx->engine];
}

static struct dma_fence *refgpu_job_prepare(struct drm_sched_job *sched_job,
					    struct drm_sched_entity *entity)
{
	struct refgpu_job *job = to_refgpu_job(sched_job);
	struct refgpu_engine *eng = refgpu_job_engine(job);

	/*
	 * The engine's root changes only once every job in its ring has
	 * ended: their fences signal when RPTR has passed their IBs, so no
	 * work of the VM it leaves is left but the last FENCE (run_job waits
	 * for it).
	 */
	if (READ_ONCE(eng->cur_vm) != job->vm && eng->last_fence &&
	    !dma_fence_is_signaled(eng->last_fence))
		return dma_fence_get(eng->last_fence);
	return NULL;
}

/*
 * Called once per job (jobs are never submitted again: a reset writes the
 * jobs that had not started into the ring itself, refgpu_engine_recover()).
 * On the fence-signalling path: the hardware fence was allocated at SUBMIT.
 */
static struct dma_fence *refgpu_job_run(struct drm_sched_job *sched_job)
{
	struct refgpu_job *job = to_refgpu_job(sched_job);
	struct refgpu_engine *eng = refgpu_job_engine(job);
	struct refgpu_device *rdev = eng->rdev;
	struct refgpu_fence *fence = job->hw_fence;
	bool hw = false, cookie;
	int err, idx;

	cookie = dma_fence_begin_signalling();
	fence->engine = eng->id;
	fence->ib_va = job->ib_va;
	fence->ib_dw = job->ib_dw;
	fence->ctx_id = job->ctx->id;
	fence->out_context = sched_job->s_fence->finished.context;
	fence->out_seqno = sched_job->s_fence->finished.seqno;
	INIT_LIST_HEAD(&fence->node);

	err = sched_job->s_fence->finished.error;
	if (!err) {
		/* Removed (ENODEV) or lost (EIO): the job fails. */
		hw = refgpu_hw_enter(rdev, &idx);
		if (!hw)
			err = refgpu_gone_error(rdev);
	}
	/*
	 * Another VM's job: every job of the ring has ended (prepare_job), so
	 * the engine is switched once idle (or reset). A fault is never
	 * handled here: the timeout handler owns recovery, and a halted
	 * engine just keeps this job in its ring until then.
	 */
	if (!err && READ_ONCE(eng->cur_vm) != job->vm)
		err = refgpu_engine_set_root(eng, job->vm);

	spin_lock_irq(&eng->lock);
	if (!err && WARN_ON_ONCE(!refgpu_ring_fits_locked(eng)))
		err = -ENOSPC;
	dma_fence_init(&fence->base, &refgpu_fence_ops, &eng->lock, eng->fence_context,
		       err ? eng->emitted : ++eng->emitted);
	if (err) {
		dma_fence_set_error(&fence->base, err);
		trace_refgpu_run(job, fence);
		dma_fence_signal_locked(&fence->base);
		trace_refgpu_complete(fence);
	} else {
		/* In flight before WPTR shows it: its interrupt finds it. */
		if (list_empty(&eng->inflight))
			refgpu_fence_begin(fence);
		list_add_tail(&fence->node, &eng->inflight);
		dma_fence_get(&fence->base);
		refgpu_ring_job_locked(eng, fence, true);
		trace_refgpu_run(job, fence);
	}
	spin_unlock_irq(&eng->lock);

	if (!err) {
		refgpu_doorbell(rdev, eng->id);
		refgpu_engine_watch(eng);
		dma_fence_put(eng->last_fence);
		eng->last_fence = dma_fence_get(&fence->base);
	}
	if (hw)
		drm_dev_exit(idx);
	dma_fence_end_signalling(cookie);
	return dma_fence_get(&fence->base);
}

/*
 * The devcoredump text of one engine, captured into a buffer allocated
 * with it (docs/linux.md, "The devcoredump"): the header and ring window
 * take about 1.5 KiB, the IB windows below at most 90 bytes per 8 dwords.
 */
#define REFGPU_DUMP_SIZE	SZ_32K
/* IB dwords shown from the IB's start, and from CUR_ADDR outside them. */
#define REFGPU_DUMP_IB_HEAD_DW	1024
#define REFGPU_DUMP_IB_CUR_DW	256
/* One line of IB dwords, and the lines that close a window. */
#define REFGPU_DUMP_LINE	96
#define REFGPU_DUMP_CLOSE	128

/* Why the timeout handler resets an engine, if it does. */
enum refgpu_hang {
	REFGPU_PROGRESS,	/* nothing to reset: it moves on, or is between jobs */
	REFGPU_STALLED,		/* no progress for a whole job_timeout_ms */
	REFGPU_OVERTIME,	/* the job ran past job_max_ms */
	REFGPU_FAULTED,		/* halted by a fault */
};

static const char * const refgpu_hang_reasons[] = {
	[REFGPU_PROGRESS] = "none",
	[REFGPU_STALLED] = "timeout (no progress for job_timeout_ms)",
	[REFGPU_OVERTIME] = "timeout (ran past job_max_ms)",
	[REFGPU_FAULTED] = "fault",
};

/*
 * Hands the captured devcoredump to devcoredump, which allocates: outside
 * the fence-signalling path of the timeout handler.
 */
static void refgpu_coredump_work(struct work_struct *work)
{
	struct refgpu_engine *eng = container_of(work, struct refgpu_engine, dump_work);
	struct refgpu_device *rdev = eng->rdev;
	size_t len = eng->dump_len;
	char *buf;
	int idx;

	buf = vmalloc(len);
	if (buf)
		memcpy(buf, eng->dump, len);
	clear_bit_unlock(0, &eng->dump_busy);
	if (!buf)
		return;
	if (!drm_dev_enter(&rdev->drm, &idx)) {
		vfree(buf);
		return;
	}
	mutex_lock(&rdev->dump_lock);
	dev_coredumpv(rdev->drm.dev, buf, len, GFP_KERNEL);
	mutex_unlock(&rdev->dump_lock);
	drm_dev_exit(idx);
}

static u64 refgpu_eread64(struct refgpu_device *rdev, u32 e, u32 lo, u32 hi)
{
	return rg_eread(rdev, e, lo) | (u64)rg_eread(rdev, e, hi) << 32;
}

/*
 * Appends a window of @vm's memory at @va to the dump in @buf (@len of
 * @size bytes used): a line naming it and its @n dwords, the dwords 8 a
 * line, and a line saying whether all were shown or where and why the
 * window was cut: after @shown dwords, at the first page that cannot be
 * read, or where the buffer keeps no room for another line and the end
 * line. Returns the new length.
 */
static size_t refgpu_dump_ib_window(char *buf, size_t size, size_t len, struct refgpu_vm *vm,
				    const char *name, u64 va, u32 n, u32 shown)
{
	const char *cut = NULL;
	u32 w[8], i, k;
	int got;

	len += scnprintf(buf + len, size - len, "ib window %s: va %#018llx dwords %u\n", name, va, n);
	while (n) {
		if (size - len < REFGPU_DUMP_LINE + REFGPU_DUMP_CLOSE) {
			cut = "dump buffer full";
			break;
		}
		if (!shown) {
			cut = "window limit";
			break;
		}
		k = min3(n, shown, (u32)ARRAY_SIZE(w));
		got = refgpu_vm_peek(vm, va, w, k);
		if (got <= 0) {
			cut = got == -EBUSY ? "VM busy" : got == -ERANGE ? "outside GPU memory" :
			      "not mapped";
			break;
		}
		len += scnprintf(buf + len, size - len, "%016llx:", va);
		for (i = 0; i < (u32)got; i++)
			len += scnprintf(buf + len, size - len, " %08x", w[i]);
		len += scnprintf(buf + len, size - len, "\n");
		va += 4 * got;
		n -= got;
		shown -= got;
	}
	if (cut)
		len += scnprintf(buf + len, size - len, "ib window end: cut at %#018llx: %s\n",
				 va, cut);
	else
		len += scnprintf(buf + len, size - len, "ib window end: complete\n");
	return len;
}

/*
 * Writes the engine's state into its dump buffer (no allocation) and has
 * refgpu_coredump_work() publish it. Skipped while the last one is still
 * being handed over.
 */
static void refgpu_coredump(struct refgpu_engine *eng, struct refgpu_job *job,
			    enum refgpu_hang why)
{
	struct refgpu_device *rdev = eng->rdev;
	u32 e = eng->id, rptr, status, i, start;
	size_t size = REFGPU_DUMP_SIZE, len = 0;
	char *buf = eng->dump;
	u64 cur;

	if (test_and_set_bit_lock(0, &eng->dump_busy))
		return;
#define P(...) (len += scnprintf(buf + len, size - len, __VA_ARGS__))
	P("refgpu devcoredump\n");
	P("reason: %s\n", refgpu_hang_reasons[why]);
	P("chip_id: %#010x\n", rdev->chip_id);
	P("generation: %u\n", rdev->gen);
	P("engine: %u (%s)\n", e, refgpu_engine_names[e]);
	if (job) {
		P("context: %u ib_va: %#llx ib_size_dw: %u\n", job->ctx->id, job->ib_va, job->ib_dw);
		P("process: %d (%s)\n", refgpu_vm_pid(job->vm), refgpu_vm_comm(job->vm));
	} else {
		P("context: none (no job's IB was executing)\n");
	}
	P("seqno: emitted %llu completed %llu\n", eng->emitted, eng->completed);
	P("ring: head %#llx tail %#llx\n", eng->head, eng->tail);
	rptr = rg_eread(rdev, e, REFGPU_RING_RPTR);
	P("RING_BASE: %#010x%08x\n", rg_eread(rdev, e, REFGPU_RING_BASE_HI),
	  rg_eread(rdev, e, REFGPU_RING_BASE_LO));
	P("RING_SIZE: %#x\n", rg_eread(rdev, e, REFGPU_RING_SIZE_REG));
	P("RPTR: %#x\n", rptr);
	P("WPTR: %#x\n", rg_eread(rdev, e, REFGPU_RING_WPTR));
	P("CTRL: %#x\n", rg_eread(rdev, e, REFGPU_CTRL));
	status = rg_eread(rdev, e, REFGPU_STATUS);
	P("STATUS: %#x\n", status);
	cur = refgpu_eread64(rdev, e, REFGPU_CUR_ADDR_LO, REFGPU_CUR_ADDR_HI);
	P("CUR_ADDR: %#018llx\n", cur);
	P("IB_BASE: %#010x%08x\n", rg_eread(rdev, e, REFGPU_IB_BASE_HI),
	  rg_eread(rdev, e, REFGPU_IB_BASE_LO));
	P("IB_SIZE: %#x\n", rg_eread(rdev, e, REFGPU_IB_SIZE));
	P("FAULT_STATUS: %#010x\n", rg_eread(rdev, e, REFGPU_FAULT_STATUS));
	P("FAULT_ADDR: %#010x%08x\n", rg_eread(rdev, e, REFGPU_FAULT_ADDR_HI),
	  rg_eread(rdev, e, REFGPU_FAULT_ADDR_LO));
	P("ENGINE_ROOT: %#010x%08x\n", rg_read(rdev, REFGPU_ENGINE_ROOT_HI(e)),
	  rg_read(rdev, REFGPU_ENGINE_ROOT_LO(e)));
	P("ring window (64 dwords from RPTR - 128 bytes):\n");
	start = (rptr - 128) & (REFGPU_RING_SIZE - 1) & ~3u;
	for (i = 0; i < 64; i++) {
		u32 off = (start + 4 * i) & (REFGPU_RING_SIZE - 1);

		if (i % 8 == 0)
			P("%s%04x:", i ? "\n" : "", off);
		P(" %08x", READ_ONCE(eng->ring[off / 4]));
	}
	P("\n");
#undef P
	if (job) {
		u32 head = min_t(u32, job->ib_dw, REFGPU_DUMP_IB_HEAD_DW);

		len = refgpu_dump_ib_window(buf, size, len, job->vm, "head", job->ib_va,
					    job->ib_dw, head);
		/* Past the head, or in a buffer the IB chained to. */
		if ((status & REFGPU_STATUS_IN_IB) &&
		    (cur < job->ib_va || cur >= job->ib_va + 4ull * head))
			len = refgpu_dump_ib_window(buf, size, len, job->vm, "cur", cur,
						    REFGPU_DUMP_IB_CUR_DW,
						    REFGPU_DUMP_IB_CUR_DW);
	}
	eng->dump_len = len;
	queue_work(system_wq, &eng->dump_work);
}

/*
 * The job whose IB the engine is executing: RPTR stays on a job's
 * INDIRECT_BUFFER packet while its IB runs, hangs or is halted by a fault
 * (docs/refgpu.md 4.1, 4.4). The engine's registers say it, not the order
 * of the fences: a job whose IB has not started is not blamed. NULL when
 * RPTR is on no job's IB (between jobs, or a value it cannot report).
 */
static struct refgpu_fence *refgpu_engine_culprit_locked(struct refgpu_engine *eng)
{
	struct refgpu_fence *f;
	u64 pos;

	lockdep_assert_held(&eng->lock);
	if (eng->frozen || !refgpu_engine_read_pos(eng, &pos))
		return NULL;
	list_for_each_entry(f, &eng->inflight, node)
		if (pos >= f->ring_start && pos < f->ring_done)
			return f;
	return NULL;
}

/*
 * The progress rule of the timeout handler, run once per job_timeout_ms
 * while a job is pending. The engine's position is RPTR (which IB), and
 * CUR_ADDR and IB_BASE (where in it), as docs/refgpu.md 4.5 describes a
 * hang. The job whose IB the engine executes is hung when its position is
 * the same as at the last check (a whole window without progress), or
 * when it has run for job_max_ms: a position can move forever (a CHAIN
 * loop), so moving alone does not keep a job running.
 */
static enum refgpu_hang refgpu_engine_check(struct refgpu_engine *eng)
{
	struct refgpu_device *rdev = eng->rdev;
	unsigned int max_ms = READ_ONCE(job_max_ms);
	struct refgpu_fence *culprit;
	unsigned long started = 0;
	u64 seqno = 0, pos = 0, cur, ib;
	bool fault, same;

	cur = refgpu_eread64(rdev, eng->id, REFGPU_CUR_ADDR_LO, REFGPU_CUR_ADDR_HI);
	ib = refgpu_eread64(rdev, eng->id, REFGPU_IB_BASE_LO, REFGPU_IB_BASE_HI);
	spin_lock_irq(&eng->lock);
	refgpu_engine_signal_locked(eng);
	fault = eng->faulted;
	culprit = refgpu_engine_culprit_locked(eng);
	if (culprit) {
		seqno = culprit->base.seqno;
		started = culprit->started;
		pos = eng->head;
	}
	spin_unlock_irq(&eng->lock);

	if (fault)
		return REFGPU_FAULTED;
	same = culprit && seqno == eng->watch_seqno && pos == eng->watch_pos &&
	       cur == eng->watch_cur && ib == eng->watch_ib;
	eng->watch_seqno = seqno;
	eng->watch_pos = pos;
	eng->watch_cur = cur;
	eng->watch_ib = ib;
	/* Between jobs, or the job ended just now: nothing hangs. */
	if (!culprit)
		return REFGPU_PROGRESS;
	if (same)
		return REFGPU_STALLED;
	if (max_ms && time_after_eq(jiffies, started + msecs_to_jiffies(max_ms)))
		return REFGPU_OVERTIME;
	return REFGPU_PROGRESS;
}

/*
 * Resets a hung or faulted engine. The engine stops fetching first (it
 * finishes at most the packet it executes), so RPTR then tells exactly
 * which jobs started: the ones before it completed, the one it is on is
 * the culprit, and the ones after it never started. The culprit fails;
 * after the reset the others are written into the ring again with the
 * hardware fences they had, in their order: the innocent ones run once
 * from their start, which is where they stopped; the later ones of the
 * culprit's context take their place as a NOP and signal -ECANCELED.
 * Fences thus signal once, in order, and no job runs twice. Caller is in
 * a refgpu_hw_enter() section, with the scheduler stopped.
 */
static void refgpu_engine_recover(struct refgpu_engine *eng, enum refgpu_hang why)
{
	struct refgpu_device *rdev = eng->rdev;
	struct refgpu_fence *culprit, *f, *tmp;
	struct refgpu_job *guilty = NULL;
	struct drm_sched_job *s;
	LIST_HEAD(replay);
	bool fault, any = false;
	int ret;

	mutex_lock(&rdev->hw_lock);
	rg_ewrite(rdev, eng->id, REFGPU_CTRL, 0);
	if (refgpu_hw_control(rdev)) {
		refgpu_engine_fail_inflight(eng, refgpu_gone_error(rdev));
		goto out_unlock;
	}

	spin_lock_irq(&eng->lock);
	refgpu_engine_signal_locked(eng);
	culprit = refgpu_engine_culprit_locked(eng);
	fault = eng->faulted;
	spin_unlock_irq(&eng->lock);

	if (!culprit && !fault) {
		/* The job ended meanwhile: nothing to reset. */
		rg_ewrite(rdev, eng->id, REFGPU_CTRL, REFGPU_CTRL_ENABLE);
		if (refgpu_hw_control(rdev))
			refgpu_engine_fail_inflight(eng, refgpu_gone_error(rdev));
		goto out_unlock;
	}
	if (culprit) {
		list_for_each_entry(s, &eng->sched.pending_list, list) {
			if (to_refgpu_job(s)->hw_fence == culprit) {
				guilty = to_refgpu_job(s);
				break;
			}
		}
	}
	refgpu_coredump(eng, guilty, why);
	trace_refgpu_reset(eng, fault ? "fault" : why == REFGPU_STALLED ? "stall" : "overtime", culprit);
	if (guilty) {
		struct refgpu_ctx *ctx = guilty->ctx;

		drm_warn(&rdev->drm, "engine %s: context %u of pid %d %s, resetting\n",
			 refgpu_engine_names[eng->id], ctx->id, refgpu_vm_pid(guilty->vm),
			 fault ? "faulted" : why == REFGPU_STALLED ? "hung" : "ran past job_max_ms");
		if (fault) {
			ctx->fault_status = eng->fault_status;
			ctx->fault_addr = eng->fault_addr;
		}
		ctx->guilty_seqno = guilty->base.s_fence->finished.seqno;
		/* CTX_QUERY reads the culprit's details after seeing guilty. */
		smp_wmb();
		atomic_set(&ctx->guilty, 1);
	} else {
		drm_warn(&rdev->drm, "engine %s: fault outside any job's IB, resetting\n",
			 refgpu_engine_names[eng->id]);
	}

	/*
	 * The scheduler is stopped: its pending list is the jobs run on this
	 * engine, in ring order. What is still in flight after RPTR's verdict
	 * is the culprit and the jobs behind it.
	 */
	spin_lock_irq(&eng->lock);
	list_for_each_entry(s, &eng->sched.pending_list, list) {
		struct refgpu_job *j = to_refgpu_job(s);
		struct refgpu_ctx *ctx = j->ctx;

		f = j->hw_fence;
		if (list_empty(&f->node))
			continue;
		/* Its busy time ends with the reset (a replay begins anew). */
		refgpu_fence_end(eng, f);
		/*
		 * Each context with work in the ring counts this reset once
		 * (CTX_QUERY.reset_count: other clients' resets are not its
		 * business); the reset below is the engine's resets + 1.
		 */
		if (ctx->reset_mark != eng->resets + 1) {
			ctx->reset_mark = eng->resets + 1;
			WRITE_ONCE(ctx->resets, ctx->resets + 1);
		}
		if (f == culprit) {
			list_del_init(&f->node);
			dma_fence_set_error(&f->base, fault ? -EIO : -ETIMEDOUT);
			dma_fence_signal_locked(&f->base);
			trace_refgpu_complete(f);
			dma_fence_put(&f->base);
			continue;
		}
		if (atomic_read(&j->ctx->guilty))
			dma_fence_set_error(&f->base, -ECANCELED);
		else
			j->ctx->innocent = true;
		list_move_tail(&f->node, &replay);
	}
	spin_unlock_irq(&eng->lock);

	/* Anything else still in flight (none) fails with the reset. */
	ret = refgpu_engine_hw_reset_locked(eng, -ECANCELED);

	spin_lock_irq(&eng->lock);
	list_for_each_entry_safe(f, tmp, &replay, node) {
		list_del_init(&f->node);
		if (!ret && WARN_ON_ONCE(!refgpu_ring_fits_locked(eng)))
			ret = -ENOSPC;
		if (ret) {
			dma_fence_set_error(&f->base, ret == -ENOSPC ? -ECANCELED : ret);
			dma_fence_signal_locked(&f->base);
			trace_refgpu_complete(f);
			dma_fence_put(&f->base);
			continue;
		}
		if (list_empty(&eng->inflight))
			refgpu_fence_begin(f);
		list_add_tail(&f->node, &eng->inflight);
		refgpu_ring_job_locked(eng, f, !f->base.error);
		any = true;
	}
	spin_unlock_irq(&eng->lock);
	if (any) {
		refgpu_doorbell(rdev, eng->id);
		refgpu_engine_watch(eng);
	}
out_unlock:
	mutex_unlock(&rdev->hw_lock);
	eng->watch_seqno = 0;
}

/*
 * Restarts a scheduler stopped with drm_sched_stop(), which detached the
 * pending jobs from their hardware fences: each gets its fence back (in
 * the ring, or signalled), as panthor does; nothing is submitted again.
 */
static void refgpu_sched_restart(struct refgpu_engine *eng)
{
	struct drm_sched_job *s;

	list_for_each_entry(s, &eng->sched.pending_list, list) {
		struct refgpu_fence *f = to_refgpu_job(s)->hw_fence;

		if (!s->s_fence->parent && f->base.ops)
			s->s_fence->parent = dma_fence_get(&f->base);
	}
	drm_sched_start(&eng->sched);
}

/*
 * The one place that recovers an engine: the watchdog's check once per
 * window, or a fault (drm_sched_fault() runs it at once). The scheduler
 * is stopped first, so no run_job writes the ring meanwhile. A job that
 * still makes progress is left running: the watchdog checks again one
 * window later.
 */
static enum drm_gpu_sched_stat refgpu_job_timedout(struct drm_sched_job *sched_job)
{
	struct refgpu_job *job = to_refgpu_job(sched_job);
	struct refgpu_engine *eng = refgpu_job_engine(job);
	struct refgpu_device *rdev = eng->rdev;
	enum refgpu_hang why;
	bool cookie;
	int idx;

	if (!refgpu_hw_enter(rdev, &idx)) {
		/*
		 * Removed or lost: nothing to reset. What the ring held fails
		 * (ENODEV/EIO), after any run_job in progress (it could add a
		 * fence), and run_job fails what comes next. The stop puts the
		 * timed-out job back on the pending list (the scheduler took it
		 * off) to be freed with the others; the watchdog stops with the
		 * ring empty.
		 */
		drm_sched_wqueue_stop(&eng->sched);
		refgpu_engine_fail_inflight(eng, refgpu_gone_error(rdev));
		drm_sched_stop(&eng->sched, sched_job);
		refgpu_sched_restart(eng);
		return DRM_GPU_SCHED_STAT_ENODEV;
	}

	drm_sched_stop(&eng->sched, sched_job);
	cookie = dma_fence_begin_signalling();
	why = refgpu_engine_check(eng);
	if (why != REFGPU_PROGRESS)
		refgpu_engine_recover(eng, why);
	dma_fence_end_signalling(cookie);
	drm_dev_exit(idx);
	refgpu_sched_restart(eng);
	return DRM_GPU_SCHED_STAT_NOMINAL;
}

static void refgpu_ctx_put(struct refgpu_ctx *ctx);

/*
 * Lets go of the job's memory: the job's reference on its hardware fence,
 * whose last reference frees it (struct refgpu_job) and the file's stats
 * it holds (refgpu_fence_release()), or the memory itself when run_job
 * never initialised the fence. The job is not touched after.
 */
static void refgpu_job_mem_put(struct refgpu_job *job)
{
	if (job->hw_fence->base.ops) {
		dma_fence_put(&job->hw_fence->base);
	} else {
		refgpu_file_stats_put(job->hw_fence->stats);
		kfree(job);
	}
}

static void refgpu_job_put_work(struct work_struct *work)
{
	struct refgpu_job *job = container_of(work, struct refgpu_job, put_work);
	struct refgpu_ctx *ctx = job->ctx;
	struct refgpu_vm *vm = job->vm;

	atomic_dec(&ctx->rdev->job_count);
	refgpu_vm_job_uncharge(vm, 1);
	refgpu_job_mem_put(job);
	/* The device's last reference may go with these (refgpu_put_wq). */
	refgpu_ctx_put(ctx);
	refgpu_vm_put(vm);
}

static void refgpu_job_free(struct drm_sched_job *sched_job)
{
	struct refgpu_job *job = to_refgpu_job(sched_job);

	drm_sched_job_cleanup(sched_job);
	INIT_WORK(&job->put_work, refgpu_job_put_work);
	queue_work(refgpu_put_wq, &job->put_work);
}

static const struct drm_sched_backend_ops refgpu_sched_ops = {
	.prepare_job = refgpu_job_prepare,
	.run_job = refgpu_job_run,
	.timedout_job = refgpu_job_timedout,
	.free_job = refgpu_job_free,
};

/**
 * refgpu_engine_free_ring() - free an engine's ring
 * @eng: the engine, stopped for good (remove, or a failed probe)
 */
void refgpu_engine_free_ring(struct refgpu_engine *eng)
{
	if (!eng->ring)
		return;
	dma_free_coherent(eng->rdev->drm.dev, REFGPU_RING_SIZE, eng->ring, eng->ring_dma);
	eng->ring = NULL;
}

/* With the device's last reference: no job is left (refgpu_release_check()). */
static void refgpu_engine_release(struct drm_device *drm, void *arg)
{
	struct refgpu_engine *eng = arg;

	cancel_delayed_work_sync(&eng->watchdog);
	drm_sched_fini(&eng->sched);
	cancel_work_sync(&eng->dump_work);
	kvfree(eng->dump);
	refgpu_engine_fail_inflight(eng, -ENODEV);
	dma_fence_put(eng->last_fence);
	eng->last_fence = NULL;
	refgpu_engine_free_ring(eng);
}

/**
 * refgpu_engine_init() - set up an engine's ring and scheduler
 * @rdev: the device
 * @e: the engine
 *
 * Both are released with the device's last reference (a drmm action).
 *
 * Return: 0 or a negative error.
 */
int refgpu_engine_init(struct refgpu_device *rdev, u32 e)
{
	struct refgpu_engine *eng = &rdev->engines[e];
	struct device *dev = rdev->drm.dev;
	int ret;

	/* A zero timeout would make every job a hang. */
	if (!job_timeout_ms) {
		dev_err(dev, "job_timeout_ms must be at least 1\n");
		return -EINVAL;
	}

	eng->rdev = rdev;
	eng->id = e;
	spin_lock_init(&eng->lock);
	INIT_LIST_HEAD(&eng->inflight);
	eng->fence_context = dma_fence_context_alloc(1);
	INIT_WORK(&eng->dump_work, refgpu_coredump_work);
	INIT_DELAYED_WORK(&eng->watchdog, refgpu_engine_watchdog);
	eng->period = msecs_to_jiffies(job_timeout_ms);

	eng->dump = kvzalloc(REFGPU_DUMP_SIZE, GFP_KERNEL);
	if (!eng->dump)
		return -ENOMEM;
	eng->ring = dma_alloc_coherent(dev, REFGPU_RING_SIZE, &eng->ring_dma, GFP_KERNEL);
	if (!eng->ring) {
		ret = -ENOMEM;
		goto err_free_dump;
	}
	if (eng->ring_dma < rdev->mem_base ||
	    eng->ring_dma - rdev->mem_base + REFGPU_RING_SIZE > rdev->mem_size) {
		ret = -ENOMEM;
		goto err_free_ring;
	}

#ifdef REFGPU_SCHED_INIT_ARGS	/* 6.12.114 and later (Kbuild detects it) */
	{
		const struct drm_sched_init_args args = {
			.ops = &refgpu_sched_ops,
			.num_rqs = DRM_SCHED_PRIORITY_COUNT,
			.credit_limit = REFGPU_JOBS_IN_FLIGHT,
			.timeout = MAX_SCHEDULE_TIMEOUT,	/* the watchdog's */
			.timeout_wq = rdev->reset_wq,
			.name = refgpu_engine_names[e],
			.dev = dev,
		};

		ret = drm_sched_init(&eng->sched, &args);
	}
#else
	ret = drm_sched_init(&eng->sched, &refgpu_sched_ops, NULL, DRM_SCHED_PRIORITY_COUNT,
			     REFGPU_JOBS_IN_FLIGHT, 0, MAX_SCHEDULE_TIMEOUT, rdev->reset_wq, NULL,
			     refgpu_engine_names[e], dev);
#endif
	if (ret)
		goto err_free_ring;
	return drmm_add_action_or_reset(&rdev->drm, refgpu_engine_release, eng);

err_free_ring:
	dma_free_coherent(dev, REFGPU_RING_SIZE, eng->ring, eng->ring_dma);
err_free_dump:
	kvfree(eng->dump);
	eng->dump = NULL;
	return ret;
}

/* ----- contexts */

static void refgpu_ctx_release(struct kref *ref)
{
	struct refgpu_ctx *ctx = container_of(ref, struct refgpu_ctx, ref);
	struct refgpu_device *rdev = ctx->rdev;

	refgpu_vm_put(ctx->vm);
	mutex_destroy(&ctx->submit_lock);
	kfree(ctx);
	atomic_dec(&rdev->ctx_count);
}

static void refgpu_ctx_put(struct refgpu_ctx *ctx)
{
	kref_put(&ctx->ref, refgpu_ctx_release);
}

/* Takes a reference on the file's context @id, or returns NULL. */
static struct refgpu_ctx *refgpu_ctx_lookup(struct refgpu_file *rfile, u32 id)
{
	struct refgpu_ctx *ctx;

	xa_lock(&rfile->ctxs);
	ctx = xa_load(&rfile->ctxs, id);
	if (ctx)
		kref_get(&ctx->ref);
	xa_unlock(&rfile->ctxs);
	return ctx;
}

/*
 * Queued jobs are flushed (or killed when the process dies), then dropped.
 * A SUBMIT that looked the context up before it left the file's array may
 * still be on its way: it sees @destroyed under the submit lock and fails
 * instead of pushing to the killed entity, which would drop the job with
 * its fence already handed out, never to signal.
 */
static void refgpu_ctx_destroy(struct refgpu_ctx *ctx)
{
	mutex_lock(&ctx->submit_lock);
	ctx->destroyed = true;
	mutex_unlock(&ctx->submit_lock);
	drm_sched_entity_destroy(&ctx->entity);
	refgpu_ctx_put(ctx);
}

void refgpu_file_ctx_fini(struct refgpu_file *rfile)
{
	struct refgpu_ctx *ctx;
	unsigned long id;

	xa_for_each(&rfile->ctxs, id, ctx) {
		xa_erase(&rfile->ctxs, id);
		refgpu_ctx_destroy(ctx);
	}
}

int refgpu_ioctl_ctx_create(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_device *rdev = to_refgpu_device(dev);
	struct refgpu_file *rfile = file->driver_priv;
	struct drm_refgpu_ctx_create *args = data;
	struct drm_gpu_scheduler *sched;
	struct refgpu_ctx *ctx;
	u32 id;
	int ret;

	if (args->flags || args->pad || args->engine >= REFGPU_ENGINES)
		return -EINVAL;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx)
		return -ENOMEM;
	kref_init(&ctx->ref);
	ctx->rdev = rdev;
	ctx->engine = args->engine;
	mutex_init(&ctx->submit_lock);
	ctx->vm = refgpu_vm_get(rfile->vm);
	atomic_inc(&rdev->ctx_count);

	sched = &rdev->engines[args->engine].sched;
	ret = drm_sched_entity_init(&ctx->entity, DRM_SCHED_PRIORITY_NORMAL, &sched, 1,
				    &ctx->guilty);
	if (ret) {
		refgpu_ctx_put(ctx);
		return ret;
	}
	/*
	 * Once stored, a concurrent CTX_DESTROY may take and free the context:
	 * its id is set under the array's lock, before any lookup can see it,
	 * and the context is not touched after the unlock.
	 */
	xa_lock(&rfile->ctxs);
	ret = __xa_alloc(&rfile->ctxs, &id, ctx, XA_LIMIT(1, REFGPU_MAX_CTX_PER_FILE),
			 GFP_KERNEL);
	if (!ret)
		ctx->id = id;
	xa_unlock(&rfile->ctxs);
	if (ret) {
		refgpu_ctx_destroy(ctx);
		return ret;
	}
	args->ctx_id = id;
	return 0;
}

int refgpu_ioctl_ctx_destroy(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_file *rfile = file->driver_priv;
	struct drm_refgpu_ctx_destroy *args = data;
	struct refgpu_ctx *ctx;

	if (args->pad)
		return -EINVAL;
	ctx = xa_erase(&rfile->ctxs, args->ctx_id);
	if (!ctx)
		return -ENOENT;
	refgpu_ctx_destroy(ctx);
	return 0;
}

int refgpu_ioctl_ctx_query(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_device *rdev = to_refgpu_device(dev);
	struct refgpu_file *rfile = file->driver_priv;
	struct drm_refgpu_ctx_query *args = data;
	struct refgpu_ctx *ctx;

	if (args->pad)
		return -EINVAL;
	ctx = refgpu_ctx_lookup(rfile, args->ctx_id);
	if (!ctx)
		return -ENOENT;
	if (READ_ONCE(rdev->lost))
		args->state = REFGPU_CTX_STATE_DEVICE_LOST;
	else if (atomic_read(&ctx->guilty))
		args->state = REFGPU_CTX_STATE_GUILTY;
	else if (READ_ONCE(ctx->innocent))
		args->state = REFGPU_CTX_STATE_INNOCENT;
	else
		args->state = REFGPU_CTX_STATE_OK;
	args->engine = ctx->engine;
	args->reset_count = READ_ONCE(ctx->resets);
	args->guilty_seqno = 0;
	args->fault_status = 0;
	args->fault_addr = 0;
	if (args->state == REFGPU_CTX_STATE_GUILTY) {
		smp_rmb();	/* pairs with the timeout handler's smp_wmb() */
		args->guilty_seqno = ctx->guilty_seqno;
		args->fault_status = ctx->fault_status;
		args->fault_addr = ctx->fault_addr;
	}
	refgpu_ctx_put(ctx);
	return 0;
}

/* ----- submit */

/* The checks SUBMIT and SUBMIT_BATCH make on an IB's range. */
static int refgpu_check_ib(struct refgpu_device *rdev, u64 va, u32 dw)
{
	u64 end;

	if (!dw || dw > rdev->ib_max_dw || !IS_ALIGNED(va, rdev->ib_align))
		return -EINVAL;
	if (check_add_overflow(va, 4ull * dw, &end) || va < REFGPU_VA_START ||
	    end > rdev->kva_base)
		return -EINVAL;
	return 0;
}

/* Frees a job refgpu_job_create() made that was never armed. */
static void refgpu_job_abort(struct refgpu_job *job)
{
	struct refgpu_ctx *ctx = job->ctx;

	drm_sched_job_cleanup(&job->base);
	refgpu_vm_put(job->vm);
	refgpu_file_stats_put(job->hw_fence->stats);
	kfree(job);
	atomic_dec(&ctx->rdev->job_count);
	refgpu_ctx_put(ctx);
}

/**
 * refgpu_job_create() - a job of @ctx running one IB after its in-syncs
 * @ctx: the context (the job takes a reference of its own)
 * @file: the file whose syncobj handles @in names
 * @ib_va: the IB, checked by refgpu_check_ib()
 * @ib_dw: its size in dwords
 * @in: the in-syncs, checked by refgpu_copy_syncs_into() or
 *      refgpu_copy_batch_syncs_into()
 * @in_count: their count
 *
 * The job and its hardware fence are charged to the caller's memory cgroup;
 * the caller has counted the job against the file's limit
 * (refgpu_vm_job_charge()). The job is initialised, not armed: until it is,
 * refgpu_job_abort() frees it.
 *
 * Return: the job, or ERR_PTR(-ENOMEM, -ENOENT for an unknown syncobj,
 * -EINVAL for a point that was never submitted, or drm_sched's error).
 */
static struct refgpu_job *refgpu_job_create(struct refgpu_ctx *ctx, struct drm_file *file,
					    u64 ib_va, u32 ib_dw,
					    const struct drm_refgpu_sync *in, u32 in_count)
{
	struct refgpu_file *rfile = file->driver_priv;
	struct refgpu_job *job;
	int ret;
	u32 i;

	/* dma_fence_free() frees the job through its fence's address. */
	BUILD_BUG_ON(offsetof(struct refgpu_job, hw_fence_mem) != 0);
	/*
	 * Charged to the caller's memory cgroup, as its page tables are; with
	 * its hardware fence, which run_job and a reset signal: neither may
	 * allocate.
	 */
	job = kzalloc(sizeof(*job), GFP_KERNEL_ACCOUNT);
	if (!job)
		return ERR_PTR(-ENOMEM);
	job->hw_fence = &job->hw_fence_mem;
	job->ib_va = ib_va;
	job->ib_dw = ib_dw;
#ifdef REFGPU_SCHED_JOB_CLIENT_ID	/* 6.12.111 has it, 6.12.95 not (Kbuild) */
	ret = drm_sched_job_init(&job->base, &ctx->entity, 1, ctx, file->client_id);
#else
	ret = drm_sched_job_init(&job->base, &ctx->entity, 1, ctx);
#endif
	if (ret) {
		kfree(job);
		return ERR_PTR(ret);
	}
	kref_get(&ctx->ref);
	job->ctx = ctx;
	job->vm = refgpu_vm_get(ctx->vm);
	job->hw_fence->stats = rfile->stats;
	kref_get(&rfile->stats->ref);
	atomic_inc(&ctx->rdev->job_count);

	for (i = 0; i < in_count; i++) {
		struct dma_fence *f;

		ret = drm_syncobj_find_fence(file, in[i].handle, in[i].point, 0, &f);
		if (!ret)
			ret = drm_sched_job_add_dependency(&job->base, f);
		if (ret) {
			refgpu_job_abort(job);
			return ERR_PTR(ret);
		}
	}
	return job;
}

/*
 * The context checks SUBMIT and SUBMIT_BATCH make before taking any job:
 * the device is still answering and the context is not guilty.
 */
static int refgpu_ctx_check(struct refgpu_ctx *ctx)
{
	if (READ_ONCE(ctx->rdev->lost))
		return refgpu_gone_error(ctx->rdev);
	if (atomic_read(&ctx->guilty))
		return -ECANCELED;
	return 0;
}

int refgpu_ioctl_submit(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_device *rdev = to_refgpu_device(dev);
	struct refgpu_file *rfile = file->driver_priv;
	struct drm_refgpu_sync in_buf[REFGPU_SYNCS_INLINE];
	struct drm_refgpu_submit *args = data;
	struct drm_refgpu_sync *in = NULL;
	struct refgpu_out_syncs out;
	struct sync_file *sync_file = NULL;
	struct dma_fence *finished;
	struct refgpu_ctx *ctx;
	struct refgpu_job *job;
	int ret, fd = -1;

	args->out_fence_fd = -1;
	if (args->flags & ~REFGPU_SUBMIT_FLAGS_MASK)
		return -EINVAL;
	ret = refgpu_check_ib(rdev, args->ib_va, args->ib_size_dw);
	if (ret)
		return ret;

	ret = refgpu_copy_syncs_into(args->in_syncs, args->in_sync_count, in_buf,
				     ARRAY_SIZE(in_buf), &in);
	if (ret)
		return ret;
	ret = refgpu_out_syncs_init(&out, args->out_syncs, args->out_sync_count);
	if (ret)
		goto out_free;

	ctx = refgpu_ctx_lookup(rfile, args->ctx_id);
	if (!ctx) {
		ret = -ENOENT;
		goto out_free;
	}
	ret = refgpu_ctx_check(ctx);
	if (ret)
		goto out_put_ctx;

	/* The file's jobs are bounded: a queue is the caller's memory too. */
	if (!refgpu_vm_job_charge(ctx->vm, 1, READ_ONCE(file_max_jobs))) {
		ret = -EBUSY;
		goto out_put_ctx;
	}
	job = refgpu_job_create(ctx, file, args->ib_va, args->ib_size_dw, in,
				args->in_sync_count);
	if (IS_ERR(job)) {
		ret = PTR_ERR(job);
		goto out_uncharge;
	}
	ret = refgpu_out_syncs_resolve(&out, file);
	if (ret)
		goto out_abort_job;
	if (args->flags & REFGPU_SUBMIT_OUT_SYNC_FILE) {
		struct dma_fence *stub;

		fd = get_unused_fd_flags(O_CLOEXEC);
		if (fd < 0) {
			ret = fd;
			goto out_abort_job;
		}
		/*
		 * Made now, so that nothing fails once the job is queued: around
		 * the stub fence, replaced by the job's before the descriptor is
		 * installed (nobody else can see the file until then).
		 */
		stub = dma_fence_get_stub();
		sync_file = sync_file_create(stub);
		dma_fence_put(stub);
		if (!sync_file) {
			ret = -ENOMEM;
			goto out_abort_job;
		}
	}

	mutex_lock(&ctx->submit_lock);
	if (ctx->destroyed) {
		mutex_unlock(&ctx->submit_lock);
		ret = -ENOENT;
		goto out_abort_job;
	}
	drm_sched_job_arm(&job->base);
	trace_refgpu_submit(file, job);
	finished = dma_fence_get(&job->base.s_fence->finished);
	drm_sched_entity_push_job(&job->base);
	mutex_unlock(&ctx->submit_lock);

	args->seqno = finished->seqno;
	refgpu_out_syncs_signal(&out, finished);
	if (sync_file) {
		dma_fence_put(sync_file->fence);
		sync_file->fence = finished;	/* takes the reference */
		fd_install(fd, sync_file->file);
		args->out_fence_fd = fd;
	} else {
		dma_fence_put(finished);
	}
	ret = 0;
	goto out_put_ctx;

out_abort_job:
	if (sync_file)
		fput(sync_file->file);
	if (fd >= 0)
		put_unused_fd(fd);
	refgpu_job_abort(job);
out_uncharge:
	refgpu_vm_job_uncharge(ctx->vm, 1);
out_put_ctx:
	refgpu_ctx_put(ctx);
out_free:
	refgpu_out_syncs_fini(&out);
	refgpu_free_syncs(in, in_buf);
	return ret;
}

/**
 * struct refgpu_batch_entry - one job of a SUBMIT_BATCH, from its checks
 * to its push
 * @job: the job, initialised (NULL before, and once the scheduler has it)
 * @out: its out-syncs, resolved
 * @finished: its scheduler fence, once armed
 */
struct refgpu_batch_entry {
	struct refgpu_job *job;
	struct refgpu_out_syncs out;
	struct dma_fence *finished;
};

/*
 * Copies job @i of @args and checks it as SUBMIT would, then makes its job
 * (in-syncs added) and resolves its out-syncs: everything that can fail.
 */
static int refgpu_batch_prepare(struct refgpu_ctx *ctx, struct drm_file *file,
				const struct drm_refgpu_submit_batch *args, u32 i,
				struct refgpu_batch_entry *e)
{
	u64 uptr = args->jobs.array + (u64)i * args->jobs.stride;
	struct drm_refgpu_sync in_buf[REFGPU_SYNCS_INLINE];
	struct drm_refgpu_sync *in;
	struct drm_refgpu_batch_job j;
	int ret;

	ret = copy_struct_from_user(&j, sizeof(j), u64_to_user_ptr(uptr), args->jobs.stride);
	if (ret)
		return ret;
	if (j.flags)
		return -EINVAL;
	ret = refgpu_check_ib(ctx->rdev, j.ib_va, j.ib_size_dw);
	if (ret)
		return ret;
	ret = refgpu_copy_batch_syncs_into(&j.in_syncs, in_buf, ARRAY_SIZE(in_buf), &in);
	if (ret)
		return ret;
	ret = refgpu_out_syncs_init_batch(&e->out, &j.out_syncs);
	if (ret)
		goto out_free;
	e->job = refgpu_job_create(ctx, file, j.ib_va, j.ib_size_dw, in, j.in_syncs.count);
	if (IS_ERR(e->job)) {
		ret = PTR_ERR(e->job);
		e->job = NULL;
		goto out_free;
	}
	ret = refgpu_out_syncs_resolve(&e->out, file);
out_free:
	refgpu_free_syncs(in, in_buf);
	return ret;
}

int refgpu_ioctl_submit_batch(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_file *rfile = file->driver_priv;
	struct drm_refgpu_submit_batch *args = data;
	struct refgpu_batch_entry *e;
	struct refgpu_ctx *ctx;
	u32 n = args->jobs.count;
	u32 i;
	int ret;

	args->first_seqno = 0;
	args->error_index = REFGPU_BATCH_NO_INDEX;
	if (args->flags || args->pad)
		return -EINVAL;
	if (!n)
		return -EINVAL;
	ret = refgpu_check_obj_array(&args->jobs, sizeof(struct drm_refgpu_batch_job),
				     REFGPU_MAX_BATCH_JOBS);
	if (ret)
		return ret;

	ctx = refgpu_ctx_lookup(rfile, args->ctx_id);
	if (!ctx)
		return -ENOENT;
	ret = refgpu_ctx_check(ctx);
	if (ret)
		goto out_put_ctx;
	/* All of the batch counts, or none of it (SUBMIT's limit). */
	if (!refgpu_vm_job_charge(ctx->vm, n, READ_ONCE(file_max_jobs))) {
		ret = -EBUSY;
		goto out_put_ctx;
	}
	e = kvcalloc(n, sizeof(*e), GFP_KERNEL_ACCOUNT);
	if (!e) {
		ret = -ENOMEM;
		goto out_uncharge;
	}

	/* Every job is checked and made before the first is queued. */
	for (i = 0; i < n; i++) {
		ret = refgpu_batch_prepare(ctx, file, args, i, &e[i]);
		if (ret) {
			args->error_index = i;
			goto out_free;
		}
	}

	mutex_lock(&ctx->submit_lock);
	if (ctx->destroyed) {
		mutex_unlock(&ctx->submit_lock);
		ret = -ENOENT;
		goto out_free;
	}
	/* Armed and pushed in a row: consecutive seqnos, array order. */
	for (i = 0; i < n; i++) {
		drm_sched_job_arm(&e[i].job->base);
		trace_refgpu_submit(file, e[i].job);
		e[i].finished = dma_fence_get(&e[i].job->base.s_fence->finished);
		drm_sched_entity_push_job(&e[i].job->base);
		e[i].job = NULL;	/* the scheduler's now */
	}
	mutex_unlock(&ctx->submit_lock);

	args->first_seqno = e[0].finished->seqno;
	for (i = 0; i < n; i++) {
		refgpu_out_syncs_signal(&e[i].out, e[i].finished);
		dma_fence_put(e[i].finished);
	}

out_free:
	for (i = 0; i < n; i++) {
		if (e[i].job)
			refgpu_job_abort(e[i].job);
		refgpu_out_syncs_fini(&e[i].out);
	}
	kvfree(e);
	if (!ret)
		goto out_put_ctx;
out_uncharge:
	refgpu_vm_job_uncharge(ctx->vm, n);
out_put_ctx:
	refgpu_ctx_put(ctx);
	return ret;
}

int refgpu_debugfs_engines_show(struct seq_file *m, void *data)
{
	struct drm_debugfs_entry *entry = m->private;
	struct refgpu_device *rdev = to_refgpu_device(entry->dev);
	bool hw;
	int idx;
	u32 e;

	hw = refgpu_hw_enter(rdev, &idx);
	for (e = 0; e < REFGPU_ENGINES; e++) {
		struct refgpu_engine *eng = &rdev->engines[e];
		struct refgpu_fence *f;
		u32 n = 0;

		spin_lock_irq(&eng->lock);
		list_for_each_entry(f, &eng->inflight, node)
			n++;
		if (hw)
			seq_printf(m, "engine %u %s: RPTR %#x WPTR %#x (sw %#llx) CTRL %#x STATUS %#x ROOT %#x%08x FAULT %#x\n",
				   e, refgpu_engine_names[e], rg_eread(rdev, e, REFGPU_RING_RPTR),
				   rg_eread(rdev, e, REFGPU_RING_WPTR),
				   eng->tail & (REFGPU_RING_SIZE - 1),
				   rg_eread(rdev, e, REFGPU_CTRL), rg_eread(rdev, e, REFGPU_STATUS),
				   rg_read(rdev, REFGPU_ENGINE_ROOT_HI(e)),
				   rg_read(rdev, REFGPU_ENGINE_ROOT_LO(e)),
				   rg_eread(rdev, e, REFGPU_FAULT_STATUS));
		else
			seq_printf(m, "engine %u %s: (device removed or lost) WPTR (sw) %#llx\n",
				   e, refgpu_engine_names[e], eng->tail & (REFGPU_RING_SIZE - 1));
		seq_printf(m, "  fences: emitted %llu completed %llu in_flight %u slot %llu resets %llu\n",
			   eng->emitted, eng->completed, n,
			   eng->cur_vm ? refgpu_vm_fence_value(eng->cur_vm, e) : 0, eng->resets);
		seq_printf(m, "  ring: head %#llx tail %#llx\n", eng->head, eng->tail);
		spin_unlock_irq(&eng->lock);
	}
	if (hw)
		drm_dev_exit(idx);
	return 0;
}

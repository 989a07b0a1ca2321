/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/* Copyright the refgpu authors */

#ifndef __REFGPU_DRV_H__
#define __REFGPU_DRV_H__

#include <linux/atomic.h>
#include <linux/io.h>
#include <linux/kref.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/version.h>
#include <linux/xarray.h>

#include <drm/drm_device.h>
#include <drm/drm_drv.h>
#include <drm/drm_gem_shmem_helper.h>
#include <drm/drm_gpuvm.h>
#include <drm/gpu_scheduler.h>

#include "refgpu_regs.h"
#include "refgpu_drm.h"

#define REFGPU_ENGINES		3
#define REFGPU_RING_SIZE	SZ_16K
/*
 * Jobs in flight per engine (the scheduler's credits): each takes at most
 * 9 dwords of ring and 8 of padding, so they always fit (run_job checks).
 */
#define REFGPU_JOBS_IN_FLIGHT	64
#define REFGPU_MAX_CTX_PER_FILE	64
#define REFGPU_MAX_SYNCS	64
#define REFGPU_MAX_BIND_OPS	4096
#define REFGPU_MAX_BATCH_JOBS	64	/* SUBMIT_BATCH jobs.count */
/* Largest obj_array stride: bounds the tail copy_struct_from_user() checks. */
#define REFGPU_MAX_STRIDE	SZ_4K
/* User VA starts above the first MiB (catches small NULL-based addresses). */
#define REFGPU_VA_START		SZ_1M
/* Kernel region at the top of the packet address range: rings, fence slots. */
#define REFGPU_KVA_SIZE		SZ_1G
#define REFGPU_KVA_RING(rdev, e)	((rdev)->kva_base + (u64)(e) * SZ_1M)
#define REFGPU_KVA_FENCE(rdev)	((rdev)->kva_base + 3ull * SZ_1M)
/* Fence slot of engine e in a VM's fence page (gen2 needs 64-byte alignment). */
#define REFGPU_FENCE_SLOT(e)	((e) * 64)

struct refgpu_vm;
struct refgpu_ctx;
struct dma_buf_attachment;
struct drm_printer;
struct sg_table;

/**
 * struct refgpu_fence - hardware fence: the end of one job's IB in a ring
 * @base: the dma_fence (first: a fence is freed with kfree_rcu() of it)
 * @node: entry in &refgpu_engine.inflight
 * @engine: the engine that runs it
 * @ctx_id: its job's context, and @out_context:@out_seqno the job's out
 *	fence (the scheduler's finished fence), for the tracepoints
 * @ib_va: the job's IB, written again into the ring after a reset
 * @ib_dw: its size in dwords
 * @ring_start: ring position of the job's INDIRECT_BUFFER packet
 * @ring_done: ring position after it: once the engine's read pointer is
 *	there, the IB has ended (docs/refgpu.md 4.1)
 * @started: jiffies when the job became the engine's next work (written
 *	into the ring behind completed work, or its predecessor completed):
 *	the start of its run time for the hard bound (job_max_ms)
 * @busy_since: ktime_get_ns() at the same moment, 0 while the job is not
 *	the engine's next work: the start of its busy time (fdinfo)
 * @stats: the busy time of its file's jobs (a reference, dropped with the
 *	fence: the file may be closed while the job runs)
 *
 * Allocated with its job at SUBMIT and initialised by run_job: nothing on
 * the path that signals it allocates memory.
 */
struct refgpu_fence {
	struct dma_fence base;
	struct list_head node;
	u32 engine;
	u32 ib_dw;
	u64 ib_va;
	u32 ctx_id;
	u64 out_context;
	u64 out_seqno;
	u64 ring_start;
	u64 ring_done;
	unsigned long started;
	u64 busy_since;
	struct refgpu_file_stats *stats;
};

/**
 * struct refgpu_engine - one command processor and its ring
 *
 * Ring positions count the bytes written to the ring since the engine was
 * set up and never wrap: the ring offset of position p is p modulo
 * %REFGPU_RING_SIZE. A reset moves both ends to the next multiple of the
 * ring size (offset 0, where the device puts RPTR and WPTR).
 */
struct refgpu_engine {
	struct refgpu_device *rdev;
	u32 id;
	struct drm_gpu_scheduler sched;
	u64 fence_context;

	/*
	 * @lock: protects @inflight, @emitted, @completed, @head, @tail,
	 * @frozen and the fault latch (taken in IRQ).
	 *
	 * @head: the engine's read position (RPTR) as last read;
	 * @tail: where the next packet goes (WPTR). Completion is read from
	 * RPTR only, which user work cannot move: never from memory a job
	 * can write.
	 * @frozen: RPTR is not read (the engine is being reset or is stopped).
	 */
	spinlock_t lock;
	struct list_head inflight;
	u64 emitted;
	u64 completed;
	u64 head;
	u64 tail;
	bool frozen;

	/*
	 * The ring: written by run_job (in refgpu_hw_enter() sections) under
	 * @lock; freed by remove.
	 */
	u32 *ring;
	dma_addr_t ring_dma;

	/*
	 * The VM whose root ENGINE_ROOT holds (not a reference: the VM
	 * switches the engine back to the null root before it goes away).
	 * Written under &refgpu_device.hw_lock and @lock, read under either.
	 */
	struct refgpu_vm *cur_vm;
	/* The last hardware fence emitted (for the VM switch in prepare_job). */
	struct dma_fence *last_fence;

	/* Latched by the fault interrupt; consumed by the timeout handler. */
	bool faulted;
	/*
	 * Runs the timeout handler once per job_timeout_ms (@period) while
	 * jobs are in the ring: the scheduler's own timeout is off, as 6.12's
	 * drm_sched re-arms it a whole window ahead on every run_job.
	 */
	struct delayed_work watchdog;
	unsigned long period;
	u32 fault_status;
	u64 fault_addr;
	u64 resets;

	/*
	 * Progress seen by the last timeout check (timeout handler only):
	 * the sequence number of the job whose IB was executing (0 for none)
	 * and the engine's position in it.
	 */
	u64 watch_seqno;
	u64 watch_pos;
	u64 watch_cur;
	u64 watch_ib;

	/*
	 * The devcoredump is written into @dump (allocated with the engine)
	 * by the timeout handler, and handed to devcoredump by @dump_work,
	 * which may allocate: the handler is on the fence-signalling path and
	 * must not. @dump_busy is set from the capture until the hand-over.
	 */
	char *dump;
	size_t dump_len;
	unsigned long dump_busy;
	struct work_struct dump_work;
};

/**
 * struct refgpu_device - the device
 */
struct refgpu_device {
	struct drm_device drm;
	struct pci_dev *pdev;
	void __iomem *bar0;		/* ivshmem registers: doorbell at +12 */
	u32 *regs;			/* BAR2: register page (+ info page) */
	u32 model_peer;
	u64 mem_base;
	u64 mem_size;

	u32 chip_id;
	u32 gen;
	u32 va_bits;
	u32 ib_max_dw;
	u32 ib_align;
	u64 kva_base;			/* also the end of the user VA range */

	/* Serialises the control doorbell, ENGINE_ROOT and MMU_INVALIDATE. */
	struct mutex hw_lock;
	struct refgpu_pt *null_root;	/* MMU_ROOT: maps nothing */
	bool lost;			/* the device stopped answering, or was removed */

	struct refgpu_engine engines[REFGPU_ENGINES];
	struct workqueue_struct *reset_wq;
	/*
	 * Serialises the engines' devcoredump hand-overs: the devcoredump
	 * core's "one dump per device" check and its sysfs link are not atomic,
	 * so two engines' workers publishing at once collide on the link.
	 */
	struct mutex dump_lock;

	struct mutex vms_lock;		/* protects @vms, @kept_vas, @kept_pts, @stopped */
	struct list_head vms;
	/*
	 * Unmapped mappings whose invalidation the device did not acknowledge
	 * (it is lost, or removed and not yet stopped): it may still reach
	 * their pages, so they are freed once remove has stopped it, as are
	 * the page tables emptied by such an unmap (@kept_pts) and the VMs an
	 * engine could not be switched away from (&refgpu_vm.kept).
	 */
	struct list_head kept_vas;
	struct list_head kept_pts;
	bool stopped;			/* remove stopped it: nothing to keep */

	/*
	 * Objects whose pages are DMA-mapped for the device (a GPU mapping
	 * asked for them): remove unmaps them, the clients may keep the
	 * objects (refgpu_gem_release_dma()).
	 */
	struct mutex bos_lock;		/* protects @mapped_bos */
	struct list_head mapped_bos;

	atomic_t bo_count;
	atomic_t vm_count;
	atomic_t ctx_count;
	atomic_t job_count;
	atomic64_t reset_count;
};

#define to_refgpu_device(d) container_of(d, struct refgpu_device, drm)

/**
 * struct refgpu_file_stats - an open file's engine time, for fdinfo
 * @ref: held by the file and by the hardware fence of each of its jobs
 * @busy_ns: per engine, the nanoseconds its jobs were the engine's next
 *	work, from then until they signalled or were taken out of the ring by
 *	a reset (docs/linux.md, "fdinfo"); written and read under that
 *	engine's &refgpu_engine.lock
 */
struct refgpu_file_stats {
	struct kref ref;
	u64 busy_ns[REFGPU_ENGINES];
};

/**
 * struct refgpu_file - per-open-file state
 */
struct refgpu_file {
	struct refgpu_device *rdev;
	struct refgpu_vm *vm;
	struct xarray ctxs;		/* id -> struct refgpu_ctx */
	struct refgpu_file_stats *stats;
};

/**
 * struct refgpu_bo - a GEM shmem buffer object
 */
struct refgpu_bo {
	struct drm_gem_shmem_object base;
	u32 flags;			/* REFGPU_BO_* */
	struct mutex gpuva_lock;	/* the object's gpuva list */
	struct list_head mapped;	/* in &refgpu_device.mapped_bos */
};

static inline struct refgpu_bo *to_refgpu_bo(struct drm_gem_object *obj)
{
	return container_of(to_drm_gem_shmem_obj(obj), struct refgpu_bo, base);
}

/**
 * struct refgpu_ctx - a context: one scheduler entity on one engine
 */
struct refgpu_ctx {
	struct kref ref;
	struct refgpu_device *rdev;
	u32 id;
	u32 engine;
	struct drm_sched_entity entity;
	struct mutex submit_lock;	/* orders arm + push */
	bool destroyed;			/* under submit_lock: no more pushes */
	atomic_t guilty;		/* set by a hang or fault of its job */
	bool innocent;			/* a reset put its jobs into the ring again */
	u32 fault_status;
	u64 fault_addr;
	u64 guilty_seqno;		/* the culprit's SUBMIT seqno, set before guilty */
	/*
	 * Engine resets that had its jobs in the ring (guilty or innocent),
	 * for CTX_QUERY: other clients' resets are not its business. Written
	 * by its engine's timeout handler only; @reset_mark is the engine's
	 * &refgpu_engine.resets when it was last counted.
	 */
	u32 resets;
	u64 reset_mark;
	struct refgpu_vm *vm;		/* reference */
};

/**
 * struct refgpu_job - one SUBMIT
 */
struct refgpu_job {
	/*
	 * The hardware fence, in the job's own allocation and first in it
	 * (refgpu_job_create() checks): once run_job has initialised it
	 * (base.ops set), the allocation is the fence's, freed by DRM core's
	 * dma_fence_free() (kfree_rcu() of the fence's address, the job's)
	 * with the fence's last reference; the job holds one until it is
	 * done with its fields (refgpu_job_put_work()). Never initialised,
	 * the job is plain memory. One allocation per job instead of two.
	 */
	struct refgpu_fence hw_fence_mem;
	struct drm_sched_job base;
	struct refgpu_ctx *ctx;		/* reference */
	struct refgpu_vm *vm;		/* reference */
	u64 ib_va;
	u32 ib_dw;
	/* &@hw_fence_mem: initialised (base.ops set) by run_job. */
	struct refgpu_fence *hw_fence;
	struct work_struct put_work;	/* drops @ctx and @vm, on refgpu_put_wq */
};

#define to_refgpu_job(j) container_of(j, struct refgpu_job, base)

/*
 * Where a freed job drops its context and VM: a VM holds a reference on
 * the DRM device (drm_gpuvm), so the device's release, which finishes the
 * schedulers, may run there, never in a scheduler's own work. Drained
 * when the module goes.
 */
extern struct workqueue_struct *refgpu_put_wq;

/* Register access on the ivshmem register page (docs/refgpu.md 2.3). */
static inline u32 rg_read(struct refgpu_device *rdev, u32 off)
{
	return READ_ONCE(rdev->regs[off / 4]);
}

static inline void rg_write(struct refgpu_device *rdev, u32 off, u32 val)
{
	WRITE_ONCE(rdev->regs[off / 4], val);
}

static inline u32 rg_eread(struct refgpu_device *rdev, u32 e, u32 off)
{
	return rg_read(rdev, REFGPU_ENGINE_BASE(e) + off);
}

static inline void rg_ewrite(struct refgpu_device *rdev, u32 e, u32 off, u32 val)
{
	rg_write(rdev, REFGPU_ENGINE_BASE(e) + off, val);
}

/**
 * refgpu_hw_enter() - start a section that touches the device
 * @rdev: the device
 * @idx: cookie for drm_dev_exit()
 *
 * Outside probe and remove, the registers and doorbells are touched only
 * between refgpu_hw_enter() and drm_dev_exit(@idx): remove waits for such
 * sections (drm_dev_unplug()) before it stops the device, and its BARs are
 * unmapped once remove returns, while clients may keep the device open.
 * Sections nest, but an inner one is refused once remove has started,
 * like a new one: every caller handles the refusal (refgpu_gone_error()). The interrupt handlers are
 * the exception: remove frees them before the BARs go.
 *
 * Return: false when the device is removed or lost: nothing to touch.
 */
static inline bool refgpu_hw_enter(struct refgpu_device *rdev, int *idx)
{
	return !READ_ONCE(rdev->lost) && drm_dev_enter(&rdev->drm, idx);
}

/**
 * refgpu_gone_error() - the error of work a removed or lost device will not run
 * @rdev: the device
 *
 * As drm-uapi.rst has it: -ENODEV once the device is unplugged (unbind,
 * hot-unplug, module unload), -EIO while it is present but lost (it
 * stopped answering).
 */
static inline int refgpu_gone_error(struct refgpu_device *rdev)
{
	return drm_dev_is_unplugged(&rdev->drm) ? -ENODEV : -EIO;
}

void refgpu_doorbell(struct refgpu_device *rdev, u32 vector);
int refgpu_hw_control(struct refgpu_device *rdev);
bool refgpu_engine_idle(struct refgpu_engine *eng);
int refgpu_engine_hw_reset(struct refgpu_engine *eng, int error);
int refgpu_engine_hw_reset_locked(struct refgpu_engine *eng, int error);
int refgpu_engine_drain_locked(struct refgpu_engine *eng);
int refgpu_engine_write_root(struct refgpu_engine *eng, u64 root);

/* refgpu_gem.c */
struct drm_gem_object *refgpu_gem_create_object(struct drm_device *dev, size_t size);
struct drm_gem_object *refgpu_gem_prime_import_sg_table(struct drm_device *dev,
							struct dma_buf_attachment *attach,
							struct sg_table *sgt);
int refgpu_ioctl_bo_create(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_ioctl_bo_mmap_offset(struct drm_device *dev, void *data, struct drm_file *file);
struct sg_table *refgpu_gem_get_pages_sgt(struct refgpu_bo *bo);
void refgpu_gem_release_dma(struct refgpu_device *rdev);

/* refgpu_vm.c */
struct refgpu_pt *refgpu_pt_alloc(struct refgpu_device *rdev, int level);
void refgpu_pt_free(struct refgpu_device *rdev, struct refgpu_pt *pt, int level);
dma_addr_t refgpu_pt_dma(struct refgpu_pt *pt);
struct refgpu_vm *refgpu_vm_create(struct refgpu_device *rdev);
struct refgpu_vm *refgpu_vm_get(struct refgpu_vm *vm);
void refgpu_vm_put(struct refgpu_vm *vm);
u64 refgpu_vm_fence_value(struct refgpu_vm *vm, u32 engine);
pid_t refgpu_vm_pid(const struct refgpu_vm *vm);
const char *refgpu_vm_comm(const struct refgpu_vm *vm);
int refgpu_vm_peek(struct refgpu_vm *vm, u64 va, u32 *dst, u32 n);
dma_addr_t refgpu_vm_root_dma(struct refgpu_vm *vm);
int refgpu_ioctl_vm_bind(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_engine_set_root(struct refgpu_engine *eng, struct refgpu_vm *vm);
void refgpu_vm_release_kept(struct refgpu_device *rdev);
void refgpu_vm_release_dma(struct refgpu_device *rdev);
bool refgpu_vm_job_charge(struct refgpu_vm *vm, unsigned int n, unsigned int max);
void refgpu_vm_job_uncharge(struct refgpu_vm *vm, unsigned int n);
void refgpu_vm_count_kept(struct refgpu_device *rdev, u32 *vms, u32 *vas, u32 *pts);
int refgpu_debugfs_vms_show(struct seq_file *m, void *data);

/* refgpu_sched.c */
int refgpu_engine_init(struct refgpu_device *rdev, u32 e);
void refgpu_engine_fail_inflight(struct refgpu_engine *eng, int error);
void refgpu_engine_freeze(struct refgpu_engine *eng);
void refgpu_engine_ring_reset(struct refgpu_engine *eng, int error);
void refgpu_engine_free_ring(struct refgpu_engine *eng);
void refgpu_engine_irq(struct refgpu_engine *eng, u32 status);
void refgpu_file_ctx_fini(struct refgpu_file *rfile);
int refgpu_ioctl_ctx_create(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_ioctl_ctx_destroy(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_ioctl_ctx_query(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_ioctl_submit(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_ioctl_submit_batch(struct drm_device *dev, void *data, struct drm_file *file);
int refgpu_debugfs_engines_show(struct seq_file *m, void *data);
struct refgpu_file_stats *refgpu_file_stats_create(void);
void refgpu_file_stats_put(struct refgpu_file_stats *stats);
void refgpu_show_engine_fdinfo(struct drm_printer *p, struct refgpu_file *rfile);

/* refgpu_sync.c */

/*
 * Sync arrays this short are copied into storage of the caller (the stack,
 * a batch entry) instead of the heap: a SUBMIT with its one timeline
 * out-point allocates nothing for it but the timeline node.
 */
#define REFGPU_SYNCS_INLINE	2

/**
 * struct refgpu_out_syncs - the syncobjs an ioctl signals when it succeeds
 * @count: entries
 * @syncs: what userspace asked for (handle, timeline point), copied in
 * @objs: the syncobjs, looked up
 * @chains: a timeline node per entry with a point, allocated up front
 * @syncs_inline: @syncs for up to %REFGPU_SYNCS_INLINE entries
 * @objs_inline: @objs for as many
 * @chains_inline: @chains for as many
 *
 * Points into itself once initialised: not copied or moved until
 * refgpu_out_syncs_fini().
 */
struct refgpu_out_syncs {
	u32 count;
	struct drm_refgpu_sync *syncs;
	struct drm_syncobj **objs;
	struct dma_fence_chain **chains;
	struct drm_refgpu_sync syncs_inline[REFGPU_SYNCS_INLINE];
	struct drm_syncobj *objs_inline[REFGPU_SYNCS_INLINE];
	struct dma_fence_chain *chains_inline[REFGPU_SYNCS_INLINE];
};

int refgpu_copy_syncs(u64 uptr, u32 count, struct drm_refgpu_sync **out);
int refgpu_copy_syncs_into(u64 uptr, u32 count, struct drm_refgpu_sync *buf, u32 buf_len,
			   struct drm_refgpu_sync **out);
void refgpu_free_syncs(struct drm_refgpu_sync *s, const struct drm_refgpu_sync *buf);
int refgpu_check_obj_array(const struct drm_refgpu_obj_array *a, size_t size, u32 max);
int refgpu_copy_batch_syncs_into(const struct drm_refgpu_obj_array *a,
				 struct drm_refgpu_sync *buf, u32 buf_len,
				 struct drm_refgpu_sync **out);
int refgpu_out_syncs_init(struct refgpu_out_syncs *os, u64 uptr, u32 count);
int refgpu_out_syncs_init_batch(struct refgpu_out_syncs *os, const struct drm_refgpu_obj_array *a);
int refgpu_out_syncs_resolve(struct refgpu_out_syncs *os, struct drm_file *file);
void refgpu_out_syncs_signal(struct refgpu_out_syncs *os, struct dma_fence *fence);
void refgpu_out_syncs_fini(struct refgpu_out_syncs *os);

#endif /* __REFGPU_DRV_H__ */

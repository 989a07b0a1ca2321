// SPDX-License-Identifier: GPL-2.0 OR MIT
/* Copyright the refgpu authors */
/*
 * GPU virtual address spaces: one drm_gpuvm per open file, page tables in
 * the refgpu MMU format (docs/refgpu.md 3.2), VM_BIND.
 *
 * Every VM maps, besides what userspace binds, a kernel region at the top
 * of the packet address range: the three engine rings (read-only) and the
 * VM's own fence page (the ring's FENCE packets write there while a job
 * of this VM runs; the VM's jobs can write it too, so the driver never
 * trusts it). An engine runs one VM at a time (ENGINE_ROOT,
 * docs/refgpu.md 3.4), switched only while it is idle.
 *
 * VM_BIND is synchronous: the ioctl waits for its in-syncs, applies the
 * whole op array or nothing, invalidates the GPU's translations when a
 * valid entry changed, releases the unmapped pages, and signals its
 * out-syncs before returning.
 */

#include <linux/build_bug.h>
#include <linux/dma-fence.h>
#include <linux/dma-mapping.h>
#include <linux/highmem.h>
#include <linux/moduleparam.h>
#include <linux/scatterlist.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/seq_file.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include <drm/drm_debugfs.h>
#include <drm/drm_file.h>
#include <drm/drm_gem.h>
#include <drm/drm_syncobj.h>

#include "refgpu_drv.h"
#include "refgpu_trace.h"

#define REFGPU_VA_READ_ONLY	DRM_GPUVA_USERBITS

/* The page walks below step one CPU page per 4 KiB GPU page. */
static_assert(PAGE_SIZE == SZ_4K, "refgpu needs 4 KiB kernel pages");

/*
 * Page tables a VM may hold (the root and the kernel region's included):
 * VM_BIND fails with -ENOSPC rather than go past it. 16384 tables are
 * 64 MiB: a densely mapped 32 GiB, or 16,384 scattered 2 MiB regions.
 */
static unsigned int vm_max_pt_pages = 16384;
module_param(vm_max_pt_pages, uint, 0644);
MODULE_PARM_DESC(vm_max_pt_pages,
		 "page tables per VM, VM_BIND fails with ENOSPC past it (default 16384)");

/**
 * struct refgpu_pt - one 4 KiB page table
 * @cpu: kernel mapping of the 512 entries
 * @dma: its physical (DMA) address, as the GPU walks it
 * @parent: the table whose entry @index points here (NULL for a root)
 * @index: that entry
 * @used: valid entries (a table with none is freed, roots excepted)
 * @node: entry in &refgpu_vm.empty while @used is 0, then in a list of
 *	tables to free once the GPU's translations are invalidated
 * @next: tables of the next level (levels 0..2 only)
 */
struct refgpu_pt {
	u64 *cpu;
	dma_addr_t dma;
	struct refgpu_pt *parent;
	u32 index;
	u32 used;
	struct list_head node;
	struct refgpu_pt *next[];
};

/**
 * struct refgpu_vm - a GPU address space
 * @base: the drm_gpuvm tracking the user mappings
 * @ref: users (the file, contexts, jobs); the last one tears down
 * @rdev: the device
 * @lock: serialises VM_BIND and the page tables
 * @root: the level-0 page table
 * @pt_pages: page tables allocated
 * @empty: tables (not the root) that lost their last valid entry, or were
 *	created, during the VM_BIND under way: freed at its end if still empty
 * @fence_cpu: the fence page (one slot per engine)
 * @fence_dma: its physical address
 * @node: entry in &refgpu_device.vms
 * @engines: engines that may walk it (bit per engine, under
 *	&refgpu_device.hw_lock): set before ENGINE_ROOT is written, cleared
 *	once the device acknowledged a switch away
 * @kept: released while an engine may still walk it on a device that may
 *	run on (lost, or removed and not yet stopped): kept whole, under
 *	&refgpu_device.vms_lock, until remove has stopped the device
 * @jobs: jobs of the file's contexts not yet freed (SUBMIT's limit,
 *	refgpu_vm_job_charge())
 * @pid: the process that opened the file
 * @comm: its command name
 *
 * @root, the tables under it and the fence page are DMA memory of the
 * device: freed by remove (refgpu_vm_release_dma()) if the VM outlives
 * the device's binding, else with the VM.
 */
struct refgpu_vm {
	struct drm_gpuvm base;
	struct kref ref;
	struct refgpu_device *rdev;
	struct mutex lock;
	struct refgpu_pt *root;
	u32 pt_pages;
	struct list_head empty;
	u64 *fence_cpu;
	dma_addr_t fence_dma;
	struct list_head node;
	u32 engines;
	bool kept;
	atomic_t jobs;
	pid_t pid;
	char comm[TASK_COMM_LEN];
};

/**
 * struct refgpu_va - a mapping
 * @base: the drm_gpuva
 * @dead: chains it for release after the translations were invalidated
 *	(or in the preallocation pool before use)
 */
struct refgpu_va {
	struct drm_gpuva base;
	struct list_head dead;
};

static bool refgpu_in_window(struct refgpu_device *rdev, dma_addr_t dma, u64 len)
{
	return dma >= rdev->mem_base && dma - rdev->mem_base + len <= rdev->mem_size &&
	       dma + len <= BIT_ULL(48);
}

/*
 * @gfp is GFP_KERNEL_ACCOUNT for a VM's tables: charged to the memory
 * cgroup of the process that binds (dma-direct hands the flag to the page
 * allocator, and the charge goes with the page when it is freed).
 */
static struct refgpu_pt *__refgpu_pt_alloc(struct refgpu_device *rdev, int level, gfp_t gfp)
{
	size_t n = level < REFGPU_PT_LEVELS - 1 ? REFGPU_PT_ENTRIES : 0;
	struct refgpu_pt *pt;

	pt = kzalloc(struct_size(pt, next, n), gfp);
	if (!pt)
		return ERR_PTR(-ENOMEM);
	INIT_LIST_HEAD(&pt->node);
	pt->cpu = dma_alloc_coherent(rdev->drm.dev, SZ_4K, &pt->dma, gfp);
	if (!pt->cpu) {
		kfree(pt);
		return ERR_PTR(-ENOMEM);
	}
	if (!refgpu_in_window(rdev, pt->dma, SZ_4K)) {
		drm_err(&rdev->drm, "page table at %pad outside GPU memory\n", &pt->dma);
		dma_free_coherent(rdev->drm.dev, SZ_4K, pt->cpu, pt->dma);
		kfree(pt);
		return ERR_PTR(-ENOMEM);
	}
	return pt;
}

/* A table the device owns (the null root): not charged to anyone. */
struct refgpu_pt *refgpu_pt_alloc(struct refgpu_device *rdev, int level)
{
	return __refgpu_pt_alloc(rdev, level, GFP_KERNEL);
}

void refgpu_pt_free(struct refgpu_device *rdev, struct refgpu_pt *pt, int level)
{
	int i;

	if (!pt)
		return;
	if (level < REFGPU_PT_LEVELS - 1)
		for (i = 0; i < REFGPU_PT_ENTRIES; i++)
			refgpu_pt_free(rdev, pt->next[i], level + 1);
	dma_free_coherent(rdev->drm.dev, SZ_4K, pt->cpu, pt->dma);
	kfree(pt);
}

dma_addr_t refgpu_pt_dma(struct refgpu_pt *pt)
{
	return pt->dma;
}

static u32 refgpu_pt_index(u64 va, int level)
{
	return (va >> (39 - 9 * level)) & (REFGPU_PT_ENTRIES - 1);
}

/*
 * The level-3 table for @va; with @max, created on the way as long as the
 * VM holds fewer than @max tables (-ENOSPC past it). A new table is empty:
 * on &refgpu_vm.empty until an entry is made valid in it.
 */
static struct refgpu_pt *refgpu_vm_l3(struct refgpu_vm *vm, u64 va, u32 max)
{
	struct refgpu_pt *pt = vm->root;
	int level;

	lockdep_assert_held(&vm->lock);
	for (level = 0; level < REFGPU_PT_LEVELS - 1; level++) {
		u32 i = refgpu_pt_index(va, level);

		if (!pt->next[i]) {
			struct refgpu_pt *child;

			if (!max)
				return NULL;
			if (vm->pt_pages >= max)
				return ERR_PTR(-ENOSPC);
			child = __refgpu_pt_alloc(vm->rdev, level + 1, GFP_KERNEL_ACCOUNT);
			if (IS_ERR(child))
				return child;
			child->parent = pt;
			child->index = i;
			list_add_tail(&child->node, &vm->empty);
			pt->next[i] = child;
			pt->used++;
			list_del_init(&pt->node);
			vm->pt_pages++;
			/*
			 * An invalid entry made valid: no invalidation needed.
			 * The GPU may walk this table now (a job of the VM is
			 * running): the child's zeroed entries reach memory
			 * before the entry that points at them.
			 */
			dma_wmb();
			WRITE_ONCE(pt->cpu[i], child->dma | REFGPU_PTE_VALID | REFGPU_PTE_TABLE);
		}
		pt = pt->next[i];
	}
	return pt;
}

/*
 * Creates the tables for [va, va + size), up to @max tables in the VM;
 * nothing is mapped yet. On an error, the tables created stay on
 * &refgpu_vm.empty for refgpu_vm_detach_empty().
 */
static int refgpu_vm_prealloc_tables(struct refgpu_vm *vm, u64 va, u64 size, u32 max)
{
	u64 end = va + size;

	while (va < end) {
		struct refgpu_pt *l3 = refgpu_vm_l3(vm, va, max);

		if (IS_ERR(l3))
			return PTR_ERR(l3);
		va = round_down(va, SZ_2M) + SZ_2M;
		cond_resched();
	}
	return 0;
}

static void refgpu_vm_set_pte(struct refgpu_vm *vm, u64 va, u64 pte)
{
	struct refgpu_pt *l3 = refgpu_vm_l3(vm, va, 0);
	u32 i = refgpu_pt_index(va, 3);
	bool was;

	/* Tables were created by refgpu_vm_prealloc_tables(). */
	if (WARN_ON_ONCE(IS_ERR_OR_NULL(l3)))
		return;
	was = l3->cpu[i] & REFGPU_PTE_VALID;
	if (!was && (pte & REFGPU_PTE_VALID)) {
		l3->used++;
		list_del_init(&l3->node);
	} else if (was && !(pte & REFGPU_PTE_VALID) && !--l3->used) {
		list_add_tail(&l3->node, &vm->empty);
	}
	WRITE_ONCE(l3->cpu[i], pte);
}

/*
 * Unhooks the tables of &refgpu_vm.empty that are still empty, and the
 * parents they leave empty, onto @freed: the GPU may still hold the
 * entries that pointed at them until its translations are invalidated,
 * so they are freed only after that (refgpu_vm_free_tables()). Returns
 * whether an entry was cleared.
 */
static bool refgpu_vm_detach_empty(struct refgpu_vm *vm, struct list_head *freed)
{
	struct refgpu_pt *pt, *parent;
	bool cleared = false;

	lockdep_assert_held(&vm->lock);
	while ((pt = list_first_entry_or_null(&vm->empty, struct refgpu_pt, node))) {
		list_move_tail(&pt->node, freed);
		parent = pt->parent;
		WRITE_ONCE(parent->cpu[pt->index], 0);
		parent->next[pt->index] = NULL;
		vm->pt_pages--;
		cleared = true;
		if (!--parent->used && parent->parent)
			list_add_tail(&parent->node, &vm->empty);
	}
	return cleared;
}

/* Frees tables unhooked by refgpu_vm_detach_empty() (children already gone). */
static void refgpu_vm_free_tables(struct refgpu_device *rdev, struct list_head *freed)
{
	struct refgpu_pt *pt, *tmp;

	list_for_each_entry_safe(pt, tmp, freed, node) {
		list_del(&pt->node);
		dma_free_coherent(rdev->drm.dev, SZ_4K, pt->cpu, pt->dma);
		kfree(pt);
		cond_resched();
	}
}

static u64 refgpu_pte(dma_addr_t pa, bool read_only)
{
	return (pa & REFGPU_PTE_ADDR_MASK) | REFGPU_PTE_VALID | REFGPU_PTE_TABLE |
	       REFGPU_PTE_READ | (read_only ? 0 : REFGPU_PTE_WRITE) | REFGPU_PTE_CACHED;
}

/*
 * Every page of [offset, offset + size) of @sgt is GPU-reachable memory:
 * -EINVAL for an object the GPU cannot map (EFAULT is for user copies).
 */
static int refgpu_check_pages(struct refgpu_device *rdev, struct sg_table *sgt, u64 offset,
			      u64 size)
{
	struct sg_dma_page_iter iter;
	u64 done = 0;

	for_each_sgtable_dma_page(sgt, &iter, offset >> PAGE_SHIFT) {
		if (done >= size)
			break;
		if (!refgpu_in_window(rdev, sg_page_iter_dma_address(&iter), SZ_4K))
			return -EINVAL;
		done += SZ_4K;
	}
	return done >= size ? 0 : -EINVAL;
}

/* Maps [va, va + size) to the pages of @sgt from byte @offset. */
static int refgpu_vm_map_sgt(struct refgpu_vm *vm, u64 va, u64 size, struct sg_table *sgt,
			     u64 offset, bool read_only)
{
	struct sg_dma_page_iter iter;
	u64 skip = offset >> PAGE_SHIFT, done = 0;

	/*
	 * The GPU may walk the tables while a job of the VM runs: whatever
	 * was written to the pages and tables so far reaches memory before
	 * an entry that makes it reachable.
	 */
	dma_wmb();
	for_each_sgtable_dma_page(sgt, &iter, skip) {
		dma_addr_t pa = sg_page_iter_dma_address(&iter);

		if (done >= size)
			break;
		if (!refgpu_in_window(vm->rdev, pa, SZ_4K))
			return -EINVAL;
		refgpu_vm_set_pte(vm, va + done, refgpu_pte(pa, read_only));
		done += SZ_4K;
		cond_resched();
	}
	return done >= size ? 0 : -EINVAL;
}

static void refgpu_vm_clear(struct refgpu_vm *vm, u64 va, u64 size)
{
	u64 off;

	for (off = 0; off < size; off += SZ_4K) {
		refgpu_vm_set_pte(vm, va + off, 0);
		cond_resched();
	}
}

dma_addr_t refgpu_vm_root_dma(struct refgpu_vm *vm)
{
	return vm->root->dma;
}

/*
 * What the VM's fence slot of @engine holds: the sequence number of the
 * last ring FENCE the engine ran in this VM, unless the VM's own jobs
 * wrote something else there (the page is mapped writable in the VM).
 * For debugging only: completion is never read from it.
 */
u64 refgpu_vm_fence_value(struct refgpu_vm *vm, u32 engine)
{
	return READ_ONCE(vm->fence_cpu[REFGPU_FENCE_SLOT(engine) / 8]);
}

/* The process that created the VM (devcoredumps and logs name it). */
pid_t refgpu_vm_pid(const struct refgpu_vm *vm)
{
	return vm->pid;
}

const char *refgpu_vm_comm(const struct refgpu_vm *vm)
{
	return vm->comm;
}

/**
 * refgpu_vm_peek() - copies dwords of a VM's memory for a devcoredump
 * @vm: the VM
 * @va: GPU address of the first dword (4-byte aligned)
 * @dst: where the dwords go
 * @n: dwords to copy
 *
 * Translates @va through the page tables the driver wrote, as the GPU
 * does, and copies from the pages their entries point at: guest RAM in
 * [MEM_BASE, MEM_BASE + MEM_SIZE), read through kmap_local. Neither
 * allocates nor sleeps (the timeout handler runs it on the fence-signalling
 * path): while a VM_BIND holds the tables, nothing is copied.
 *
 * Return: the dwords copied, fewer than @n where a page is not mapped
 * (-ENOENT if that is the first), outside GPU memory (-ERANGE), or
 * -EBUSY while a VM_BIND holds the tables.
 */
int refgpu_vm_peek(struct refgpu_vm *vm, u64 va, u32 *dst, u32 n)
{
	u32 done = 0;
	int err = 0;

	if (!n)
		return 0;
	if (!mutex_trylock(&vm->lock))
		return -EBUSY;
	while (done < n) {
		struct refgpu_pt *l3 = refgpu_vm_l3(vm, va, 0);
		u32 off = offset_in_page(va);
		u32 k = min_t(u32, n - done, (PAGE_SIZE - off) / 4);
		dma_addr_t pa;
		void *page;
		u64 pte;

		pte = l3 ? READ_ONCE(l3->cpu[refgpu_pt_index(va, 3)]) : 0;
		if (!(pte & REFGPU_PTE_VALID)) {
			err = -ENOENT;
			break;
		}
		pa = pte & REFGPU_PTE_ADDR_MASK;
		if (!refgpu_in_window(vm->rdev, pa, PAGE_SIZE) || !pfn_valid(PHYS_PFN(pa))) {
			err = -ERANGE;
			break;
		}
		page = kmap_local_page(pfn_to_page(PHYS_PFN(pa)));
		memcpy(dst + done, page + off, 4 * k);
		kunmap_local(page);
		done += k;
		va += 4 * k;
	}
	mutex_unlock(&vm->lock);
	return done ? done : err;
}

/* ----- the bind context: validated ops, preallocations, deferred release */

struct refgpu_bind_op {
	struct drm_refgpu_vm_bind_op args;
	struct drm_gem_object *obj;		/* MAP: reference */
	struct sg_table *sgt;			/* MAP: the object's pages */
	struct drm_gpuvm_bo *vm_bo;		/* MAP: preallocated */
};

struct refgpu_bind_ctx {
	struct refgpu_vm *vm;
	struct refgpu_bind_op *op;		/* the op being applied */
	struct list_head pool;			/* preallocated refgpu_va */
	struct list_head dead;			/* removed, unlinked after invalidation */
	bool invalidate;
	int err;
};

static struct drm_gpuva *refgpu_bind_take_va(struct refgpu_bind_ctx *ctx)
{
	struct refgpu_va *va = list_first_entry_or_null(&ctx->pool, struct refgpu_va, dead);

	if (WARN_ON_ONCE(!va))
		return NULL;
	list_del_init(&va->dead);
	return &va->base;
}

static void refgpu_bind_bury(struct refgpu_bind_ctx *ctx, struct drm_gpuva *va)
{
	list_add_tail(&container_of(va, struct refgpu_va, base)->dead, &ctx->dead);
}

static int refgpu_sm_step_map(struct drm_gpuva_op *op, void *priv)
{
	struct refgpu_bind_ctx *ctx = priv;
	struct refgpu_bind_op *bop = ctx->op;
	struct refgpu_bo *bo = to_refgpu_bo(bop->obj);
	bool ro = bop->args.flags & REFGPU_VM_BIND_READ_ONLY;
	struct drm_gpuvm_bo *vm_bo;
	struct drm_gpuva *va;
	int ret;

	va = refgpu_bind_take_va(ctx);
	if (!va)
		return -ENOMEM;
	ret = refgpu_vm_map_sgt(ctx->vm, op->map.va.addr, op->map.va.range, bop->sgt,
				op->map.gem.offset, ro);
	if (ret) {
		/* Checked before: a BO page outside the GPU's memory window. */
		refgpu_vm_clear(ctx->vm, op->map.va.addr, op->map.va.range);
		list_add(&container_of(va, struct refgpu_va, base)->dead, &ctx->pool);
		return ret;
	}
	drm_gpuva_map(&ctx->vm->base, va, &op->map);
	if (ro)
		va->flags |= REFGPU_VA_READ_ONLY;
	mutex_lock(&bo->gpuva_lock);
	vm_bo = drm_gpuvm_bo_obtain_prealloc(bop->vm_bo);
	bop->vm_bo = NULL;
	drm_gpuva_link(va, vm_bo);
	drm_gpuvm_bo_put(vm_bo);
	mutex_unlock(&bo->gpuva_lock);
	return 0;
}

static int refgpu_sm_step_remap(struct drm_gpuva_op *op, void *priv)
{
	struct refgpu_bind_ctx *ctx = priv;
	struct drm_gpuva *old = op->remap.unmap->va;
	struct refgpu_bo *bo = to_refgpu_bo(old->gem.obj);
	struct drm_gpuva *prev = NULL, *next = NULL;
	u64 start = old->va.addr, end = old->va.addr + old->va.range;

	if (op->remap.prev) {
		prev = refgpu_bind_take_va(ctx);
		start = op->remap.prev->va.addr + op->remap.prev->va.range;
	}
	if (op->remap.next) {
		next = refgpu_bind_take_va(ctx);
		end = op->remap.next->va.addr;
	}
	if ((op->remap.prev && !prev) || (op->remap.next && !next))
		return -ENOMEM;

	refgpu_vm_clear(ctx->vm, start, end - start);
	ctx->invalidate = true;
	drm_gpuva_remap(prev, next, &op->remap);
	mutex_lock(&bo->gpuva_lock);
	if (prev) {
		prev->flags = old->flags;
		drm_gpuva_link(prev, old->vm_bo);
	}
	if (next) {
		next->flags = old->flags;
		drm_gpuva_link(next, old->vm_bo);
	}
	mutex_unlock(&bo->gpuva_lock);
	refgpu_bind_bury(ctx, old);
	return 0;
}

static int refgpu_sm_step_unmap(struct drm_gpuva_op *op, void *priv)
{
	struct refgpu_bind_ctx *ctx = priv;
	struct drm_gpuva *va = op->unmap.va;

	refgpu_vm_clear(ctx->vm, va->va.addr, va->va.range);
	ctx->invalidate = true;
	drm_gpuva_unmap(&op->unmap);
	refgpu_bind_bury(ctx, va);
	return 0;
}

/* Unlinks and frees the removed mappings: after the invalidation. */
static void refgpu_bind_release_dead(struct list_head *dead)
{
	struct refgpu_va *va, *tmp;

	list_for_each_entry_safe(va, tmp, dead, dead) {
		struct drm_gem_object *obj = va->base.gem.obj;

		/* Keep the object alive until its lock is dropped. */
		drm_gem_object_get(obj);
		mutex_lock(&to_refgpu_bo(obj)->gpuva_lock);
		drm_gpuva_unlink(&va->base);
		mutex_unlock(&to_refgpu_bo(obj)->gpuva_lock);
		drm_gem_object_put(obj);
		list_del(&va->dead);
		kfree(va);
	}
}

static void refgpu_gpuvm_free(struct drm_gpuvm *gpuvm)
{
	kfree(container_of(gpuvm, struct refgpu_vm, base));
}

static const struct drm_gpuvm_ops refgpu_gpuvm_ops = {
	.vm_free = refgpu_gpuvm_free,
	.sm_step_map = refgpu_sm_step_map,
	.sm_step_remap = refgpu_sm_step_remap,
	.sm_step_unmap = refgpu_sm_step_unmap,
};

/* ----- VM lifetime */

static int refgpu_vm_map_kernel(struct refgpu_vm *vm)
{
	struct refgpu_device *rdev = vm->rdev;
	u64 off;
	u32 e;
	int ret;

	for (e = 0; e < REFGPU_ENGINES; e++) {
		u64 va = REFGPU_KVA_RING(rdev, e);

		ret = refgpu_vm_prealloc_tables(vm, va, REFGPU_RING_SIZE, U32_MAX);
		if (ret)
			return ret;
		for (off = 0; off < REFGPU_RING_SIZE; off += SZ_4K)
			refgpu_vm_set_pte(vm, va + off,
					  refgpu_pte(rdev->engines[e].ring_dma + off, true));
	}
	ret = refgpu_vm_prealloc_tables(vm, REFGPU_KVA_FENCE(rdev), SZ_4K, U32_MAX);
	if (ret)
		return ret;
	refgpu_vm_set_pte(vm, REFGPU_KVA_FENCE(rdev), refgpu_pte(vm->fence_dma, false));
	return 0;
}

/* Frees the page tables and the fence page (once: remove may have already). */
static void refgpu_vm_free_hw(struct refgpu_vm *vm)
{
	struct refgpu_device *rdev = vm->rdev;

	refgpu_pt_free(rdev, vm->root, 0);
	vm->root = NULL;
	if (vm->fence_cpu)
		dma_free_coherent(rdev->drm.dev, SZ_4K, vm->fence_cpu, vm->fence_dma);
	vm->fence_cpu = NULL;
}

struct refgpu_vm *refgpu_vm_create(struct refgpu_device *rdev)
{
	struct drm_gem_object *r_obj;
	struct refgpu_vm *vm;
	int ret;

	vm = kzalloc(sizeof(*vm), GFP_KERNEL);
	if (!vm)
		return ERR_PTR(-ENOMEM);
	vm->rdev = rdev;
	kref_init(&vm->ref);
	mutex_init(&vm->lock);
	INIT_LIST_HEAD(&vm->empty);
	vm->pid = task_tgid_nr(current);
	get_task_comm(vm->comm, current);

	/* The VM's memory is charged to the process that opens the file. */
	vm->root = __refgpu_pt_alloc(rdev, 0, GFP_KERNEL_ACCOUNT);
	if (IS_ERR(vm->root)) {
		ret = PTR_ERR(vm->root);
		goto err_free;
	}
	vm->pt_pages = 1;
	vm->fence_cpu = dma_alloc_coherent(rdev->drm.dev, SZ_4K, &vm->fence_dma,
					   GFP_KERNEL_ACCOUNT);
	if (!vm->fence_cpu || !refgpu_in_window(rdev, vm->fence_dma, SZ_4K)) {
		ret = -ENOMEM;
		goto err_free_hw;
	}
	mutex_lock(&vm->lock);
	ret = refgpu_vm_map_kernel(vm);
	mutex_unlock(&vm->lock);
	if (ret)
		goto err_free_hw;

	r_obj = drm_gpuvm_resv_object_alloc(&rdev->drm);
	if (!r_obj) {
		ret = -ENOMEM;
		goto err_free_hw;
	}
	drm_gpuvm_init(&vm->base, "refgpu", 0, &rdev->drm, r_obj, REFGPU_VA_START,
		       rdev->kva_base - REFGPU_VA_START, 0, 0, &refgpu_gpuvm_ops);
	drm_gem_object_put(r_obj);

	mutex_lock(&rdev->vms_lock);
	list_add_tail(&vm->node, &rdev->vms);
	mutex_unlock(&rdev->vms_lock);
	atomic_inc(&rdev->vm_count);
	return vm;

err_free_hw:
	refgpu_vm_free_hw(vm);
err_free:
	mutex_destroy(&vm->lock);
	kfree(vm);
	return ERR_PTR(ret);
}

struct refgpu_vm *refgpu_vm_get(struct refgpu_vm *vm)
{
	kref_get(&vm->ref);
	return vm;
}

/*
 * Unmaps everything and frees the VM: no engine can reach it any more.
 * Its DMA memory is freed before it leaves &refgpu_device.vms, under
 * vms_lock: remove (refgpu_vm_release_dma()) either frees it itself or
 * finds it freed, never a VM between the two.
 */
static void refgpu_vm_destroy(struct refgpu_vm *vm)
{
	struct refgpu_device *rdev = vm->rdev;
	struct drm_gpuva *va, *next;
	LIST_HEAD(dead);

	mutex_lock(&rdev->vms_lock);
	mutex_lock(&vm->lock);
	drm_gpuvm_for_each_va_safe(va, next, &vm->base) {
		drm_gpuva_remove(va);
		list_add_tail(&container_of(va, struct refgpu_va, base)->dead, &dead);
	}
	refgpu_vm_free_hw(vm);
	mutex_unlock(&vm->lock);
	list_del(&vm->node);
	mutex_unlock(&rdev->vms_lock);
	refgpu_bind_release_dead(&dead);

	mutex_destroy(&vm->lock);
	atomic_dec(&rdev->vm_count);
	drm_gpuvm_put(&vm->base);
}

/**
 * refgpu_engine_set_root() - point an engine at a VM's page tables
 * @eng: the engine, every job in its ring ended (completed or failed)
 * @vm: the VM
 *
 * The root changes only once the engine is idle (RPTR == WPTR, not busy):
 * the FENCE after the last IB may still run through the old VM. An engine
 * that does not drain is reset first (refgpu_engine_drain_locked()).
 * The engine may walk @vm from the moment ENGINE_ROOT is written, and the
 * VM it leaves until the device acknowledges the switch: a failed switch
 * (the device is lost) leaves both marked in their &refgpu_vm.engines.
 *
 * Return: 0, -ENODEV (removed) or -EIO (lost).
 */
int refgpu_engine_set_root(struct refgpu_engine *eng, struct refgpu_vm *vm)
{
	struct refgpu_device *rdev = eng->rdev;
	struct refgpu_vm *old;
	int ret;

	mutex_lock(&rdev->hw_lock);
	ret = refgpu_engine_drain_locked(eng);
	if (!ret) {
		vm->engines |= BIT(eng->id);
		ret = refgpu_engine_write_root(eng, refgpu_vm_root_dma(vm));
	}
	if (!ret) {
		old = eng->cur_vm;
		if (old && old != vm)
			old->engines &= ~BIT(eng->id);
		spin_lock_irq(&eng->lock);
		eng->cur_vm = vm;
		spin_unlock_irq(&eng->lock);
	}
	mutex_unlock(&rdev->hw_lock);
	return ret;
}

/*
 * Points the engines that may walk @vm back at the null root, each once
 * it is idle (it may still run the FENCE after the VM's last IB); with
 * @stopped (the device runs nothing any more) only forgets @vm. Returns
 * whether an engine did not take the switch (it may still walk @vm).
 */
static bool refgpu_vm_detach(struct refgpu_vm *vm, bool stopped)
{
	struct refgpu_device *rdev = vm->rdev;
	bool attached = false;
	u32 e;

	for (e = 0; e < REFGPU_ENGINES; e++) {
		struct refgpu_engine *eng = &rdev->engines[e];

		mutex_lock(&rdev->hw_lock);
		if (vm->engines & BIT(e)) {
			if (!stopped && (refgpu_engine_drain_locked(eng) ||
					 refgpu_engine_write_root(eng, 0))) {
				attached = true;
			} else {
				vm->engines &= ~BIT(e);
				if (eng->cur_vm == vm) {
					spin_lock_irq(&eng->lock);
					eng->cur_vm = NULL;
					spin_unlock_irq(&eng->lock);
				}
			}
		}
		mutex_unlock(&rdev->hw_lock);
	}
	return attached;
}

/* The last reference: no job of this VM is left. */
static void refgpu_vm_release(struct kref *ref)
{
	struct refgpu_vm *vm = container_of(ref, struct refgpu_vm, ref);
	struct refgpu_device *rdev = vm->rdev;

	if (refgpu_vm_detach(vm, false)) {
		bool kept;

		/*
		 * The device did not take the switch (lost, or removed and not
		 * yet stopped) and may still walk this VM: keep all of it. Once
		 * kept, remove may free it at any time: not touched again.
		 */
		mutex_lock(&rdev->vms_lock);
		kept = !rdev->stopped;
		vm->kept = kept;
		mutex_unlock(&rdev->vms_lock);
		if (kept)
			return;
		refgpu_vm_detach(vm, true);
	}
	refgpu_vm_destroy(vm);
}

/**
 * refgpu_vm_release_kept() - free what a running device could still reach
 * @rdev: the device, just stopped by remove
 *
 * The mappings and page tables whose invalidation was not acknowledged
 * and the VMs an
 * engine could not be switched away from; from now on nothing is kept.
 * (They hold references on the DRM device: they cannot wait for its
 * release.)
 */
void refgpu_vm_release_kept(struct refgpu_device *rdev)
{
	struct refgpu_vm *vm, *tmp;
	LIST_HEAD(dead);
	LIST_HEAD(pts);
	LIST_HEAD(vms);

	mutex_lock(&rdev->vms_lock);
	rdev->stopped = true;
	list_splice_init(&rdev->kept_vas, &dead);
	list_splice_init(&rdev->kept_pts, &pts);
	list_for_each_entry_safe(vm, tmp, &rdev->vms, node)
		if (vm->kept)
			list_move_tail(&vm->node, &vms);
	mutex_unlock(&rdev->vms_lock);

	refgpu_bind_release_dead(&dead);
	refgpu_vm_free_tables(rdev, &pts);
	list_for_each_entry_safe(vm, tmp, &vms, node) {
		refgpu_vm_detach(vm, true);
		refgpu_vm_destroy(vm);
	}
}

/**
 * refgpu_vm_release_dma() - free the VMs' DMA memory at remove
 * @rdev: the device, stopped by remove (refgpu_vm_release_kept() done)
 *
 * The VMs of the files still open outlive the device's binding: their
 * page tables and fence pages (DMA memory of the device) are freed now,
 * the rest when the last reference goes (refgpu_vm_free_hw() then finds
 * nothing). Nothing walks or writes the tables any more: the engines are
 * stopped, and VM_BIND touches them only in a drm_dev_enter() section,
 * which drm_dev_unplug() waited for and refuses from now on.
 */
void refgpu_vm_release_dma(struct refgpu_device *rdev)
{
	struct refgpu_vm *vm;

	mutex_lock(&rdev->vms_lock);
	list_for_each_entry(vm, &rdev->vms, node) {
		mutex_lock(&vm->lock);
		refgpu_vm_free_hw(vm);
		mutex_unlock(&vm->lock);
	}
	mutex_unlock(&rdev->vms_lock);
}

/**
 * refgpu_vm_job_charge() - count new jobs against their file's limit
 * @vm: the file's VM (one per open file)
 * @n: the jobs (1 for SUBMIT, the batch's count for SUBMIT_BATCH)
 * @max: the jobs the file may have
 *
 * A job counts from SUBMIT until it is freed (its fence signalled and the
 * scheduler let go of it): queued, in a ring, or just ended.
 *
 * The limit may have been lowered below what the file holds: any count
 * that would pass @max refuses.
 *
 * Return: false, nothing counted, when the file would have more than @max.
 */
bool refgpu_vm_job_charge(struct refgpu_vm *vm, unsigned int n, unsigned int max)
{
	int old = atomic_read(&vm->jobs);

	do {
		if (n > max || (unsigned int)old > max - n)
			return false;
	} while (!atomic_try_cmpxchg(&vm->jobs, &old, old + n));
	return true;
}

/**
 * refgpu_vm_job_uncharge() - jobs counted by refgpu_vm_job_charge() are gone
 * @vm: their file's VM
 * @n: how many
 */
void refgpu_vm_job_uncharge(struct refgpu_vm *vm, unsigned int n)
{
	atomic_sub(n, &vm->jobs);
}

/**
 * refgpu_vm_count_kept() - what refgpu_vm_release_kept() would free
 * @rdev: the device
 * @vms: kept VMs
 * @vas: kept mappings
 * @pts: kept page tables (unhooked from a VM, outside the kept VMs)
 */
void refgpu_vm_count_kept(struct refgpu_device *rdev, u32 *vms, u32 *vas, u32 *pts)
{
	struct refgpu_vm *vm;

	*vms = 0;
	mutex_lock(&rdev->vms_lock);
	*vas = list_count_nodes(&rdev->kept_vas);
	*pts = list_count_nodes(&rdev->kept_pts);
	list_for_each_entry(vm, &rdev->vms, node)
		*vms += vm->kept;
	mutex_unlock(&rdev->vms_lock);
}

void refgpu_vm_put(struct refgpu_vm *vm)
{
	if (vm)
		kref_put(&vm->ref, refgpu_vm_release);
}

/* ----- VM_BIND */

static bool refgpu_ranges_overlap(u64 a, u64 as, u64 b, u64 bs)
{
	return a < b + bs && b < a + as;
}

static bool refgpu_range_covers(const struct drm_refgpu_vm_bind_op *u, u64 start, u64 end)
{
	return u->va <= start && end <= u->va + u->size;
}

/*
 * A MAP must land on free VA when it runs: each overlap with an existing
 * mapping, or with an earlier MAP of the array, must be covered by one
 * UNMAP that runs between the two. The cost grows with the mappings a MAP
 * overlaps times the array's length, so the walk yields the CPU and stops
 * for a fatal signal.
 */
/* Yields the CPU in a long check; true when the caller is being killed. */
static bool refgpu_bind_yield(void)
{
	cond_resched();
	return fatal_signal_pending(current);
}

static int refgpu_bind_check_overlaps(struct refgpu_vm *vm, struct refgpu_bind_op *ops, u32 count)
{
	u32 i, j, k;

	for (i = 0; i < count; i++) {
		const struct drm_refgpu_vm_bind_op *m = &ops[i].args;
		struct drm_gpuva *va;

		if (m->op != REFGPU_VM_BIND_OP_MAP)
			continue;
		drm_gpuvm_for_each_va_range(va, &vm->base, m->va, m->va + m->size) {
			u64 s = max(va->va.addr, m->va);
			u64 e = min(va->va.addr + va->va.range, m->va + m->size);
			bool covered = false;

			if (refgpu_bind_yield())
				return -EINTR;
			for (k = 0; k < i && !covered; k++)
				covered = ops[k].args.op == REFGPU_VM_BIND_OP_UNMAP &&
					  refgpu_range_covers(&ops[k].args, s, e);
			if (!covered)
				return -EEXIST;
		}
		for (j = 0; j < i; j++) {
			const struct drm_refgpu_vm_bind_op *p = &ops[j].args;
			bool covered = false;
			u64 s, e;

			if (refgpu_bind_yield())
				return -EINTR;
			if (p->op != REFGPU_VM_BIND_OP_MAP ||
			    !refgpu_ranges_overlap(p->va, p->size, m->va, m->size))
				continue;
			s = max(p->va, m->va);
			e = min(p->va + p->size, m->va + m->size);
			for (k = j + 1; k < i && !covered; k++)
				covered = ops[k].args.op == REFGPU_VM_BIND_OP_UNMAP &&
					  refgpu_range_covers(&ops[k].args, s, e);
			if (!covered)
				return -EEXIST;
		}
	}
	return 0;
}

/*
 * Checks one op's arguments and resolves its BO. Caller is in a
 * drm_dev_enter() section (the BO's pages are mapped for the device).
 */
static int refgpu_bind_prepare_op(struct refgpu_device *rdev, struct drm_file *file,
				  struct refgpu_bind_op *bop)
{
	const struct drm_refgpu_vm_bind_op *a = &bop->args;
	struct refgpu_bo *bo;
	u64 end;

	if (a->pad)
		return -EINVAL;
	if (!a->size || !IS_ALIGNED(a->va | a->size | a->bo_offset, SZ_4K))
		return -EINVAL;
	if (check_add_overflow(a->va, a->size, &end) || a->va < REFGPU_VA_START ||
	    end > rdev->kva_base)
		return -EINVAL;

	switch (a->op) {
	case REFGPU_VM_BIND_OP_UNMAP:
		if (a->flags || a->handle || a->bo_offset)
			return -EINVAL;
		return 0;
	case REFGPU_VM_BIND_OP_MAP:
		break;
	default:
		return -EINVAL;
	}

	if (a->flags & ~REFGPU_VM_BIND_OP_FLAGS_MASK)
		return -EINVAL;
	bop->obj = drm_gem_object_lookup(file, a->handle);
	if (!bop->obj)
		return -ENOENT;
	if (check_add_overflow(a->bo_offset, a->size, &end) || end > bop->obj->size)
		return -EINVAL;
	bo = to_refgpu_bo(bop->obj);
	if ((bo->flags & REFGPU_BO_GPU_READ_ONLY) && !(a->flags & REFGPU_VM_BIND_READ_ONLY))
		return -EACCES;
	bop->sgt = refgpu_gem_get_pages_sgt(bo);
	if (IS_ERR(bop->sgt))
		return PTR_ERR(bop->sgt);
	return refgpu_check_pages(rdev, bop->sgt, a->bo_offset, a->size);
}

int refgpu_ioctl_vm_bind(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_device *rdev = to_refgpu_device(dev);
	struct refgpu_file *rfile = file->driver_priv;
	struct refgpu_vm *vm = rfile->vm;
	struct drm_refgpu_vm_bind *args = data;
	struct drm_refgpu_sync *in = NULL;
	struct refgpu_out_syncs out;
	struct refgpu_bind_ctx ctx = { .vm = vm };
	struct refgpu_bind_op *ops = NULL;
	struct refgpu_va *va, *tmp;
	struct dma_fence *stub;
	bool invalidated = true, applied;
	LIST_HEAD(freed);
	u32 i, nva = 0;
	int ret, idx;

	INIT_LIST_HEAD(&ctx.pool);
	INIT_LIST_HEAD(&ctx.dead);
	if (args->flags)
		return -EINVAL;
	if (!args->op_count || args->op_count > REFGPU_MAX_BIND_OPS)
		return -EINVAL;
	/* It could not be told: an unmap would only pile up kept pages. */
	if (READ_ONCE(rdev->lost))
		return refgpu_gone_error(rdev);

	ret = refgpu_copy_syncs(args->in_syncs, args->in_sync_count, &in);
	if (ret)
		return ret;
	ret = refgpu_out_syncs_init(&out, args->out_syncs, args->out_sync_count);
	if (ret)
		goto out_free;

	ops = kvcalloc(args->op_count, sizeof(*ops), GFP_KERNEL);
	if (!ops) {
		ret = -ENOMEM;
		goto out_free;
	}
	/*
	 * Copied before any drm_dev_enter() section: a user page that never
	 * answers (userfaultfd, FUSE) would stall drm_dev_unplug() too.
	 */
	for (i = 0; i < args->op_count; i++) {
		struct drm_refgpu_vm_bind_op __user *u = u64_to_user_ptr(args->ops);

		if (copy_from_user(&ops[i].args, &u[i], sizeof(ops[i].args))) {
			ret = -EFAULT;
			goto out_free;
		}
	}
	/*
	 * The BOs' pages are mapped for the device, and the page tables
	 * written, only in drm_dev_enter() sections: remove frees both once
	 * it has unplugged the device (refgpu_gem_release_dma(),
	 * refgpu_vm_release_dma()). The in-syncs are waited for between the
	 * two sections, so that remove never waits for a fence.
	 */
	if (!drm_dev_enter(dev, &idx)) {
		ret = -ENODEV;
		goto out_free;
	}
	for (i = 0; i < args->op_count; i++) {
		ret = refgpu_bind_prepare_op(rdev, file, &ops[i]);
		if (ret)
			break;
		nva += ops[i].args.op == REFGPU_VM_BIND_OP_MAP ? 1 : 2;
	}
	drm_dev_exit(idx);
	if (ret)
		goto out_free;

	/* Out-syncs resolved (and timeline nodes allocated) before any change. */
	ret = refgpu_out_syncs_resolve(&out, file);
	if (ret)
		goto out_free;

	/* Ordering: wait for every in-sync first (interruptible). */
	for (i = 0; i < args->in_sync_count; i++) {
		struct dma_fence *f;

		ret = drm_syncobj_find_fence(file, in[i].handle, in[i].point, 0, &f);
		if (ret)
			goto out_free;
		ret = dma_fence_wait(f, true);
		dma_fence_put(f);
		if (ret)
			goto out_free;
	}

	for (i = 0; i < nva; i++) {
		va = kzalloc(sizeof(*va), GFP_KERNEL);
		if (!va) {
			ret = -ENOMEM;
			goto out_free;
		}
		list_add(&va->dead, &ctx.pool);
	}
	for (i = 0; i < args->op_count; i++) {
		if (ops[i].args.op != REFGPU_VM_BIND_OP_MAP)
			continue;
		ops[i].vm_bo = drm_gpuvm_bo_create(&vm->base, ops[i].obj);
		if (!ops[i].vm_bo) {
			ret = -ENOMEM;
			goto out_free;
		}
	}

	/* Refused once remove has started: the BOs' tables may be gone. */
	if (!drm_dev_enter(dev, &idx)) {
		ret = -ENODEV;
		goto out_free;
	}
	mutex_lock(&vm->lock);
	ret = refgpu_bind_check_overlaps(vm, ops, args->op_count);
	for (i = 0; !ret && i < args->op_count; i++)
		if (ops[i].args.op == REFGPU_VM_BIND_OP_MAP)
			ret = refgpu_vm_prealloc_tables(vm, ops[i].args.va, ops[i].args.size,
							READ_ONCE(vm_max_pt_pages));
	applied = !ret;
	/* Nothing below fails for valid, checked input. */
	for (i = 0; applied && i < args->op_count; i++) {
		const struct drm_refgpu_vm_bind_op *a = &ops[i].args;

		ctx.op = &ops[i];
		if (a->op == REFGPU_VM_BIND_OP_MAP)
			ret = drm_gpuvm_sm_map(&vm->base, &ctx, a->va, a->size, ops[i].obj,
					       a->bo_offset);
		else
			ret = drm_gpuvm_sm_unmap(&vm->base, &ctx, a->va, a->size);
		if (WARN_ON(ret))
			break;
		trace_refgpu_bind(file, vm, a, ops[i].obj ? ops[i].obj->size : 0);
	}
	/*
	 * The tables the unmaps left empty, and those a failed call created,
	 * are unhooked now and freed once the GPU can no longer walk them: a
	 * failed call leaves the VM as it was, its table count included.
	 */
	if (refgpu_vm_detach_empty(vm, &freed))
		ctx.invalidate = true;
	if (ctx.invalidate) {
		int hw_idx;

		mutex_lock(&rdev->hw_lock);
		invalidated = refgpu_hw_enter(rdev, &hw_idx);
		if (invalidated) {
			invalidated = !refgpu_hw_control(rdev);
			drm_dev_exit(hw_idx);
		}
		mutex_unlock(&rdev->hw_lock);
	}
	mutex_unlock(&vm->lock);
	if (!invalidated) {
		/*
		 * The device may still reach the pages and tables through
		 * stale translations (lost, or removed and not yet stopped):
		 * they stay until remove has stopped it. The unmap itself is
		 * done.
		 */
		mutex_lock(&rdev->vms_lock);
		if (!rdev->stopped) {
			list_splice_tail_init(&ctx.dead, &rdev->kept_vas);
			list_splice_tail_init(&freed, &rdev->kept_pts);
		}
		mutex_unlock(&rdev->vms_lock);
	}
	refgpu_bind_release_dead(&ctx.dead);
	refgpu_vm_free_tables(rdev, &freed);
	drm_dev_exit(idx);
	if (!applied)
		goto out_free;

	stub = dma_fence_get_stub();
	refgpu_out_syncs_signal(&out, stub);
	dma_fence_put(stub);

out_free:
	list_for_each_entry_safe(va, tmp, &ctx.pool, dead)
		kfree(va);
	for (i = 0; ops && i < args->op_count; i++) {
		if (ops[i].vm_bo) {
			struct refgpu_bo *bo = to_refgpu_bo(ops[i].obj);

			mutex_lock(&bo->gpuva_lock);
			drm_gpuvm_bo_put(ops[i].vm_bo);
			mutex_unlock(&bo->gpuva_lock);
		}
		if (ops[i].obj)
			drm_gem_object_put(ops[i].obj);
	}
	refgpu_out_syncs_fini(&out);
	kvfree(ops);
	kvfree(in);
	return ret;
}

int refgpu_debugfs_vms_show(struct seq_file *m, void *data)
{
	struct drm_debugfs_entry *entry = m->private;
	struct refgpu_device *rdev = to_refgpu_device(entry->dev);
	struct refgpu_vm *vm;
	u32 e;

	mutex_lock(&rdev->vms_lock);
	list_for_each_entry(vm, &rdev->vms, node) {
		seq_printf(m, "vm %p pid %d (%s) root %pad pt_pages %u fences", vm, vm->pid,
			   vm->comm, &vm->root->dma, vm->pt_pages);
		for (e = 0; e < REFGPU_ENGINES; e++)
			seq_printf(m, " %llu", refgpu_vm_fence_value(vm, e));
		seq_puts(m, "\n");
		mutex_lock(&vm->lock);
		drm_debugfs_gpuva_info(m, &vm->base);
		mutex_unlock(&vm->lock);
	}
	mutex_unlock(&rdev->vms_lock);
	return 0;
}

// SPDX-License-Identifier: GPL-2.0 OR MIT
/* Copyright the refgpu authors */
/*
 * refgpu: DRM driver for the reference GPU of docs/refgpu.md, bound to
 * QEMU's ivshmem-doorbell device through the refgpu ivshmem binding
 * (docs/refgpu.md 2.3). docs/linux.md describes the design and the uAPI.
 */

#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/iopoll.h>
#include <linux/module.h>
#include <linux/pci.h>

#include <drm/drm_debugfs.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_gem.h>
#include <drm/drm_ioctl.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>

#include "refgpu_drv.h"

#define REFGPU_HW_TIMEOUT_US	(1000 * 1000)
/* An engine whose jobs have completed is idle within microseconds. */
#define REFGPU_DRAIN_TIMEOUT_US	(100 * 1000)

/**
 * refgpu_doorbell() - ring an ivshmem doorbell of the model
 * @rdev: the device
 * @vector: 0..2 an engine, 3 the control doorbell
 *
 * Every earlier write to the register page and to memory is made visible
 * before the doorbell (the model reacts to the doorbell only).
 */
void refgpu_doorbell(struct refgpu_device *rdev, u32 vector)
{
	mb();
	iowrite32((rdev->model_peer << 16) | vector,
		  rdev->bar0 + REFGPU_IVSHMEM_DOORBELL);
}

/**
 * refgpu_hw_control() - apply control registers and wait until applied
 * @rdev: the device
 *
 * Rings the control doorbell with MMU_INVALIDATE set and waits for the
 * model to clear it: the model applies CTRL, IRQ_MASK, MMU_* and
 * ENGINE_ROOT before it clears MMU_INVALIDATE, so a return of 0 means all
 * of them are in effect. Caller holds &refgpu_device.hw_lock and is in a
 * refgpu_hw_enter() section (or in probe or remove).
 *
 * Return: 0, or -EIO when the device does not answer (it is then lost) or
 * was lost before.
 */
int refgpu_hw_control(struct refgpu_device *rdev)
{
	u32 val;
	int ret;

	lockdep_assert_held(&rdev->hw_lock);
	if (rdev->lost)
		return -EIO;
	/* The invalidate doubles as the completion marker of the doorbell. */
	rg_write(rdev, REFGPU_MMU_INVALIDATE, 1);
	refgpu_doorbell(rdev, REFGPU_CONTROL_VECTOR);
	ret = read_poll_timeout(rg_read, val, val == 0, 10, REFGPU_HW_TIMEOUT_US,
				false, rdev, REFGPU_MMU_INVALIDATE);
	if (ret) {
		drm_err(&rdev->drm, "device lost: MMU_INVALIDATE not acknowledged\n");
		WRITE_ONCE(rdev->lost, true);
		return -EIO;
	}
	return 0;
}

/**
 * refgpu_engine_hw_reset_locked() - reset one engine (docs/refgpu.md 4.5)
 * @eng: the engine
 * @error: the error of the fences still in its ring
 *
 * RING_BASE, RING_SIZE, CTRL.ENABLE, IRQ_MASK and ENGINE_ROOT are kept by
 * the device; RPTR and WPTR become 0. RPTR is not read from before the
 * reset until the ring's fences have failed with @error and the ring
 * starts again at offset 0 (refgpu_engine_ring_reset()): a read in
 * between would take the new 0 for progress through the old ring.
 * Caller holds &refgpu_device.hw_lock.
 *
 * Return: 0, or the error the fences failed with instead of @error: -ENODEV
 * when the device is removed, -EIO when it is lost or the reset does not
 * complete (it is then lost).
 */
int refgpu_engine_hw_reset_locked(struct refgpu_engine *eng, int error)
{
	struct refgpu_device *rdev = eng->rdev;
	u32 val;
	int ret, idx;

	lockdep_assert_held(&rdev->hw_lock);
	if (!refgpu_hw_enter(rdev, &idx)) {
		/* Nothing in the ring can be trusted to complete any more. */
		ret = refgpu_gone_error(rdev);
		refgpu_engine_fail_inflight(eng, ret);
		return ret;
	}
	refgpu_engine_freeze(eng);
	rg_ewrite(rdev, eng->id, REFGPU_CTRL, REFGPU_CTRL_ENABLE | REFGPU_CTRL_RESET);
	refgpu_doorbell(rdev, REFGPU_CONTROL_VECTOR);
	ret = read_poll_timeout(rg_eread, val, !(val & REFGPU_CTRL_RESET), 10,
				REFGPU_HW_TIMEOUT_US, false, rdev, eng->id, REFGPU_CTRL);
	if (ret) {
		drm_err(&rdev->drm, "device lost: engine %u reset did not complete\n", eng->id);
		WRITE_ONCE(rdev->lost, true);
		ret = -EIO;
	}
	refgpu_engine_ring_reset(eng, ret ?: error);
	eng->resets++;
	atomic64_inc(&rdev->reset_count);
	drm_dev_exit(idx);
	return ret;
}

/**
 * refgpu_engine_hw_reset() - reset one engine
 * @eng: the engine
 * @error: the error of the fences still in its ring
 *
 * Takes &refgpu_device.hw_lock; see refgpu_engine_hw_reset_locked().
 *
 * Return: as refgpu_engine_hw_reset_locked().
 */
int refgpu_engine_hw_reset(struct refgpu_engine *eng, int error)
{
	int ret;

	mutex_lock(&eng->rdev->hw_lock);
	ret = refgpu_engine_hw_reset_locked(eng, error);
	mutex_unlock(&eng->rdev->hw_lock);
	return ret;
}

/**
 * refgpu_engine_idle() - whether an engine has nothing left to execute
 * @eng: the engine
 *
 * Idle is RPTR == WPTR with STATUS.BUSY clear (docs/refgpu.md 3.4): the
 * last packet has completed, not only been fetched. A halted engine is not
 * idle. Caller is in a refgpu_hw_enter() section.
 */
bool refgpu_engine_idle(struct refgpu_engine *eng)
{
	struct refgpu_device *rdev = eng->rdev;

	return !(rg_eread(rdev, eng->id, REFGPU_STATUS) &
		 (REFGPU_STATUS_BUSY | REFGPU_STATUS_HALTED)) &&
	       rg_eread(rdev, eng->id, REFGPU_RING_RPTR) ==
	       rg_eread(rdev, eng->id, REFGPU_RING_WPTR);
}

/**
 * refgpu_engine_drain_locked() - make an engine idle before its root changes
 * @eng: the engine, whose jobs have all completed or failed
 *
 * A job completes when its IB has ended; the FENCE packet after it may
 * still be executing, through the VM the engine runs. That takes
 * microseconds: an engine that does not drain within
 * %REFGPU_DRAIN_TIMEOUT_US is out of order and is reset (what was still in
 * its ring, if anything, fails with -EIO), so the root of another VM is
 * never written while the engine may execute work of the one it leaves.
 * Caller holds &refgpu_device.hw_lock.
 *
 * Return: 0 (idle), -ENODEV (removed) or -EIO (lost).
 */
int refgpu_engine_drain_locked(struct refgpu_engine *eng)
{
	struct refgpu_device *rdev = eng->rdev;
	bool idle;
	int idx;

	lockdep_assert_held(&rdev->hw_lock);
	if (!refgpu_hw_enter(rdev, &idx))
		return refgpu_gone_error(rdev);
	if (read_poll_timeout(refgpu_engine_idle, idle, idle, 10, REFGPU_DRAIN_TIMEOUT_US,
			      false, eng)) {
		drm_err(&rdev->drm,
			"engine %u not idle before an address-space switch (RPTR %#x WPTR %#x STATUS %#x), resetting\n",
			eng->id, rg_eread(rdev, eng->id, REFGPU_RING_RPTR),
			rg_eread(rdev, eng->id, REFGPU_RING_WPTR),
			rg_eread(rdev, eng->id, REFGPU_STATUS));
		drm_dev_exit(idx);
		return refgpu_engine_hw_reset_locked(eng, -EIO);
	}
	drm_dev_exit(idx);
	return 0;
}

/**
 * refgpu_engine_write_root() - point an idle engine at a page-table root
 * @eng: the engine
 * @root: DMA address of the root, 0 for the null root (MMU_ROOT)
 *
 * Caller holds &refgpu_device.hw_lock.
 *
 * Return: 0, -ENODEV (removed) or -EIO (lost).
 */
int refgpu_engine_write_root(struct refgpu_engine *eng, u64 root)
{
	struct refgpu_device *rdev = eng->rdev;
	int ret, idx;

	lockdep_assert_held(&rdev->hw_lock);
	if (!refgpu_hw_enter(rdev, &idx))
		return refgpu_gone_error(rdev);
	rg_write(rdev, REFGPU_ENGINE_ROOT_LO(eng->id), lower_32_bits(root));
	rg_write(rdev, REFGPU_ENGINE_ROOT_HI(eng->id), upper_32_bits(root));
	ret = refgpu_hw_control(rdev);
	drm_dev_exit(idx);
	return ret;
}

static irqreturn_t refgpu_irq(int irq, void *arg)
{
	struct refgpu_engine *eng = arg;
	struct refgpu_device *rdev = eng->rdev;
	u32 bits = REFGPU_IRQ_FENCE(eng->id) | REFGPU_IRQ_FAULT(eng->id);
	u32 status;

	/* Clear with an atomic AND of the complement (the ivshmem binding). */
	status = atomic_fetch_andnot(bits, (atomic_t *)&rdev->regs[REFGPU_IRQ_STATUS / 4]);
	status &= bits;
	if (!status)
		return IRQ_NONE;
	refgpu_engine_irq(eng, status);
	return IRQ_HANDLED;
}

static int refgpu_ioctl_get_param(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct refgpu_device *rdev = to_refgpu_device(dev);
	struct drm_refgpu_get_param *args = data;

	if (args->pad)
		return -EINVAL;

	switch (args->param) {
	case REFGPU_PARAM_CHIP_ID:
		args->value = rdev->chip_id;
		break;
	case REFGPU_PARAM_GENERATION:
		args->value = rdev->gen;
		break;
	case REFGPU_PARAM_ENGINE_COUNT:
		args->value = REFGPU_ENGINES;
		break;
	case REFGPU_PARAM_VA_START:
		args->value = REFGPU_VA_START;
		break;
	case REFGPU_PARAM_VA_END:
		args->value = rdev->kva_base;
		break;
	case REFGPU_PARAM_IB_MAX_DWORDS:
		args->value = rdev->ib_max_dw;
		break;
	case REFGPU_PARAM_IB_ALIGN:
		args->value = rdev->ib_align;
		break;
	case REFGPU_PARAM_VA_BITS:
		args->value = rdev->va_bits;
		break;
	case REFGPU_PARAM_PAGE_SIZE:
		args->value = SZ_4K;
		break;
	case REFGPU_PARAM_MAX_BIND_OPS:
		args->value = REFGPU_MAX_BIND_OPS;
		break;
	case REFGPU_PARAM_MAX_SYNCS:
		args->value = REFGPU_MAX_SYNCS;
		break;
	case REFGPU_PARAM_JOB_TIMEOUT_MS:
		args->value = jiffies_to_msecs(rdev->engines[0].period);
		break;
	case REFGPU_PARAM_MAX_BATCH_JOBS:
		args->value = REFGPU_MAX_BATCH_JOBS;
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

/*
 * The VM's page tables and fence page are DMA memory of the device: made
 * in a drm_dev_enter() section, so that an open racing remove either
 * fails or has its VM on the device's list before remove frees the VMs'
 * DMA memory (refgpu_vm_release_dma()).
 */
static int refgpu_open(struct drm_device *dev, struct drm_file *file)
{
	struct refgpu_device *rdev = to_refgpu_device(dev);
	struct refgpu_file *rfile;
	int ret = 0, idx;

	if (!drm_dev_enter(dev, &idx))
		return -ENODEV;
	rfile = kzalloc(sizeof(*rfile), GFP_KERNEL);
	if (!rfile) {
		ret = -ENOMEM;
		goto out_exit;
	}
	rfile->rdev = rdev;
	xa_init_flags(&rfile->ctxs, XA_FLAGS_ALLOC1);
	rfile->stats = refgpu_file_stats_create();
	if (!rfile->stats) {
		ret = -ENOMEM;
		kfree(rfile);
		goto out_exit;
	}
	rfile->vm = refgpu_vm_create(rdev);
	if (IS_ERR(rfile->vm)) {
		ret = PTR_ERR(rfile->vm);
		refgpu_file_stats_put(rfile->stats);
		kfree(rfile);
		goto out_exit;
	}
	file->driver_priv = rfile;
out_exit:
	drm_dev_exit(idx);
	return ret;
}

static void refgpu_postclose(struct drm_device *dev, struct drm_file *file)
{
	struct refgpu_file *rfile = file->driver_priv;

	refgpu_file_ctx_fini(rfile);
	xa_destroy(&rfile->ctxs);
	refgpu_vm_put(rfile->vm);
	/* Jobs still running keep the stats (their fences hold them). */
	refgpu_file_stats_put(rfile->stats);
	kfree(rfile);
}

/*
 * fdinfo (docs/linux.md, "fdinfo"): DRM core prints drm-driver,
 * drm-client-id and drm-pdev, then this the engines' busy time and the
 * memory of the file's buffer objects.
 */
static void refgpu_show_fdinfo(struct drm_printer *p, struct drm_file *file)
{
	refgpu_show_engine_fdinfo(p, file->driver_priv);
	drm_show_memory_stats(p, file);
}

static const struct drm_ioctl_desc refgpu_ioctls[] = {
#define REFGPU_IOCTL(n, func) \
	DRM_IOCTL_DEF_DRV(REFGPU_##n, refgpu_ioctl_##func, DRM_RENDER_ALLOW)
	REFGPU_IOCTL(GET_PARAM, get_param),
	REFGPU_IOCTL(BO_CREATE, bo_create),
	REFGPU_IOCTL(BO_MMAP_OFFSET, bo_mmap_offset),
	REFGPU_IOCTL(VM_BIND, vm_bind),
	REFGPU_IOCTL(CTX_CREATE, ctx_create),
	REFGPU_IOCTL(CTX_DESTROY, ctx_destroy),
	REFGPU_IOCTL(SUBMIT, submit),
	REFGPU_IOCTL(CTX_QUERY, ctx_query),
	REFGPU_IOCTL(SUBMIT_BATCH, submit_batch),
#undef REFGPU_IOCTL
};

static const struct file_operations refgpu_fops = {
	.owner = THIS_MODULE,
	DRM_GEM_FOPS,
	.show_fdinfo = drm_show_fdinfo,
};

static int refgpu_debugfs_counts_show(struct seq_file *m, void *data)
{
	struct drm_debugfs_entry *entry = m->private;
	struct refgpu_device *rdev = to_refgpu_device(entry->dev);
	u32 kept_vms, kept_vas, kept_pts;

	seq_printf(m, "bos %d\n", atomic_read(&rdev->bo_count));
	seq_printf(m, "vms %d\n", atomic_read(&rdev->vm_count));
	seq_printf(m, "contexts %d\n", atomic_read(&rdev->ctx_count));
	seq_printf(m, "jobs %d\n", atomic_read(&rdev->job_count));
	seq_printf(m, "resets %lld\n", atomic64_read(&rdev->reset_count));
	seq_printf(m, "lost %d\n", READ_ONCE(rdev->lost));
	refgpu_vm_count_kept(rdev, &kept_vms, &kept_vas, &kept_pts);
	seq_printf(m, "kept_vms %u\n", kept_vms);
	seq_printf(m, "kept_mappings %u\n", kept_vas);
	seq_printf(m, "kept_page_tables %u\n", kept_pts);
	return 0;
}

static const struct drm_debugfs_info refgpu_debugfs_list[] = {
	{ "counts", refgpu_debugfs_counts_show, 0 },
	{ "engines", refgpu_debugfs_engines_show, 0 },
	{ "vms", refgpu_debugfs_vms_show, 0 },
};

static const struct drm_driver refgpu_drm_driver = {
	.driver_features = DRIVER_GEM | DRIVER_RENDER | DRIVER_SYNCOBJ |
			   DRIVER_SYNCOBJ_TIMELINE | DRIVER_GEM_GPUVA,
	.open = refgpu_open,
	.postclose = refgpu_postclose,
	.show_fdinfo = refgpu_show_fdinfo,
	.ioctls = refgpu_ioctls,
	.num_ioctls = ARRAY_SIZE(refgpu_ioctls),
	.fops = &refgpu_fops,
	.gem_create_object = refgpu_gem_create_object,
	.gem_prime_import_sg_table = refgpu_gem_prime_import_sg_table,
	.name = "refgpu",
	.desc = "reference GPU",
	.date = "20250101",
	.major = 1,
	.minor = 1,	/* 1: SUBMIT_BATCH, PARAM_MAX_BATCH_JOBS */
};

static int refgpu_read_info(struct refgpu_device *rdev)
{
	struct device *dev = &rdev->pdev->dev;
	u32 *info = rdev->regs + REFGPU_INFO_PAGE / 4;
	u32 id;

	if (READ_ONCE(info[0]) != REFGPU_INFO_MAGIC ||
	    READ_ONCE(info[REFGPU_INFO_VERSION / 4]) != 1) {
		dev_err(dev, "no refgpu binding info page (magic %#x)\n", READ_ONCE(info[0]));
		return -ENODEV;
	}
	if (READ_ONCE(info[REFGPU_INFO_VECTORS / 4]) < REFGPU_VECTORS) {
		dev_err(dev, "the model has %u vectors, %u needed\n",
			READ_ONCE(info[REFGPU_INFO_VECTORS / 4]), REFGPU_VECTORS);
		return -ENODEV;
	}
	rdev->model_peer = READ_ONCE(info[REFGPU_INFO_MODEL_PEER / 4]);
	rdev->mem_base = READ_ONCE(info[REFGPU_INFO_MEM_BASE / 4]) |
			 (u64)READ_ONCE(info[REFGPU_INFO_MEM_BASE / 4 + 1]) << 32;
	rdev->mem_size = READ_ONCE(info[REFGPU_INFO_MEM_SIZE / 4]) |
			 (u64)READ_ONCE(info[REFGPU_INFO_MEM_SIZE / 4 + 1]) << 32;

	id = rg_read(rdev, REFGPU_ID);
	if (id >> 16 != REFGPU_ID_MAGIC || rg_read(rdev, REFGPU_ENGINE_COUNT_REG) != REFGPU_ENGINES) {
		dev_err(dev, "unexpected ID %#x / ENGINE_COUNT %u\n", id,
			rg_read(rdev, REFGPU_ENGINE_COUNT_REG));
		return -ENODEV;
	}
	rdev->chip_id = id;
	rdev->gen = (id >> 8) & 0xff;
	switch (rdev->gen) {
	case 1:
		rdev->va_bits = REFGPU_GEN1_VA_BITS;
		rdev->ib_max_dw = REFGPU_GEN1_IB_MAX_DW;
		rdev->ib_align = REFGPU_GEN1_IB_ALIGN;
		break;
	case 2:
		rdev->va_bits = REFGPU_GEN2_VA_BITS;
		rdev->ib_max_dw = REFGPU_GEN2_IB_MAX_DW;
		rdev->ib_align = REFGPU_GEN2_IB_ALIGN;
		break;
	default:
		dev_err(dev, "unknown generation %u\n", rdev->gen);
		return -ENODEV;
	}
	rdev->kva_base = BIT_ULL(rdev->va_bits) - REFGPU_KVA_SIZE;
	dev_info(dev, "refgpu gen%u rev %u, system memory [%#llx, %#llx), model peer %u\n",
		 rdev->gen, id & 0xff, rdev->mem_base, rdev->mem_base + rdev->mem_size,
		 rdev->model_peer);
	return 0;
}

static int refgpu_hw_init(struct refgpu_device *rdev)
{
	u64 root = refgpu_pt_dma(rdev->null_root);
	u32 e, val;
	int ret;

	mutex_lock(&rdev->hw_lock);
	rg_write(rdev, REFGPU_IRQ_MASK, 0);
	rg_write(rdev, REFGPU_MMU_ROOT_LO, lower_32_bits(root));
	rg_write(rdev, REFGPU_MMU_ROOT_HI, upper_32_bits(root));
	rg_write(rdev, REFGPU_MMU_CTRL, REFGPU_MMU_ENABLE);
	for (e = 0; e < REFGPU_ENGINES; e++) {
		u64 ring = REFGPU_KVA_RING(rdev, e);

		rg_write(rdev, REFGPU_ENGINE_ROOT_LO(e), 0);
		rg_write(rdev, REFGPU_ENGINE_ROOT_HI(e), 0);
		rg_ewrite(rdev, e, REFGPU_RING_BASE_LO, lower_32_bits(ring));
		rg_ewrite(rdev, e, REFGPU_RING_BASE_HI, upper_32_bits(ring));
		rg_ewrite(rdev, e, REFGPU_RING_SIZE_REG, REFGPU_RING_SIZE);
		rg_ewrite(rdev, e, REFGPU_CTRL, REFGPU_CTRL_ENABLE | REFGPU_CTRL_RESET);
	}
	ret = refgpu_hw_control(rdev);
	for (e = 0; !ret && e < REFGPU_ENGINES; e++)
		ret = read_poll_timeout(rg_eread, val, !(val & REFGPU_CTRL_RESET), 10,
					REFGPU_HW_TIMEOUT_US, false, rdev, e, REFGPU_CTRL);
	if (!ret) {
		atomic_set((atomic_t *)&rdev->regs[REFGPU_IRQ_STATUS / 4], 0);
		rg_write(rdev, REFGPU_IRQ_MASK, GENMASK(2, 0) | GENMASK(10, 8));
		ret = refgpu_hw_control(rdev);
	}
	mutex_unlock(&rdev->hw_lock);
	return ret;
}

static void refgpu_hw_fini(struct refgpu_device *rdev)
{
	u32 e;

	mutex_lock(&rdev->hw_lock);
	rg_write(rdev, REFGPU_IRQ_MASK, 0);
	for (e = 0; e < REFGPU_ENGINES; e++)
		rg_ewrite(rdev, e, REFGPU_CTRL, REFGPU_CTRL_RESET);
	rg_write(rdev, REFGPU_MMU_CTRL, 0);
	if (READ_ONCE(rdev->lost)) {
		/* No answer to wait for, but the request may still stop it. */
		rg_write(rdev, REFGPU_MMU_INVALIDATE, 1);
		refgpu_doorbell(rdev, REFGPU_CONTROL_VECTOR);
	} else {
		refgpu_hw_control(rdev);
	}
	mutex_unlock(&rdev->hw_lock);
}

/* Devices whose release has not run yet: module exit waits for them. */
static atomic_t refgpu_devices = ATOMIC_INIT(0);

/* The last release action (registered first). */
static void refgpu_release_device(struct drm_device *drm, void *arg)
{
	if (atomic_dec_and_test(&refgpu_devices))
		wake_up_var(&refgpu_devices);
}

/* Freed by remove already, unless probe failed. */
static void refgpu_release_null_root(struct drm_device *drm, void *arg)
{
	struct refgpu_device *rdev = arg;

	refgpu_pt_free(rdev, rdev->null_root, 0);
	rdev->null_root = NULL;
}

static void refgpu_release_reset_wq(struct drm_device *drm, void *arg)
{
	struct refgpu_device *rdev = arg;

	destroy_workqueue(rdev->reset_wq);
}

/*
 * The first release action (registered last). Every VM holds a reference
 * on the DRM device (drm_gpuvm), every job and context one on its VM, so
 * no client object is left now, and the schedulers can be finished: a
 * count that is not 0 is a leak.
 */
static void refgpu_release_check(struct drm_device *drm, void *arg)
{
	struct refgpu_device *rdev = arg;

	drm_WARN_ON(drm, atomic_read(&rdev->job_count));
	drm_WARN_ON(drm, atomic_read(&rdev->ctx_count));
	drm_WARN_ON(drm, atomic_read(&rdev->vm_count));
	drm_WARN_ON(drm, atomic_read(&rdev->bo_count));
	/* After an unbind this is when the last client's state is gone. */
	drm_info(drm, "device released\n");
}

static int refgpu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct device *dev = &pdev->dev;
	struct refgpu_device *rdev;
	u32 e;
	int ret, nvec;

	rdev = devm_drm_dev_alloc(dev, &refgpu_drm_driver, struct refgpu_device, drm);
	if (IS_ERR(rdev))
		return PTR_ERR(rdev);
	atomic_inc(&refgpu_devices);
	ret = drmm_add_action_or_reset(&rdev->drm, refgpu_release_device, NULL);
	if (ret)
		return ret;
	rdev->pdev = pdev;
	pci_set_drvdata(pdev, rdev);
	mutex_init(&rdev->hw_lock);
	mutex_init(&rdev->vms_lock);
	mutex_init(&rdev->dump_lock);
	mutex_init(&rdev->bos_lock);
	INIT_LIST_HEAD(&rdev->mapped_bos);
	INIT_LIST_HEAD(&rdev->vms);
	INIT_LIST_HEAD(&rdev->kept_vas);
	INIT_LIST_HEAD(&rdev->kept_pts);

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	pci_set_master(pdev);
	ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(48));
	if (ret)
		return ret;
	/*
	 * The MMU maps page by page (for_each_sgtable_dma_page()): any
	 * segment length will do, and the shmem helper's tables coalesce
	 * contiguous pages past the 64 KiB default.
	 */
	dma_set_max_seg_size(dev, UINT_MAX);
	if (pci_resource_len(pdev, 2) < 2 * SZ_4K) {
		dev_err(dev, "BAR2 too small for the register and info pages\n");
		return -ENODEV;
	}
	rdev->bar0 = pcim_iomap(pdev, 0, 0);
	if (!rdev->bar0)
		return -ENOMEM;
	/* Plain shared memory accessed with 32-bit atomics (binding 2.3). */
	rdev->regs = devm_memremap(dev, pci_resource_start(pdev, 2),
				   pci_resource_len(pdev, 2), MEMREMAP_WB);
	if (IS_ERR(rdev->regs))
		return PTR_ERR(rdev->regs);

	ret = refgpu_read_info(rdev);
	if (ret)
		return ret;

	/*
	 * The software state lives until the last client has closed the
	 * device (drmm release actions, run in reverse): an unbound device
	 * may still be open.
	 */
	rdev->null_root = refgpu_pt_alloc(rdev, 0);
	if (IS_ERR(rdev->null_root))
		return PTR_ERR(rdev->null_root);
	ret = drmm_add_action_or_reset(&rdev->drm, refgpu_release_null_root, rdev);
	if (ret)
		return ret;

	/* The timeout handler is on the fence-signalling path, as drm_sched's queue. */
	rdev->reset_wq = alloc_ordered_workqueue("refgpu-reset", WQ_MEM_RECLAIM);
	if (!rdev->reset_wq)
		return -ENOMEM;
	ret = drmm_add_action_or_reset(&rdev->drm, refgpu_release_reset_wq, rdev);
	if (ret)
		return ret;

	for (e = 0; e < REFGPU_ENGINES; e++) {
		ret = refgpu_engine_init(rdev, e);
		if (ret)
			return ret;
	}
	ret = drmm_add_action_or_reset(&rdev->drm, refgpu_release_check, rdev);
	if (ret)
		return ret;

	ret = refgpu_hw_init(rdev);
	if (ret)
		goto err_hw_fini;

	nvec = pci_alloc_irq_vectors(pdev, REFGPU_VECTORS, REFGPU_VECTORS, PCI_IRQ_MSIX);
	if (nvec < 0) {
		ret = nvec;
		goto err_hw_fini;
	}
	for (e = 0; e < REFGPU_ENGINES; e++) {
		ret = request_irq(pci_irq_vector(pdev, e), refgpu_irq, 0, "refgpu",
				  &rdev->engines[e]);
		if (ret) {
			while (e--)
				free_irq(pci_irq_vector(pdev, e), &rdev->engines[e]);
			goto err_free_vectors;
		}
	}

	drm_debugfs_add_files(&rdev->drm, refgpu_debugfs_list, ARRAY_SIZE(refgpu_debugfs_list));
	ret = drm_dev_register(&rdev->drm, 0);
	if (ret)
		goto err_free_irqs;
	return 0;

err_free_irqs:
	for (e = 0; e < REFGPU_ENGINES; e++)
		free_irq(pci_irq_vector(pdev, e), &rdev->engines[e]);
err_free_vectors:
	pci_free_irq_vectors(pdev);
err_hw_fini:
	refgpu_hw_fini(rdev);
	return ret;
}

/*
 * Clients may keep the device open: drm_dev_unplug() makes their ioctls
 * fail with ENODEV and waits for every drm_dev_enter() section, so the
 * device can be stopped and its BARs unmapped (devres, after this returns)
 * under them. What the rings held fails with ENODEV; jobs still queued
 * fail the same way when the scheduler runs them (run_job is refused its
 * section). Once the device is stopped, every DMA allocation and mapping
 * made for it goes: what a running device could still reach, the rings,
 * the null root, the open files' page tables and fence pages, and the
 * mappings of their objects' pages (made and used only in sections).
 * Imported dma-buf attachments stay mapped by their exporters until the
 * importing objects are freed (docs/linux.md, Limits and known gaps). The
 * software state goes with the last close (the drmm actions of probe).
 */
static void refgpu_remove(struct pci_dev *pdev)
{
	struct refgpu_device *rdev = pci_get_drvdata(pdev);
	u32 e;

	drm_dev_unplug(&rdev->drm);
	/* What the engines completed signals now: RPTR means nothing after the stop. */
	for (e = 0; e < REFGPU_ENGINES; e++)
		refgpu_engine_freeze(&rdev->engines[e]);
	refgpu_hw_fini(rdev);
	/* A lost device that ignored the stop cannot reach memory either. */
	pci_clear_master(pdev);
	for (e = 0; e < REFGPU_ENGINES; e++)
		free_irq(pci_irq_vector(pdev, e), &rdev->engines[e]);
	pci_free_irq_vectors(pdev);
	mutex_lock(&rdev->hw_lock);
	WRITE_ONCE(rdev->lost, true);
	mutex_unlock(&rdev->hw_lock);
	for (e = 0; e < REFGPU_ENGINES; e++)
		refgpu_engine_fail_inflight(&rdev->engines[e], -ENODEV);
	refgpu_vm_release_kept(rdev);
	/* Nothing uses these once the device is stopped and unplugged. */
	for (e = 0; e < REFGPU_ENGINES; e++)
		refgpu_engine_free_ring(&rdev->engines[e]);
	refgpu_pt_free(rdev, rdev->null_root, 0);
	rdev->null_root = NULL;
	refgpu_vm_release_dma(rdev);
	refgpu_gem_release_dma(rdev);
}

static const struct pci_device_id refgpu_pci_ids[] = {
	{ PCI_DEVICE(PCI_VENDOR_ID_REDHAT_QUMRANET, 0x1110) },	/* ivshmem */
	{ }
};
MODULE_DEVICE_TABLE(pci, refgpu_pci_ids);

static struct pci_driver refgpu_pci_driver = {
	.name = "refgpu",
	.id_table = refgpu_pci_ids,
	.probe = refgpu_probe,
	.remove = refgpu_remove,
};

struct workqueue_struct *refgpu_put_wq;

static int __init refgpu_init(void)
{
	int ret;

	refgpu_put_wq = alloc_workqueue("refgpu-put", WQ_UNBOUND, 0);
	if (!refgpu_put_wq)
		return -ENOMEM;
	ret = pci_register_driver(&refgpu_pci_driver);
	if (ret)
		destroy_workqueue(refgpu_put_wq);
	return ret;
}
module_init(refgpu_init);

static void __exit refgpu_exit(void)
{
	pci_unregister_driver(&refgpu_pci_driver);
	/*
	 * A removed device is released once its last jobs are freed (their
	 * VMs hold it), which queues their puts here: wait for every release,
	 * then for the puts still running.
	 */
	while (!wait_var_event_timeout(&refgpu_devices, !atomic_read(&refgpu_devices), 10 * HZ))
		pr_warn("refgpu: unload waits for %d removed devices to be released\n",
			atomic_read(&refgpu_devices));
	destroy_workqueue(refgpu_put_wq);
}
module_exit(refgpu_exit);

MODULE_AUTHOR("the refgpu authors");
MODULE_DESCRIPTION("DRM driver for the reference GPU (refgpu) over ivshmem");
MODULE_LICENSE("Dual MIT/GPL");
MODULE_IMPORT_NS(DMA_BUF);

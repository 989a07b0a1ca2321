// SPDX-License-Identifier: GPL-2.0 OR MIT
/* Copyright the refgpu authors */
/* Buffer objects: GEM shmem with two creation flags. */

#include <linux/dma-mapping.h>
#include <linux/scatterlist.h>

#include <drm/drm_file.h>
#include <drm/drm_gem.h>
#include <drm/drm_gem_shmem_helper.h>
#include <drm/drm_prime.h>

#include "refgpu_drv.h"

/*
 * The object leaves &refgpu_device.mapped_bos only once its table is
 * unmapped, under bos_lock: remove (refgpu_gem_release_dma()) either
 * unmaps it itself or finds it gone, never an object between the two. An
 * imported object is never on the list (its table is the exporter's), and
 * freeing it may drop the last reference to an object of another refgpu
 * device: bos_lock is not held for it.
 */
static void refgpu_gem_free(struct drm_gem_object *obj)
{
	struct refgpu_bo *bo = to_refgpu_bo(obj);
	struct refgpu_device *rdev = to_refgpu_device(obj->dev);

	mutex_destroy(&bo->gpuva_lock);
	if (obj->import_attach) {
		drm_gem_shmem_free(&bo->base);
	} else {
		mutex_lock(&rdev->bos_lock);
		list_del(&bo->mapped);
		drm_gem_shmem_free(&bo->base);
		mutex_unlock(&rdev->bos_lock);
	}
	atomic_dec(&rdev->bo_count);
}

static int refgpu_gem_mmap(struct drm_gem_object *obj, struct vm_area_struct *vma)
{
	if (to_refgpu_bo(obj)->flags & REFGPU_BO_NO_CPU_MAPPING)
		return -EPERM;
	return drm_gem_shmem_object_mmap(obj, vma);
}

static int refgpu_gem_vmap(struct drm_gem_object *obj, struct iosys_map *map)
{
	if (to_refgpu_bo(obj)->flags & REFGPU_BO_NO_CPU_MAPPING)
		return -EPERM;
	return drm_gem_shmem_object_vmap(obj, map);
}

/*
 * fdinfo's drm-resident-memory: an object's pages are taken all at once
 * (a GPU mapping pins them until the object is freed; a CPU mapping or
 * vmap holds them while it lasts). Nothing is purgeable (no madvise).
 * Read under the file's table_lock, unlocked: a race with a change is
 * harmless (&drm_gem_object_funcs.status).
 */
static enum drm_gem_object_status refgpu_gem_status(struct drm_gem_object *obj)
{
	return READ_ONCE(to_drm_gem_shmem_obj(obj)->pages) ? DRM_GEM_OBJECT_RESIDENT : 0;
}

static const struct drm_gem_object_funcs refgpu_gem_funcs = {
	.free = refgpu_gem_free,
	.print_info = drm_gem_shmem_object_print_info,
	.pin = drm_gem_shmem_object_pin,
	.unpin = drm_gem_shmem_object_unpin,
	.get_sg_table = drm_gem_shmem_object_get_sg_table,
	.vmap = refgpu_gem_vmap,
	.vunmap = drm_gem_shmem_object_vunmap,
	.mmap = refgpu_gem_mmap,
	.vm_ops = &drm_gem_shmem_vm_ops,
	.status = refgpu_gem_status,
};

/**
 * refgpu_gem_create_object() - &drm_driver.gem_create_object
 * @dev: the DRM device
 * @size: object size
 *
 * Every object of the device, created or imported, is a &refgpu_bo. It is
 * counted only once its creation has succeeded (refgpu_gem_counted()): the
 * shmem helper frees an object whose set-up fails without calling
 * &drm_gem_object_funcs.free.
 *
 * Return: the GEM object or an ERR_PTR.
 */
struct drm_gem_object *refgpu_gem_create_object(struct drm_device *dev, size_t size)
{
	struct refgpu_bo *bo;

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return ERR_PTR(-ENOMEM);
	bo->base.base.funcs = &refgpu_gem_funcs;
	mutex_init(&bo->gpuva_lock);
	INIT_LIST_HEAD(&bo->mapped);
	drm_gem_gpuva_set_lock(&bo->base.base, &bo->gpuva_lock);
	return &bo->base.base;
}

/* Counts a new object of the device; refgpu_gem_free() uncounts it. */
static void refgpu_gem_counted(struct drm_gem_object *obj)
{
	atomic_inc(&to_refgpu_device(obj->dev)->bo_count);
}

/**
 * refgpu_gem_prime_import_sg_table() - &drm_driver.gem_prime_import_sg_table
 * @dev: the DRM device
 * @attach: the dma-buf attachment
 * @sgt: its pages
 *
 * The shmem helper's import, with the new object counted.
 *
 * Return: the GEM object or an ERR_PTR.
 */
struct drm_gem_object *refgpu_gem_prime_import_sg_table(struct drm_device *dev,
							struct dma_buf_attachment *attach,
							struct sg_table *sgt)
{
	struct drm_gem_object *obj = drm_gem_shmem_prime_import_sg_table(dev, attach, sgt);

	if (!IS_ERR(obj))
		refgpu_gem_counted(obj);
	return obj;
}

/**
 * refgpu_gem_get_pages_sgt() - the object's pages, DMA-mapped for the device
 * @bo: the object
 *
 * The shmem helper pins and maps the pages on the first call and keeps
 * them until the object is freed, or until remove unmaps them
 * (refgpu_gem_release_dma()). Caller is in a drm_dev_enter() section, so
 * remove has not unmapped the device's objects yet and waits for the
 * caller to stop using the table.
 *
 * Return: the table or an ERR_PTR.
 */
struct sg_table *refgpu_gem_get_pages_sgt(struct refgpu_bo *bo)
{
	struct refgpu_device *rdev = to_refgpu_device(bo->base.base.dev);
	struct sg_table *sgt = drm_gem_shmem_get_pages_sgt(&bo->base);

	/* An imported object's table is its attachment's (the exporter's). */
	if (IS_ERR(sgt) || bo->base.base.import_attach)
		return sgt;
	mutex_lock(&rdev->bos_lock);
	if (list_empty(&bo->mapped))
		list_add_tail(&bo->mapped, &rdev->mapped_bos);
	mutex_unlock(&rdev->bos_lock);
	return sgt;
}

/**
 * refgpu_gem_release_dma() - unmap every object's pages from a removed device
 * @rdev: the device, unplugged and stopped (it reaches no memory any more)
 *
 * The DMA mappings belong to the device, the objects to their clients,
 * who may keep them (and their CPU mappings) after remove: the tables are
 * unmapped and freed and their page references dropped now, as
 * drm_gem_shmem_free() would; the pages stay in the object (its shmem
 * file), so the contents and the CPU mappings are kept.
 */
void refgpu_gem_release_dma(struct refgpu_device *rdev)
{
	struct refgpu_bo *bo, *tmp;

	mutex_lock(&rdev->bos_lock);
	list_for_each_entry_safe(bo, tmp, &rdev->mapped_bos, mapped) {
		struct drm_gem_shmem_object *shmem = &bo->base;

		list_del_init(&bo->mapped);
		dma_resv_lock(shmem->base.resv, NULL);
		if (shmem->sgt) {
			dma_unmap_sgtable(rdev->drm.dev, shmem->sgt, DMA_BIDIRECTIONAL, 0);
			sg_free_table(shmem->sgt);
			kfree(shmem->sgt);
			shmem->sgt = NULL;
			drm_gem_shmem_put_pages(shmem);
		}
		dma_resv_unlock(shmem->base.resv);
	}
	mutex_unlock(&rdev->bos_lock);
}

int refgpu_ioctl_bo_create(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct drm_refgpu_bo_create *args = data;
	struct drm_gem_shmem_object *shmem;
	int ret;

	if (args->flags & ~REFGPU_BO_FLAGS_MASK)
		return -EINVAL;
	if (!args->size || !IS_ALIGNED(args->size, SZ_4K))
		return -EINVAL;
	if (args->size > totalram_pages() << PAGE_SHIFT)
		return -E2BIG;

	shmem = drm_gem_shmem_create(dev, args->size);
	if (IS_ERR(shmem))
		return PTR_ERR(shmem);
	refgpu_gem_counted(&shmem->base);
	to_refgpu_bo(&shmem->base)->flags = args->flags;

	ret = drm_gem_handle_create(file, &shmem->base, &args->handle);
	/* The handle holds the reference from now on (or the object dies). */
	drm_gem_object_put(&shmem->base);
	return ret;
}

int refgpu_ioctl_bo_mmap_offset(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct drm_refgpu_bo_mmap_offset *args = data;
	struct drm_gem_object *obj;
	int ret;

	if (args->pad)
		return -EINVAL;
	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	if (to_refgpu_bo(obj)->flags & REFGPU_BO_NO_CPU_MAPPING) {
		ret = -EPERM;
		goto out;
	}
	ret = drm_gem_create_mmap_offset(obj);
	if (!ret)
		args->offset = drm_vma_node_offset_addr(&obj->vma_node);
out:
	drm_gem_object_put(obj);
	return ret;
}

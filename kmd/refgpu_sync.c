// SPDX-License-Identifier: GPL-2.0 OR MIT
/* Copyright the refgpu authors */
/*
 * The sync arrays of SUBMIT, SUBMIT_BATCH and VM_BIND: in-syncs (syncobj,
 * timeline point) to wait for, out-syncs to signal. Out-syncs are looked
 * up, and a timeline node allocated for each with a point, before the
 * ioctl changes anything, so that signalling them afterwards cannot fail.
 * SUBMIT_BATCH's arrays are drm_refgpu_obj_arrays, checked here too.
 */

#include <linux/dma-fence.h>
#include <linux/dma-fence-chain.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include <drm/drm_file.h>
#include <drm/drm_syncobj.h>

#include "refgpu_drv.h"

/**
 * refgpu_copy_syncs() - copy a user array of &drm_refgpu_sync and check it
 * @uptr: user pointer
 * @count: entries (at most %REFGPU_MAX_SYNCS)
 * @out: the kernel copy (kvfree) or NULL when @count is 0
 *
 * Return: 0, -EINVAL (too many, non-zero flags), -EFAULT or -ENOMEM.
 */
int refgpu_copy_syncs(u64 uptr, u32 count, struct drm_refgpu_sync **out)
{
	return refgpu_copy_syncs_into(uptr, count, NULL, 0, out);
}

/* SUBMIT's and VM_BIND's syncs have no flags yet. */
static int refgpu_check_syncs(const struct drm_refgpu_sync *s, u32 count)
{
	u32 i;

	for (i = 0; i < count; i++) {
		if (s[i].flags)
			return -EINVAL;
	}
	return 0;
}

/**
 * refgpu_copy_syncs_into() - refgpu_copy_syncs() into the caller's storage
 * when the array fits
 * @uptr: user pointer
 * @count: entries (at most %REFGPU_MAX_SYNCS)
 * @buf: storage for up to @buf_len entries (may be NULL with @buf_len 0)
 * @buf_len: its size in entries
 * @out: @buf, a heap copy, or NULL when @count is 0; release it with
 *       refgpu_free_syncs()
 *
 * Return: as refgpu_copy_syncs().
 */
int refgpu_copy_syncs_into(u64 uptr, u32 count, struct drm_refgpu_sync *buf, u32 buf_len,
			   struct drm_refgpu_sync **out)
{
	struct drm_refgpu_sync *s;
	int ret;

	*out = NULL;
	if (!count)
		return 0;
	if (count > REFGPU_MAX_SYNCS)
		return -EINVAL;
	if (count <= buf_len) {
		if (copy_from_user(buf, u64_to_user_ptr(uptr), count * sizeof(*buf)))
			return -EFAULT;
		s = buf;
	} else {
		s = vmemdup_array_user(u64_to_user_ptr(uptr), count, sizeof(*s));
		if (IS_ERR(s))
			return PTR_ERR(s);
	}
	ret = refgpu_check_syncs(s, count);
	if (ret) {
		refgpu_free_syncs(s, buf);
		return ret;
	}
	*out = s;
	return 0;
}

/**
 * refgpu_free_syncs() - release a copy made by refgpu_copy_syncs_into()
 * @s: the copy (or NULL)
 * @buf: the storage it was given
 */
void refgpu_free_syncs(struct drm_refgpu_sync *s, const struct drm_refgpu_sync *buf)
{
	if (s != buf)
		kvfree(s);
}

/**
 * refgpu_check_obj_array() - the checks every &drm_refgpu_obj_array gets
 * @a: the array, as the ioctl gave it
 * @size: the size of one element as this driver knows it
 * @max: the largest count
 *
 * Its elements are then copied with copy_struct_from_user(), @a->stride
 * bytes apart: a stride larger than @size (a newer userspace's structure)
 * must have zero bytes past @size (-E2BIG otherwise). A count of 0 is
 * checked by the caller (an empty sync array is not read at all).
 *
 * Return: 0, or -EINVAL (count over @max, stride below @size or over
 * %REFGPU_MAX_STRIDE).
 */
int refgpu_check_obj_array(const struct drm_refgpu_obj_array *a, size_t size, u32 max)
{
	if (a->count > max || a->stride < size || a->stride > REFGPU_MAX_STRIDE)
		return -EINVAL;
	return 0;
}

/* A SUBMIT_BATCH sync's type is explicit and must match its point. */
static int refgpu_batch_sync_check(const struct drm_refgpu_batch_sync *b)
{
	switch (b->flags) {
	case REFGPU_BATCH_SYNC_BINARY:
		return b->point ? -EINVAL : 0;
	case REFGPU_BATCH_SYNC_TIMELINE:
		return b->point ? 0 : -EINVAL;
	default:
		return -EINVAL;
	}
}

/**
 * refgpu_copy_batch_syncs_into() - copy and check a SUBMIT_BATCH sync
 * array, into the caller's storage when it fits
 * @a: an array of &drm_refgpu_batch_sync
 * @buf: storage for up to @buf_len entries (may be NULL with @buf_len 0)
 * @buf_len: its size in entries
 * @out: the syncs in SUBMIT's form (&drm_refgpu_sync, point 0 for a
 *       binary syncobj): @buf, a heap copy, or NULL when the count is 0;
 *       release it with refgpu_free_syncs()
 *
 * Return: 0, -EINVAL (refgpu_check_obj_array(), an unknown type or flag, a
 * BINARY entry with a point or a TIMELINE entry without one), -E2BIG
 * (non-zero bytes past the structure), -EFAULT or -ENOMEM.
 */
int refgpu_copy_batch_syncs_into(const struct drm_refgpu_obj_array *a,
				 struct drm_refgpu_sync *buf, u32 buf_len,
				 struct drm_refgpu_sync **out)
{
	struct drm_refgpu_batch_sync b;
	struct drm_refgpu_sync *s;
	int ret;
	u32 i;

	*out = NULL;
	if (!a->count)
		return 0;
	ret = refgpu_check_obj_array(a, sizeof(b), REFGPU_MAX_SYNCS);
	if (ret)
		return ret;
	s = a->count <= buf_len ? buf : kvmalloc_array(a->count, sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	for (i = 0; i < a->count; i++) {
		ret = copy_struct_from_user(&b, sizeof(b),
					    u64_to_user_ptr(a->array + (u64)i * a->stride),
					    a->stride);
		if (!ret)
			ret = refgpu_batch_sync_check(&b);
		if (ret) {
			refgpu_free_syncs(s, buf);
			return ret;
		}
		s[i] = (struct drm_refgpu_sync) { .handle = b.handle, .point = b.point };
	}
	*out = s;
	return 0;
}

/**
 * refgpu_out_syncs_init() - copy an ioctl's out-sync array in
 * @os: the out-syncs (zeroed first, counted only once the array is checked;
 *      refgpu_out_syncs_fini() on every path)
 * @uptr: user pointer to the array
 * @count: entries
 *
 * Return: as refgpu_copy_syncs().
 */
int refgpu_out_syncs_init(struct refgpu_out_syncs *os, u64 uptr, u32 count)
{
	int ret;

	memset(os, 0, sizeof(*os));
	ret = refgpu_copy_syncs_into(uptr, count, os->syncs_inline, REFGPU_SYNCS_INLINE,
				     &os->syncs);
	/* Only a checked count: refgpu_out_syncs_fini() loops over it. */
	if (!ret)
		os->count = count;
	return ret;
}

/**
 * refgpu_out_syncs_init_batch() - copy a SUBMIT_BATCH job's out-syncs in
 * @os: the out-syncs (as refgpu_out_syncs_init())
 * @a: the job's array of &drm_refgpu_batch_sync
 *
 * Return: as refgpu_copy_batch_syncs_into().
 */
int refgpu_out_syncs_init_batch(struct refgpu_out_syncs *os, const struct drm_refgpu_obj_array *a)
{
	int ret;

	memset(os, 0, sizeof(*os));
	ret = refgpu_copy_batch_syncs_into(a, os->syncs_inline, REFGPU_SYNCS_INLINE, &os->syncs);
	if (!ret)
		os->count = a->count;
	return ret;
}

/**
 * refgpu_out_syncs_resolve() - look the out-syncs up and allocate their
 * timeline nodes
 * @os: the out-syncs, from refgpu_out_syncs_init()
 * @file: the file whose syncobj handles they are
 *
 * Return: 0, -ENOENT (a handle names no syncobj) or -ENOMEM. On error what
 * was taken stays in @os for refgpu_out_syncs_fini().
 */
int refgpu_out_syncs_resolve(struct refgpu_out_syncs *os, struct drm_file *file)
{
	u32 i;

	if (!os->count)
		return 0;
	if (os->count <= REFGPU_SYNCS_INLINE) {
		os->objs = os->objs_inline;
		os->chains = os->chains_inline;
	} else {
		os->objs = kcalloc(os->count, sizeof(*os->objs), GFP_KERNEL);
		os->chains = kcalloc(os->count, sizeof(*os->chains), GFP_KERNEL);
		if (!os->objs || !os->chains)
			return -ENOMEM;
	}
	for (i = 0; i < os->count; i++) {
		os->objs[i] = drm_syncobj_find(file, os->syncs[i].handle);
		if (!os->objs[i])
			return -ENOENT;
		if (os->syncs[i].point) {
			os->chains[i] = dma_fence_chain_alloc();
			if (!os->chains[i])
				return -ENOMEM;
		}
	}
	return 0;
}

/**
 * refgpu_out_syncs_signal() - attach @fence to every out-sync
 * @os: the out-syncs, resolved
 * @fence: the fence they take (a timeline point, or the binary payload)
 */
void refgpu_out_syncs_signal(struct refgpu_out_syncs *os, struct dma_fence *fence)
{
	u32 i;

	for (i = 0; i < os->count; i++) {
		if (os->chains[i]) {
			drm_syncobj_add_point(os->objs[i], os->chains[i], fence,
					      os->syncs[i].point);
			os->chains[i] = NULL;
		} else {
			drm_syncobj_replace_fence(os->objs[i], fence);
		}
	}
}

/**
 * refgpu_out_syncs_fini() - release what @os holds (unused timeline nodes,
 * syncobj references, the copy); safe after any step failed
 * @os: the out-syncs
 */
void refgpu_out_syncs_fini(struct refgpu_out_syncs *os)
{
	u32 i;

	for (i = 0; i < os->count; i++) {
		if (os->chains && os->chains[i])
			dma_fence_chain_free(os->chains[i]);
		if (os->objs && os->objs[i])
			drm_syncobj_put(os->objs[i]);
	}
	if (os->chains != os->chains_inline)
		kfree(os->chains);
	if (os->objs != os->objs_inline)
		kfree(os->objs);
	refgpu_free_syncs(os->syncs, os->syncs_inline);
	memset(os, 0, sizeof(*os));
}

/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * refgpu DRM driver uAPI: the reference GPU of docs/refgpu.md.
 *
 * Conventions: every structure has a fixed size and explicit padding;
 * padding and reserved fields must be zero (-EINVAL otherwise); flags
 * words reject unknown bits with -EINVAL; user pointers are __u64.
 * docs/linux.md specifies each ioctl and its errors.
 */
#ifndef _REFGPU_DRM_H_
#define _REFGPU_DRM_H_

#include "drm.h"

#if defined(__cplusplus)
extern "C" {
#endif

#define DRM_REFGPU_GET_PARAM		0x00
#define DRM_REFGPU_BO_CREATE		0x01
#define DRM_REFGPU_BO_MMAP_OFFSET	0x02
#define DRM_REFGPU_VM_BIND		0x03
#define DRM_REFGPU_CTX_CREATE		0x04
#define DRM_REFGPU_CTX_DESTROY		0x05
#define DRM_REFGPU_SUBMIT		0x06
#define DRM_REFGPU_CTX_QUERY		0x07
#define DRM_REFGPU_SUBMIT_BATCH		0x08	/* driver minor version 1 */

/* Engines (docs/refgpu.md section 1). */
#define REFGPU_ENGINE_GFX		0
#define REFGPU_ENGINE_COMPUTE		1
#define REFGPU_ENGINE_COPY		2
#define REFGPU_ENGINE_COUNT		3

/* GET_PARAM parameters. */
#define REFGPU_PARAM_CHIP_ID		0	/* the ID register */
#define REFGPU_PARAM_GENERATION		1	/* 1 or 2 */
#define REFGPU_PARAM_ENGINE_COUNT	2
#define REFGPU_PARAM_VA_START		3	/* first GPU VA userspace may bind */
#define REFGPU_PARAM_VA_END		4	/* one past the last one */
#define REFGPU_PARAM_IB_MAX_DWORDS	5	/* largest SUBMIT ib_size_dw */
#define REFGPU_PARAM_IB_ALIGN		6	/* SUBMIT ib_va alignment in bytes */
#define REFGPU_PARAM_VA_BITS		7	/* GPU address width of packets */
#define REFGPU_PARAM_PAGE_SIZE		8	/* VM_BIND granule */
#define REFGPU_PARAM_MAX_BIND_OPS	9	/* largest VM_BIND op_count */
#define REFGPU_PARAM_MAX_SYNCS		10	/* largest sync count per ioctl */
#define REFGPU_PARAM_JOB_TIMEOUT_MS	11	/* hang detection window */
#define REFGPU_PARAM_MAX_BATCH_JOBS	12	/* largest SUBMIT_BATCH job count (minor 1) */

struct drm_refgpu_get_param {
	__u32 param;	/* in: REFGPU_PARAM_* */
	__u32 pad;	/* must be zero */
	__u64 value;	/* out */
};

/* BO_CREATE flags. */
#define REFGPU_BO_NO_CPU_MAPPING	(1u << 0) /* mmap and MMAP_OFFSET refused */
#define REFGPU_BO_GPU_READ_ONLY		(1u << 1) /* only READ_ONLY binds allowed */
#define REFGPU_BO_FLAGS_MASK		(REFGPU_BO_NO_CPU_MAPPING | REFGPU_BO_GPU_READ_ONLY)

struct drm_refgpu_bo_create {
	__u64 size;	/* in: bytes, a non-zero multiple of the page size */
	__u32 flags;	/* in: REFGPU_BO_* */
	__u32 handle;	/* out: GEM handle */
};

struct drm_refgpu_bo_mmap_offset {
	__u32 handle;	/* in */
	__u32 pad;	/* must be zero */
	__u64 offset;	/* out: fake offset for mmap() on the DRM fd */
};

/*
 * A syncobj reference: point 0 names a binary syncobj, any other point a
 * point on a timeline syncobj.
 */
struct drm_refgpu_sync {
	__u32 handle;
	__u32 flags;	/* must be zero */
	__u64 point;
};

#define REFGPU_VM_BIND_OP_MAP		0
#define REFGPU_VM_BIND_OP_UNMAP		1

/* VM_BIND op flags. */
#define REFGPU_VM_BIND_READ_ONLY	(1u << 0) /* MAP: GPU may read, not write */
#define REFGPU_VM_BIND_OP_FLAGS_MASK	REFGPU_VM_BIND_READ_ONLY

struct drm_refgpu_vm_bind_op {
	__u32 op;	/* REFGPU_VM_BIND_OP_* */
	__u32 flags;	/* REFGPU_VM_BIND_* (MAP only; zero for UNMAP) */
	__u32 handle;	/* MAP: GEM handle; UNMAP: must be zero */
	__u32 pad;	/* must be zero */
	__u64 bo_offset;/* MAP: page-aligned offset in the BO; UNMAP: zero */
	__u64 va;	/* page-aligned GPU VA */
	__u64 size;	/* page-aligned, non-zero */
};

/*
 * VM_BIND applies the whole op array or nothing. Besides argument errors
 * it fails with ENOSPC when the MAPs would need more page tables than one
 * VM may hold (module parameter vm_max_pt_pages), ENOMEM when an
 * allocation fails; either way the VM is unchanged. Page tables are
 * charged to the caller's memory cgroup and freed once empty.
 */
struct drm_refgpu_vm_bind {
	__u32 flags;		/* must be zero */
	__u32 op_count;		/* 1 ..= REFGPU_PARAM_MAX_BIND_OPS */
	__u32 in_sync_count;	/* 0 ..= REFGPU_PARAM_MAX_SYNCS */
	__u32 out_sync_count;	/* 0 ..= REFGPU_PARAM_MAX_SYNCS */
	__u64 ops;		/* struct drm_refgpu_vm_bind_op[op_count] */
	__u64 in_syncs;		/* struct drm_refgpu_sync[in_sync_count]: waited for */
	__u64 out_syncs;	/* struct drm_refgpu_sync[out_sync_count]: signalled */
};

struct drm_refgpu_ctx_create {
	__u32 engine;	/* in: REFGPU_ENGINE_* */
	__u32 flags;	/* in: must be zero */
	__u32 ctx_id;	/* out: non-zero */
	__u32 pad;	/* must be zero */
};

struct drm_refgpu_ctx_destroy {
	__u32 ctx_id;
	__u32 pad;	/* must be zero */
};

/* SUBMIT flags. */
#define REFGPU_SUBMIT_OUT_SYNC_FILE	(1u << 0) /* return a sync_file in out_fence_fd */
#define REFGPU_SUBMIT_FLAGS_MASK	REFGPU_SUBMIT_OUT_SYNC_FILE

struct drm_refgpu_submit {
	__u32 ctx_id;		/* in */
	__u32 flags;		/* in: REFGPU_SUBMIT_* */
	__u64 ib_va;		/* in: GPU VA of the indirect buffer */
	__u32 ib_size_dw;	/* in: its size in dwords */
	__u32 in_sync_count;	/* in: 0 ..= REFGPU_PARAM_MAX_SYNCS */
	__u32 out_sync_count;	/* in: 0 ..= REFGPU_PARAM_MAX_SYNCS */
	__s32 out_fence_fd;	/* out: sync_file fd, or -1 */
	__u64 in_syncs;		/* struct drm_refgpu_sync[in_sync_count] */
	__u64 out_syncs;	/* struct drm_refgpu_sync[out_sync_count] */
	__u64 seqno;		/* out: the job's sequence number on its context */
};

/*
 * An array of user structures whose size may grow in later versions
 * (panthor's drm_panthor_obj_array): @stride is the size of one element as
 * the caller knows it. A stride smaller than the structure this header
 * defines is -EINVAL, a larger one (at most 4096) must have zero bytes past
 * the known structure (-E2BIG otherwise).
 */
struct drm_refgpu_obj_array {
	__u32 stride;	/* sizeof one element, as the caller's header has it */
	__u32 count;
	__u64 array;	/* user pointer to count elements, stride bytes apart */
};

/* SUBMIT_BATCH sync types: the syncobj kind is explicit, not told by point. */
#define REFGPU_BATCH_SYNC_BINARY	0 /* a binary syncobj; point must be 0 */
#define REFGPU_BATCH_SYNC_TIMELINE	1 /* a point (non-zero) on a timeline syncobj */
#define REFGPU_BATCH_SYNC_TYPE_MASK	0xffu

struct drm_refgpu_batch_sync {
	__u32 handle;	/* syncobj handle */
	__u32 flags;	/* REFGPU_BATCH_SYNC_{BINARY,TIMELINE}; other bits zero */
	__u64 point;	/* TIMELINE: the point, non-zero; BINARY: zero */
};

struct drm_refgpu_batch_job {
	__u32 flags;		/* must be zero */
	__u32 ib_size_dw;	/* IB size in dwords, as SUBMIT */
	__u64 ib_va;		/* GPU VA of the IB, as SUBMIT */
	struct drm_refgpu_obj_array in_syncs;	/* struct drm_refgpu_batch_sync: waited for */
	struct drm_refgpu_obj_array out_syncs;	/* struct drm_refgpu_batch_sync: signalled */
};

/* SUBMIT_BATCH error_index when the error is not one job's. */
#define REFGPU_BATCH_NO_INDEX		0xffffffffu

/*
 * Queues jobs[0..count) on one context, in array order, or none of them:
 * every job is checked (and its syncobjs looked up) before the first is
 * queued. On an error about one job, error_index names it.
 */
struct drm_refgpu_submit_batch {
	__u32 ctx_id;		/* in */
	__u32 flags;		/* in: must be zero */
	struct drm_refgpu_obj_array jobs;	/* in: struct drm_refgpu_batch_job */
	__u64 first_seqno;	/* out: seqno of jobs[0]; jobs[i] has first_seqno + i */
	__u32 error_index;	/* out: the failing job, or REFGPU_BATCH_NO_INDEX */
	__u32 pad;		/* must be zero */
};

/* CTX_QUERY state. */
#define REFGPU_CTX_STATE_OK		0 /* no reset touched this context */
#define REFGPU_CTX_STATE_INNOCENT	1 /* its engine was reset for another context */
#define REFGPU_CTX_STATE_GUILTY		2 /* it hung or faulted: submits fail */
#define REFGPU_CTX_STATE_DEVICE_LOST	3 /* the device stopped responding */

struct drm_refgpu_ctx_query {
	__u32 ctx_id;		/* in */
	__u32 state;		/* out: REFGPU_CTX_STATE_* */
	__u32 engine;		/* out */
	__u32 pad;		/* must be zero */
	__u64 reset_count;	/* out: engine resets that had this context's jobs in the ring */
	__u64 fault_status;	/* out: GUILTY by a fault: FAULT_STATUS; else 0 */
	__u64 fault_addr;	/* out: the faulting GPU address, or 0 */
	__u64 guilty_seqno;	/* out: GUILTY: the SUBMIT seqno of the job that hung or faulted; else 0 */
};

#define DRM_IOCTL_REFGPU_GET_PARAM \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_GET_PARAM, struct drm_refgpu_get_param)
#define DRM_IOCTL_REFGPU_BO_CREATE \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_BO_CREATE, struct drm_refgpu_bo_create)
#define DRM_IOCTL_REFGPU_BO_MMAP_OFFSET \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_BO_MMAP_OFFSET, struct drm_refgpu_bo_mmap_offset)
#define DRM_IOCTL_REFGPU_VM_BIND \
	DRM_IOW(DRM_COMMAND_BASE + DRM_REFGPU_VM_BIND, struct drm_refgpu_vm_bind)
#define DRM_IOCTL_REFGPU_CTX_CREATE \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_CTX_CREATE, struct drm_refgpu_ctx_create)
#define DRM_IOCTL_REFGPU_CTX_DESTROY \
	DRM_IOW(DRM_COMMAND_BASE + DRM_REFGPU_CTX_DESTROY, struct drm_refgpu_ctx_destroy)
#define DRM_IOCTL_REFGPU_SUBMIT \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_SUBMIT, struct drm_refgpu_submit)
#define DRM_IOCTL_REFGPU_CTX_QUERY \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_CTX_QUERY, struct drm_refgpu_ctx_query)
#define DRM_IOCTL_REFGPU_SUBMIT_BATCH \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_REFGPU_SUBMIT_BATCH, struct drm_refgpu_submit_batch)

#if defined(__cplusplus)
}
#endif

#endif /* _REFGPU_DRM_H_ */

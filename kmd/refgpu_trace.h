/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/* Copyright the refgpu authors */
/*
 * Tracepoints (events/refgpu/ in tracefs; docs/linux.md, "Tracepoints").
 * A job is followed by its context and its out fence (the scheduler's
 * finished fence, context:seqno, the seqno SUBMIT returns) from
 * refgpu_submit through gpu_scheduler's events (whose id= is the job= here)
 * to refgpu_run, which also names its hardware fence, and refgpu_complete.
 * Every event only copies fields: none allocates or sleeps, as run_job,
 * the interrupt handler and a reset, on the fence-signalling path, need.
 */

#if !defined(__REFGPU_TRACE_H__) || defined(TRACE_HEADER_MULTI_READ)
#define __REFGPU_TRACE_H__

#include <linux/tracepoint.h>
#include <linux/types.h>

#include <drm/drm_file.h>

#include "refgpu_drv.h"

#undef TRACE_SYSTEM
#define TRACE_SYSTEM refgpu
#define TRACE_INCLUDE_FILE refgpu_trace

#define refgpu_trace_engine(e) __print_symbolic(e,				\
	{ REFGPU_ENGINE_GFX, "gfx" },						\
	{ REFGPU_ENGINE_COMPUTE, "compute" },					\
	{ REFGPU_ENGINE_COPY, "copy" })

TRACE_EVENT(refgpu_bind,
	TP_PROTO(const struct drm_file *file, const void *vm,
		 const struct drm_refgpu_vm_bind_op *op, u64 bo_size),
	TP_ARGS(file, vm, op, bo_size),
	TP_STRUCT__entry(
		__field(u64, client)
		__field(const void *, vm)
		__field(u32, op)
		__field(u32, flags)
		__field(u32, handle)
		__field(u64, va)
		__field(u64, size)
		__field(u64, bo_offset)
		__field(u64, bo_size)
	),
	TP_fast_assign(
		__entry->client = file->client_id;
		__entry->vm = vm;
		__entry->op = op->op;
		__entry->flags = op->flags;
		__entry->handle = op->handle;
		__entry->va = op->va;
		__entry->size = op->size;
		__entry->bo_offset = op->bo_offset;
		__entry->bo_size = bo_size;
	),
	TP_printk("client=%llu vm=%p op=%s va=%#llx size=%#llx handle=%u bo_offset=%#llx bo_size=%#llx flags=%#x",
		  __entry->client, __entry->vm,
		  __print_symbolic(__entry->op, { REFGPU_VM_BIND_OP_MAP, "map" },
				   { REFGPU_VM_BIND_OP_UNMAP, "unmap" }),
		  __entry->va, __entry->size, __entry->handle, __entry->bo_offset,
		  __entry->bo_size, __entry->flags)
);

TRACE_EVENT(refgpu_submit,
	TP_PROTO(const struct drm_file *file, const struct refgpu_job *job),
	TP_ARGS(file, job),
	TP_STRUCT__entry(
		__field(u64, client)
		__field(pid_t, pid)
		__field(u32, ctx)
		__field(u32, engine)
		__field(u64, id)
		__field(u64, context)
		__field(u64, seqno)
		__field(u64, ib_va)
		__field(u32, ib_dw)
	),
	TP_fast_assign(
		__entry->client = file->client_id;
		__entry->pid = refgpu_vm_pid(job->vm);
		__entry->ctx = job->ctx->id;
		__entry->engine = job->ctx->engine;
		__entry->id = job->base.id;
		__entry->context = job->base.s_fence->finished.context;
		__entry->seqno = job->base.s_fence->finished.seqno;
		__entry->ib_va = job->ib_va;
		__entry->ib_dw = job->ib_dw;
	),
	TP_printk("client=%llu pid=%d ctx=%u engine=%s job=%llu fence=%llu:%llu ib=%#llx+%u",
		  __entry->client, __entry->pid, __entry->ctx,
		  refgpu_trace_engine(__entry->engine), __entry->id, __entry->context,
		  __entry->seqno, __entry->ib_va, __entry->ib_dw)
);

TRACE_EVENT(refgpu_run,
	TP_PROTO(const struct refgpu_job *job, const struct refgpu_fence *hw),
	TP_ARGS(job, hw),
	TP_STRUCT__entry(
		__field(u32, ctx)
		__field(u32, engine)
		__field(u64, id)
		__field(u64, context)
		__field(u64, seqno)
		__field(u64, hw_context)
		__field(u64, hw_seqno)
		__field(u64, ring)
		__field(int, error)
	),
	TP_fast_assign(
		__entry->ctx = job->ctx->id;
		__entry->engine = hw->engine;
		__entry->id = job->base.id;
		__entry->context = hw->out_context;
		__entry->seqno = hw->out_seqno;
		__entry->hw_context = hw->base.context;
		__entry->hw_seqno = hw->base.seqno;
		__entry->ring = hw->ring_start;
		__entry->error = hw->base.error;
	),
	TP_printk("ctx=%u engine=%s job=%llu fence=%llu:%llu hw=%llu:%llu ring=%#llx error=%d",
		  __entry->ctx, refgpu_trace_engine(__entry->engine), __entry->id,
		  __entry->context, __entry->seqno, __entry->hw_context, __entry->hw_seqno,
		  __entry->ring, __entry->error)
);

TRACE_EVENT(refgpu_complete,
	TP_PROTO(const struct refgpu_fence *hw),
	TP_ARGS(hw),
	TP_STRUCT__entry(
		__field(u32, ctx)
		__field(u32, engine)
		__field(u64, context)
		__field(u64, seqno)
		__field(u64, hw_context)
		__field(u64, hw_seqno)
		__field(int, error)
	),
	TP_fast_assign(
		__entry->ctx = hw->ctx_id;
		__entry->engine = hw->engine;
		__entry->context = hw->out_context;
		__entry->seqno = hw->out_seqno;
		__entry->hw_context = hw->base.context;
		__entry->hw_seqno = hw->base.seqno;
		__entry->error = hw->base.error;
	),
	TP_printk("ctx=%u engine=%s fence=%llu:%llu hw=%llu:%llu error=%d",
		  __entry->ctx, refgpu_trace_engine(__entry->engine), __entry->context,
		  __entry->seqno, __entry->hw_context, __entry->hw_seqno, __entry->error)
);

TRACE_EVENT(refgpu_fault,
	TP_PROTO(const struct refgpu_engine *eng),
	TP_ARGS(eng),
	TP_STRUCT__entry(
		__field(u32, engine)
		__field(u32, status)
		__field(u64, addr)
	),
	TP_fast_assign(
		__entry->engine = eng->id;
		__entry->status = eng->fault_status;
		__entry->addr = eng->fault_addr;
	),
	TP_printk("engine=%s status=%#x addr=%#llx",
		  refgpu_trace_engine(__entry->engine), __entry->status, __entry->addr)
);

TRACE_EVENT(refgpu_reset,
	TP_PROTO(const struct refgpu_engine *eng, const char *reason,
		 const struct refgpu_fence *culprit),
	TP_ARGS(eng, reason, culprit),
	TP_STRUCT__entry(
		__field(u32, engine)
		__string(reason, reason)
		__field(bool, culprit)
		__field(u32, ctx)
		__field(u64, context)
		__field(u64, seqno)
		__field(u64, hw_seqno)
	),
	TP_fast_assign(
		__entry->engine = eng->id;
		__assign_str(reason);
		__entry->culprit = culprit;
		__entry->ctx = culprit ? culprit->ctx_id : 0;
		__entry->context = culprit ? culprit->out_context : 0;
		__entry->seqno = culprit ? culprit->out_seqno : 0;
		__entry->hw_seqno = culprit ? culprit->base.seqno : 0;
	),
	TP_printk("engine=%s reason=%s culprit=%s ctx=%u fence=%llu:%llu hw_seqno=%llu",
		  refgpu_trace_engine(__entry->engine), __get_str(reason),
		  __entry->culprit ? "job" : "none", __entry->ctx, __entry->context,
		  __entry->seqno, __entry->hw_seqno)
);

#endif /* __REFGPU_TRACE_H__ */

/* An out-of-tree module: Kbuild adds $(src) to this header's includer's path. */
#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#include <trace/define_trace.h>

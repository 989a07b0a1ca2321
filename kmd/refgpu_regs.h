/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/* Copyright the refgpu authors */
/* The refgpu register page and packet encodings (docs/refgpu.md). */

#ifndef __REFGPU_REGS_H__
#define __REFGPU_REGS_H__

#include <linux/bits.h>

/* 2.1 Global registers */
#define REFGPU_ID			0x000
#define   REFGPU_ID_MAGIC		0x5247
#define REFGPU_ENGINE_COUNT_REG		0x004
#define REFGPU_IRQ_STATUS		0x010
#define REFGPU_IRQ_MASK			0x014
#define   REFGPU_IRQ_FENCE(e)		BIT(e)
#define   REFGPU_IRQ_FAULT(e)		BIT(8 + (e))
#define REFGPU_MMU_CTRL			0x020
#define   REFGPU_MMU_ENABLE		BIT(0)
#define REFGPU_MMU_ROOT_LO		0x024
#define REFGPU_MMU_ROOT_HI		0x028
#define REFGPU_MMU_INVALIDATE		0x02c
#define REFGPU_ENGINE_ROOT_LO(e)	(0x040 + 8 * (e))
#define REFGPU_ENGINE_ROOT_HI(e)	(0x044 + 8 * (e))

/* 2.2 Engine registers */
#define REFGPU_ENGINE_BASE(e)		(0x100 + 0x40 * (e))
#define REFGPU_RING_BASE_LO		0x00
#define REFGPU_RING_BASE_HI		0x04
#define REFGPU_RING_SIZE_REG		0x08
#define REFGPU_RING_RPTR		0x0c
#define REFGPU_RING_WPTR		0x10
#define REFGPU_CTRL			0x14
#define   REFGPU_CTRL_ENABLE		BIT(0)
#define   REFGPU_CTRL_RESET		BIT(1)
#define REFGPU_STATUS			0x18
#define   REFGPU_STATUS_BUSY		BIT(0)
#define   REFGPU_STATUS_WAITING		BIT(1)
#define   REFGPU_STATUS_HALTED		BIT(2)
#define   REFGPU_STATUS_IN_IB		BIT(3)
#define REFGPU_CUR_ADDR_LO		0x20
#define REFGPU_CUR_ADDR_HI		0x24
#define REFGPU_IB_BASE_LO		0x28
#define REFGPU_IB_BASE_HI		0x2c
#define REFGPU_IB_SIZE			0x30
#define REFGPU_FAULT_STATUS		0x34
#define   REFGPU_FAULT_VALID		BIT(31)
#define REFGPU_FAULT_ADDR_LO		0x38
#define REFGPU_FAULT_ADDR_HI		0x3c

/* 2.3 ivshmem binding */
#define REFGPU_IVSHMEM_DOORBELL		12	/* BAR0 */
#define REFGPU_CONTROL_VECTOR		3
#define REFGPU_INFO_PAGE		0x1000
#define   REFGPU_INFO_MAGIC		0x49534752	/* "RGSI" */
#define   REFGPU_INFO_VERSION		0x04
#define   REFGPU_INFO_VECTORS		0x08
#define   REFGPU_INFO_MODEL_PEER	0x0c
#define   REFGPU_INFO_MEM_BASE		0x10
#define   REFGPU_INFO_MEM_SIZE		0x18
#define REFGPU_VECTORS			4

/* 3.2 Page-table entries */
#define REFGPU_PTE_VALID		BIT_ULL(0)
#define REFGPU_PTE_TABLE		BIT_ULL(1)
#define REFGPU_PTE_READ			BIT_ULL(2)
#define REFGPU_PTE_WRITE		BIT_ULL(3)
#define REFGPU_PTE_CACHED		(2ull << 4)
#define REFGPU_PTE_ADDR_MASK		GENMASK_ULL(47, 12)
#define REFGPU_PT_ENTRIES		512
#define REFGPU_PT_LEVELS		4

/* 5.2 Limits */
#define REFGPU_GEN1_VA_BITS		40
#define REFGPU_GEN2_VA_BITS		48
#define REFGPU_GEN1_IB_MAX_DW		262144
#define REFGPU_GEN2_IB_MAX_DW		4194304
#define REFGPU_GEN1_IB_ALIGN		4
#define REFGPU_GEN2_IB_ALIGN		32
#define REFGPU_GEN1_MAX_NDW		256
#define REFGPU_GEN2_MAX_NDW		4095

/* 5.3 Opcodes: generation 1, generation 2 */
#define REFGPU_OP_NOP			0x00, 0x00
#define REFGPU_OP_FENCE			0x04, 0x30
#define REFGPU_OP_INDIRECT_BUFFER	0x07, 0x40
#define   REFGPU_FENCE_FLAG_IRQ		BIT(0)

#endif /* __REFGPU_REGS_H__ */

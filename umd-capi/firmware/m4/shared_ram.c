/*
 * The shared-RAM transport in C (docs/refgpu.md 2.3, "shared RAM"), the
 * same rules as platform-baremetal's SharedRamGpu: the board's 16 MiB
 * PSRAM at 0x2100_0000, which QEMU maps from the file refgpu-sim maps too;
 * system memory below its last 8 KiB, the register page and the doorbell
 * page in them.
 *
 * - registers: 32-bit atomic accesses; CLOCK read HI, LO, HI until HI is
 *   stable (CLOCK_HI then answers the HI of that read); IRQ_STATUS cleared
 *   by an atomic AND of the complement; writes of the control registers
 *   (ENGINE_ROOT_LO/HI of each engine included) and the engines' ring
 *   registers stored (applied by the model on a doorbell); an engine's
 *   DOORBELL register rings that engine; other writes ignored, as on MMIO;
 * - doorbells: an atomic add of 1 to DOORBELL(v) (0..2 the engines, 3 the
 *   control doorbell); an engine that does not exist is refused;
 * - memory: pages of system memory from a bitmap (first fit), zeroed;
 *   no cache to maintain (the Cortex-M4 has no data cache);
 * - liveness: ATTACH cleared or CLOCK frozen for 2 s, seen in delay_ns
 *   (the driver's wait loop), makes the device lost: every register call
 *   then fails with UMD_ERR_DEVICE_LOST;
 * - no interrupts: wait_irq is NULL, the driver polls.
 *
 * The firmware is one main loop: nothing here is called concurrently.
 */
#include <string.h>

#include "board.h"
#include "shared_ram.h"

#define REGION 0x21000000u
#define REGION_SIZE (16u << 20)
#define REGS (REGION + REGION_SIZE - 0x2000u)
#define BELLS (REGION + REGION_SIZE - 0x1000u)
#define MEM_SIZE (REGION_SIZE - 0x2000u)
#define PAGE 4096u
#define PAGES (MEM_SIZE / PAGE)
#define ATTACH_MAGIC 0x52534752u /* "RGSR" */
#define LOSS_WINDOW_NS 2000000000ull

/* Register offsets (docs/refgpu.md 2.1). */
#define IRQ_STATUS 0x010u
#define IRQ_MASK 0x014u
#define MMU_CTRL 0x020u
#define MMU_ROOT_LO 0x024u
#define MMU_ROOT_HI 0x028u
#define MMU_INVALIDATE 0x02Cu
#define CLOCK_LO 0x030u
#define CLOCK_HI 0x034u
#define ENGINE_ROOT_BASE 0x040u /* ENGINE_ROOT_LO(e) at + 8e, _HI at + 8e + 4 */
#define ENGINES 3u
#define ENGINE_BASE 0x100u
#define ENGINE_STRIDE 0x40u
#define E_RING_BASE_LO 0x00u
#define E_RING_BASE_HI 0x04u
#define E_RING_SIZE 0x08u
#define E_RING_WPTR 0x10u
#define E_CTRL 0x14u
#define E_DOORBELL 0x1Cu

static uint32_t page_used[(PAGES + 31) / 32];
static uint32_t pages_used;
static int lost;
static uint32_t clock_hi;
static uint64_t beat_clock, beat_seen_ns;

static uint32_t *word(uint32_t addr)
{
    return (uint32_t *)(uintptr_t)addr;
}

static uint32_t load(uint32_t addr)
{
    return __atomic_load_n(word(addr), __ATOMIC_ACQUIRE);
}

static void store(uint32_t addr, uint32_t v)
{
    __atomic_store_n(word(addr), v, __ATOMIC_RELEASE);
}

static uint64_t raw_clock(void)
{
    return ((uint64_t)load(REGS + CLOCK_HI) << 32) | load(REGS + CLOCK_LO);
}

static int page_is_used(uint32_t p)
{
    return (page_used[p / 32] >> (p % 32)) & 1u;
}

static void mark(uint32_t first, uint32_t n, int used)
{
    for (uint32_t p = first; p < first + n; p++) {
        if (used)
            page_used[p / 32] |= 1u << (p % 32);
        else
            page_used[p / 32] &= ~(1u << (p % 32));
    }
}

static int32_t dma_alloc(void *ctx, size_t len, uint32_t flags, struct umd_dma *out)
{
    (void)ctx;
    (void)flags; /* every page is CPU-visible */
    uint32_t n = (uint32_t)((len + PAGE - 1) / PAGE);
    if (n == 0 || n > PAGES)
        return UMD_ERR_OUT_OF_MEMORY;
    uint32_t run = 0;
    for (uint32_t p = 0; p < PAGES; p++) {
        run = page_is_used(p) ? 0 : run + 1;
        if (run == n) {
            uint32_t first = p + 1 - n;
            mark(first, n, 1);
            pages_used += n;
            uint32_t addr = REGION + first * PAGE;
            memset((void *)(uintptr_t)addr, 0, (size_t)n * PAGE);
            out->cpu = (void *)(uintptr_t)addr;
            out->dev_addr = addr;
            out->len = (size_t)n * PAGE;
            out->handle = first;
            return UMD_OK;
        }
    }
    return UMD_ERR_OUT_OF_MEMORY;
}

static void dma_free(void *ctx, const struct umd_dma *r)
{
    (void)ctx;
    uint32_t n = (uint32_t)(r->len / PAGE);
    if (r->handle < PAGES && n <= PAGES - r->handle) {
        mark((uint32_t)r->handle, n, 0);
        pages_used -= n;
    }
}

static int32_t read_reg(void *ctx, uint32_t off, uint32_t *value)
{
    (void)ctx;
    if (lost)
        return UMD_ERR_DEVICE_LOST;
    if (off >= PAGE || off % 4 != 0)
        return UMD_ERR_UNSUPPORTED;
    if (off == CLOCK_LO) {
        uint32_t h1 = load(REGS + CLOCK_HI);
        for (;;) {
            uint32_t l = load(REGS + CLOCK_LO);
            uint32_t h2 = load(REGS + CLOCK_HI);
            if (h1 == h2) {
                clock_hi = h2;
                *value = l;
                return UMD_OK;
            }
            h1 = h2;
        }
    }
    if (off == CLOCK_HI) {
        *value = clock_hi;
        return UMD_OK;
    }
    if (off >= ENGINE_BASE && (off - ENGINE_BASE) / ENGINE_STRIDE < ENGINES &&
        (off - ENGINE_BASE) % ENGINE_STRIDE == E_DOORBELL) {
        *value = 0;
        return UMD_OK;
    }
    *value = load(REGS + off);
    return UMD_OK;
}

static int32_t ring(uint32_t vector)
{
    if (lost)
        return UMD_ERR_DEVICE_LOST;
    if (vector > ENGINES)
        return UMD_ERR_UNSUPPORTED;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_fetch_add(word(BELLS + 0x40u + 4u * vector), 1u, __ATOMIC_RELEASE);
    return UMD_OK;
}

static int32_t write_reg(void *ctx, uint32_t off, uint32_t value)
{
    (void)ctx;
    if (lost)
        return UMD_ERR_DEVICE_LOST;
    if (off >= PAGE || off % 4 != 0)
        return UMD_ERR_UNSUPPORTED;
    switch (off) {
    case IRQ_STATUS:
        __atomic_fetch_and(word(REGS + off), ~value, __ATOMIC_ACQ_REL);
        return UMD_OK;
    case IRQ_MASK:
    case MMU_CTRL:
    case MMU_ROOT_LO:
    case MMU_ROOT_HI:
    case MMU_INVALIDATE:
        store(REGS + off, value);
        return UMD_OK;
    default:
        break;
    }
    if (off >= ENGINE_ROOT_BASE && off < ENGINE_ROOT_BASE + 8u * ENGINES) {
        store(REGS + off, value);
        return UMD_OK;
    }
    if (off >= ENGINE_BASE && (off - ENGINE_BASE) / ENGINE_STRIDE < ENGINES) {
        uint32_t e = (off - ENGINE_BASE) / ENGINE_STRIDE;
        switch ((off - ENGINE_BASE) % ENGINE_STRIDE) {
        case E_DOORBELL:
            return ring(e);
        case E_RING_BASE_LO:
        case E_RING_BASE_HI:
        case E_RING_SIZE:
        case E_RING_WPTR:
        case E_CTRL:
            store(REGS + off, value);
            return UMD_OK;
        default:
            break;
        }
    }
    return UMD_OK; /* read-only or unlisted: ignored, as on MMIO */
}

static int32_t doorbell(void *ctx, uint32_t engine)
{
    (void)ctx;
    return engine < ENGINES ? ring(engine) : UMD_ERR_UNSUPPORTED;
}

static int32_t control_doorbell(void *ctx)
{
    (void)ctx;
    return ring(ENGINES);
}

static uint64_t now_ns(void *ctx)
{
    (void)ctx;
    return board_now_ns();
}

/* The model is gone when ATTACH is cleared or CLOCK stops moving. */
static void check_heartbeat(void)
{
    if (lost)
        return;
    if (load(BELLS) != ATTACH_MAGIC) {
        lost = 1;
        return;
    }
    uint64_t now = board_now_ns(), c = raw_clock();
    if (c != beat_clock) {
        beat_clock = c;
        beat_seen_ns = now;
    } else if (now - beat_seen_ns > LOSS_WINDOW_NS) {
        lost = 1;
    }
}

static void delay_ns(void *ctx, uint64_t ns)
{
    (void)ctx;
    uint64_t end = board_now_ns() + ns;
    while (board_now_ns() < end)
        ;
    check_heartbeat();
}

uint32_t shared_ram_pages_used(void)
{
    return pages_used;
}

umd_status shared_ram_attach(struct umd_platform *p, uint32_t wait_ms)
{
    uint64_t t0 = board_now_ns();
    while (load(BELLS) != ATTACH_MAGIC) {
        if (board_now_ns() - t0 >= (uint64_t)wait_ms * 1000000u)
            return UMD_ERR_DEVICE_LOST;
    }
    if (load(BELLS + 0x04u) != 1u || load(BELLS + 0x08u) != MEM_SIZE)
        return UMD_ERR_UNSUPPORTED;
    beat_clock = raw_clock();
    beat_seen_ns = board_now_ns();
    memset(p, 0, sizeof *p);
    p->dma_alloc = dma_alloc;
    p->dma_free = dma_free;
    p->read_reg = read_reg;
    p->write_reg = write_reg;
    p->doorbell = doorbell;
    p->control_doorbell = control_doorbell;
    p->now_ns = now_ns;
    p->delay_ns = delay_ns;
    return UMD_OK;
}

/*
 * The C firmware of the C API on the Cortex-M4 of QEMU mps2-an386: the GPU
 * in the board's shared RAM (shared_ram.c), the device in a static
 * storage union, the example workload (examples/workload.c: buffers, a
 * copy, a dispatch behind a cross-queue wait, an event, an injected hang
 * reported and recovered, every output word checked), the state dump
 * after that hang (text, on the UART), shutdown with the leak report;
 * before bring-up, that the transport keeps what is written to the
 * read-write ENGINE_ROOT registers. Reports in qemu-tests' protocol (`@@ RESULT name PASS`,
 * `@@ FATAL ...`) and exits with 0 when everything passed.
 */
#include <stdio.h>
#include <string.h>

#include "board.h"
#include "shared_ram.h"
#include "workload.h"

static union umd_device_storage storage;
static struct umd_platform platform;
/* The state dump's text (docs/c-api.md, "The state dump and the capture"). */
static char dump[16384];

/*
 * The transport stores writes of ENGINE_ROOT_LO/HI(e) (read-write,
 * docs/refgpu.md 2.1) and reads them back; each is 0 again afterwards.
 * The model applies them only on the control doorbell, which nothing
 * rings before bring-up (whose reset sets them to 0 anyway).
 */
static int engine_roots_stored(void)
{
    int ok = 1;
    for (uint32_t e = 0; e < 3; e++) {
        for (uint32_t hi = 0; hi < 2; hi++) {
            uint32_t off = 0x040u + 8u * e + 4u * hi, want = hi ? 0x7u + e : 0x12345000u + (e << 12), got = 0;
            ok &= platform.write_reg(platform.ctx, off, want) == UMD_OK;
            ok &= platform.read_reg(platform.ctx, off, &got) == UMD_OK && got == want;
            ok &= platform.write_reg(platform.ctx, off, 0) == UMD_OK;
            if (got != want)
                printf("ENGINE_ROOT register %#x: wrote %#x, read %#x\n", (unsigned)off, (unsigned)want,
                       (unsigned)got);
        }
    }
    return ok;
}

void umd_panic_hook(void)
{
    printf("@@ FATAL the C API's panic hook ran\n");
    board_exit(5);
}

int main(void)
{
    board_init();
    printf("@@ C firmware: refgpu C API on mps2-an386, GPU in shared RAM\n");
    umd_status s = shared_ram_attach(&platform, 3000);
    if (s != UMD_OK) {
        printf("@@ FATAL attach: %s\n", umd_status_str(s));
        board_exit(2);
    }
    int roots_ok = engine_roots_stored();
    printf("@@ RESULT c_engine_roots %s\n", roots_ok ? "PASS" : "FAIL see above");
    umd_device *dev;
    s = umd_device_init(&storage, sizeof storage, &platform, UMD_MMU_ENABLED, &dev);
    if (s != UMD_OK) {
        printf("@@ FATAL bring-up: %s\n", umd_status_str(s));
        board_exit(2);
    }
    printf("device up: %u pages of GPU memory for the driver's pools\n", (unsigned)shared_ram_pages_used());
    int failed = umd_example_workload(dev);
    printf("@@ RESULT c_workload %s\n", failed ? "FAIL see above" : "PASS");
    size_t len = 0;
    s = umd_device_dump_state(dev, UMD_DUMP_TEXT, dump, sizeof dump, &len);
    printf("state dump (%s, %u bytes):\n%s", umd_status_str(s), (unsigned)len, dump);
    int dump_ok = s == UMD_OK && strlen(dump) == len && strstr(dump, "hangs:\n  total: 1\n") != NULL &&
                  strstr(dump, "kind: hang\n") != NULL;
    printf("@@ RESULT c_dump %s\n", dump_ok ? "PASS" : "FAIL the dump does not name the hang");
    struct umd_shutdown_report r;
    s = umd_device_shutdown(dev, &r);
    int leak_ok = s == UMD_OK && r.leaked_buffers == 1 && r.leaked_bytes == 4096 && shared_ram_pages_used() == 0;
    printf("shutdown: %s, %u buffer (%u bytes) leaked, %u pages still used\n", umd_status_str(s),
           (unsigned)r.leaked_buffers, (unsigned)r.leaked_bytes, (unsigned)shared_ram_pages_used());
    printf("@@ RESULT c_shutdown %s\n", leak_ok ? "PASS" : "FAIL leak report or pages");
    board_exit(failed || !dump_ok || !leak_ok || !roots_ok ? 1 : 0);
}

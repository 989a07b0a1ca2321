/*
 * The C firmware of the C API on the Cortex-M4 of QEMU mps2-an386: the GPU
 * in the board's shared RAM (shared_ram.c), the device in a static
 * storage union, the example workload (examples/workload.c: buffers, a
 * copy, a dispatch behind a cross-queue wait, an event, an injected hang
 * reported and recovered, every output word checked), the state dump
 * after that hang (text, on the UART), shutdown with the leak report. Reports in qemu-tests' protocol (`@@ RESULT name PASS`,
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
    board_exit(failed || !dump_ok || !leak_ok ? 1 : 0);
}

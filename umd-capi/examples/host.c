/*
 * The C API against the in-process model (the host build, feature host):
 * brings a device up, runs the example workload (workload.c: the
 * quickstart in C, a dispatch behind a cross-queue wait, an event, an
 * injected hang reported and recovered, every output word checked), prints
 * the state dump after the hang (text, then checks the JSON form's shape)
 * and shuts down with the leak report. The last line is "ok".
 *
 * Build (docs/c-api.md, "On a Linux host"):
 *   cc -std=c99 examples/host.c examples/workload.c \
 *      $(pkg-config --cflags --libs --static umd-capi)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "umd.h"
#include "workload.h"

#define CHECK(call)                                                            \
    do {                                                                       \
        umd_status s_ = (call);                                                \
        if (s_ != UMD_OK) {                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,      \
                    umd_status_str(s_));                                       \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define EXPECT(cond)                                                           \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* The device's storage: caller-placed (a static in firmware), never moved. */
static union umd_device_storage storage;

int main(int argc, char **argv)
{
    uint32_t gen = argc > 1 ? (uint32_t)atoi(argv[1]) : 2;
    struct umd_platform platform;
    umd_device *dev;
    CHECK(umd_host_inprocess_open(gen, &platform));
    CHECK(umd_device_init(&storage, sizeof storage, &platform, UMD_MMU_ENABLED, &dev));

    if (umd_example_workload(dev) != 0)
        return 1;

    /* The state dump after the workload's injected hang: a size query
     * first, as with snprintf, then the text into a buffer with room to
     * spare. */
    static char dump[65536];
    size_t need = 0, got = 0;
    EXPECT(umd_device_dump_state(dev, UMD_DUMP_TEXT, NULL, 0, &need) == UMD_ERR_TRUNCATED);
    EXPECT(need > 0 && need < sizeof dump);
    CHECK(umd_device_dump_state(dev, UMD_DUMP_TEXT, dump, sizeof dump, &got));
    EXPECT(got == need && strlen(dump) == got);
    EXPECT(strstr(dump, "hangs:\n  total: 1\n") != NULL);
    EXPECT(strstr(dump, "kind: hang\n") != NULL);
    printf("state dump (text, %u bytes):\n%s", (unsigned)got, dump);
    CHECK(umd_device_dump_state(dev, UMD_DUMP_JSON, dump, sizeof dump, &got));
    EXPECT(strlen(dump) == got && got > 2);
    EXPECT(dump[0] == '{' && strcmp(dump + got - 2, "}\n") == 0);
    EXPECT(strstr(dump, "\"hangs\":{\"total\":1,") != NULL);
    EXPECT(strstr(dump, "\"kind\":\"hang\"") != NULL);
    printf("state dump (JSON, %u bytes): names the hang\n", (unsigned)got);

    struct umd_shutdown_report r;
    CHECK(umd_device_shutdown(dev, &r));
    EXPECT(r.leaked_buffers == 1 && r.leaked_bytes == 4096);
    printf("shutdown: %llu buffer (%llu bytes) leaked\n", (unsigned long long)r.leaked_buffers,
           (unsigned long long)r.leaked_bytes);
    CHECK(umd_host_inprocess_close(&platform));
    printf("ok\n");
    return 0;
}

/*
 * The C API against the in-process model (the host build, feature host):
 * brings a device up, runs the example workload (workload.c: the
 * quickstart in C, a dispatch behind a cross-queue wait, an event, an
 * injected hang reported and recovered, every output word checked), prints
 * the state dump after the hang (text, then checks the JSON form's shape),
 * captures two submissions into RAM (written to the .rgcs file named by
 * the optional second argument, for umd-dump) and shuts down with the
 * leak report. The last line is "ok".
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

/* Writes `n` bytes to `path` (NULL: nowhere). */
static int write_file(const char *path, const void *bytes, size_t n)
{
    if (path == NULL)
        return 0;
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "writing %s failed\n", path);
        return 1;
    }
    return 0;
}

/* A capture of two submissions (a fill on GFX, a copy on COPY after it)
 * into a RAM buffer, written to `path` (a .rgcs file umd-dump decodes);
 * then the same into a buffer with room for the first only, written to
 * `path` with ".small" appended. */
static int capture(umd_device *dev, const char *path)
{
    static uint8_t rgcs[65536];
    umd_buffer b;
    uint64_t va;
    CHECK(umd_buffer_alloc(dev, 8192, 0, 0, &b));
    CHECK(umd_buffer_va(dev, b, &va));
    struct umd_command fill = {0};
    fill.kind = UMD_CMD_FILL;
    fill.dst = va;
    fill.size = 4096;
    fill.value = 0xC0FFEEu;
    struct umd_command copy = {0};
    copy.kind = UMD_CMD_COPY;
    copy.src = va;
    copy.dst = va + 4096;
    copy.size = 4096;
    struct umd_capture_result r;
    size_t room[2] = {sizeof rgcs, 0};
    for (int pass = 0; pass < 2; pass++) {
        CHECK(umd_capture_start(dev, rgcs, room[pass],
                                (1u << UMD_QUEUE_GFX) | (1u << UMD_QUEUE_COPY)));
        struct umd_submit_info info = {0};
        umd_fence filled, copied;
        info.queue = UMD_QUEUE_GFX;
        CHECK(umd_submit(dev, &info, &fill, 1, &filled));
        info.queue = UMD_QUEUE_COPY;
        info.waits = &filled;
        info.wait_count = 1;
        CHECK(umd_submit(dev, &info, &copy, 1, &copied));
        CHECK(umd_wait(dev, copied, 1000000000u));
        CHECK(umd_capture_stop(dev, &r));
        uint32_t word;
        CHECK(umd_buffer_read(dev, b, 8188, &word, sizeof word));
        EXPECT(word == 0xC0FFEEu);
        printf("capture into %u bytes: %llu submissions recorded, %llu lost, %llu bytes\n",
               (unsigned)(room[pass] ? room[pass] : sizeof rgcs), (unsigned long long)r.recorded,
               (unsigned long long)r.lost, (unsigned long long)r.bytes);
        if (pass == 0) {
            EXPECT(r.recorded == 2 && r.lost == 0 && r.bytes > UMD_CAPTURE_MIN_BYTES);
            if (write_file(path, rgcs, (size_t)r.bytes) != 0)
                return 1;
            /* Room for the header, the first record and the loss record
             * only: the second submission does not fit. */
            room[1] = (size_t)r.bytes - 1;
        } else {
            EXPECT(r.recorded == 1 && r.lost == 1 && r.bytes <= room[1]);
            if (path != NULL) {
                char small[4096];
                snprintf(small, sizeof small, "%s.small", path);
                if (write_file(small, rgcs, (size_t)r.bytes) != 0)
                    return 1;
            }
        }
    }
    CHECK(umd_buffer_free(dev, b));
    return 0;
}

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

    if (capture(dev, argc > 2 ? argv[2] : NULL) != 0)
        return 1;

    struct umd_shutdown_report r;
    CHECK(umd_device_shutdown(dev, &r));
    EXPECT(r.leaked_buffers == 1 && r.leaked_bytes == 4096);
    printf("shutdown: %llu buffer (%llu bytes) leaked\n", (unsigned long long)r.leaked_buffers,
           (unsigned long long)r.leaked_bytes);
    CHECK(umd_host_inprocess_close(&platform));
    printf("ok\n");
    return 0;
}

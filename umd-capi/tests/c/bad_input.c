/*
 * Bad input through the C API, from C: every refused call gets its typed
 * status and changes nothing (live buffers, submissions and buffer
 * contents are compared before and after). Prints one line per check and
 * "ok" last; exits 1 at the first failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static union umd_device_storage storage1, storage2, forged;

struct snapshot {
    uint64_t live, submissions;
    uint8_t bytes[64];
};

static void snap(umd_device *dev, umd_buffer b, struct snapshot *s)
{
    struct umd_stats st;
    OK(umd_device_stats(dev, &st));
    s->live = st.live_buffers;
    s->submissions = st.submissions;
    OK(umd_buffer_read(dev, b, 0, s->bytes, sizeof s->bytes));
}

/* Runs after each check: nothing changed. */
static void unchanged(const char *what, umd_device *dev, umd_buffer b, const struct snapshot *before)
{
    struct snapshot now;
    snap(dev, b, &now);
    if (now.live != before->live || now.submissions != before->submissions ||
        memcmp(now.bytes, before->bytes, sizeof now.bytes) != 0) {
        fprintf(stderr, "%s: the device changed\n", what);
        line_failed = 1;
    }
    if (line_failed) {
        fprintf(stderr, "bad-input %s: FAILED\n", what);
        exit(1);
    }
    printf("bad-input %s: ok\n", what);
}

int main(void)
{
    struct umd_platform p1, p2, incomplete;
    umd_device *dev, *dev2, *none = NULL;
    OK(umd_host_inprocess_open(2, &p1));
    OK(umd_host_inprocess_open(1, &p2));

    /* Bring-up arguments, before any device exists. */
    IS(umd_device_init(NULL, sizeof storage1, &p1, UMD_MMU_ENABLED, &dev), UMD_ERR_NULL);
    IS(umd_device_init(&storage1, sizeof storage1, NULL, UMD_MMU_ENABLED, &dev), UMD_ERR_NULL);
    IS(umd_device_init(&storage1, sizeof storage1, &p1, UMD_MMU_ENABLED, NULL), UMD_ERR_NULL);
    IS(umd_device_init(storage1.bytes + 1, sizeof storage1 - 8, &p1, UMD_MMU_ENABLED, &dev),
       UMD_ERR_MISALIGNED);
    IS(umd_device_init(&storage1, UMD_DEVICE_STORAGE_SIZE / 2, &p1, UMD_MMU_ENABLED, &dev),
       UMD_ERR_TOO_SMALL);
    IS(umd_device_init(&storage1, sizeof storage1, &p1, 7, &dev), UMD_ERR_INVALID_ARGUMENT);
    incomplete = p1;
    incomplete.dma_alloc = NULL;
    IS(umd_device_init(&storage1, sizeof storage1, &incomplete, UMD_MMU_ENABLED, &dev), UMD_ERR_NULL);
    IS(umd_device_stats((umd_device *)&storage1, &(struct umd_stats){0}), UMD_ERR_NOT_A_DEVICE);
    if (line_failed)
        return 1;
    printf("bad-input init arguments: ok\n");

    OK(umd_device_init(&storage1, sizeof storage1, &p1, UMD_MMU_ENABLED, &dev));
    OK(umd_device_init(&storage2, sizeof storage2, &p2, UMD_MMU_BYPASS, &dev2));
    umd_buffer b, other, stale;
    OK(umd_buffer_alloc(dev, 4096, 0, 0, &b));
    uint8_t pattern[64];
    for (int i = 0; i < 64; i++)
        pattern[i] = (uint8_t)(i * 7 + 1);
    OK(umd_buffer_write(dev, b, 0, pattern, sizeof pattern));
    OK(umd_buffer_alloc(dev2, 4096, 0, 0, &other));
    OK(umd_buffer_alloc(dev, 4096, 0, 0, &stale));
    OK(umd_buffer_free(dev, stale));
    struct snapshot before;
    snap(dev, b, &before);

    IS(umd_device_init(&storage1, sizeof storage1, &p1, UMD_MMU_ENABLED, &dev), UMD_ERR_BUSY);
    unchanged("storage already holding a device", dev, b, &before);

    IS(umd_buffer_va(NULL, b, &(uint64_t){0}), UMD_ERR_NULL);
    IS(umd_buffer_va((umd_device *)&forged, b, &(uint64_t){0}), UMD_ERR_NOT_A_DEVICE);
    IS(umd_buffer_va((umd_device *)(forged.bytes + 4), b, &(uint64_t){0}), UMD_ERR_MISALIGNED);
    unchanged("NULL, forged and misaligned device pointers", dev, b, &before);

    umd_buffer nb;
    IS(umd_buffer_alloc(dev, 4096, 0, 0, NULL), UMD_ERR_NULL);
    IS(umd_buffer_alloc(dev, 4096, 0, 0x100, &nb), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_buffer_alloc(dev, 0, 0, 0, &nb), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_buffer_alloc(dev, 4096, 3, 0, &nb), UMD_ERR_INVALID_ARGUMENT);
    unchanged("buffer allocation arguments", dev, b, &before);

    uint64_t va_words[2];
    IS(umd_buffer_va(dev, b, NULL), UMD_ERR_NULL);
    IS(umd_buffer_va(dev, b, (uint64_t *)((char *)va_words + 1)), UMD_ERR_MISALIGNED);
    IS(umd_buffer_write(dev, b, 0, NULL, 16), UMD_ERR_NULL);
    IS(umd_buffer_read(dev, b, 0, NULL, 16), UMD_ERR_NULL);
    unchanged("NULL and misaligned data pointers", dev, b, &before);

    IS(umd_buffer_write(dev, stale, 0, pattern, 4), UMD_ERR_STALE_HANDLE);
    IS(umd_buffer_free(dev, stale), UMD_ERR_STALE_HANDLE);
    unchanged("stale buffer handle (use and double free)", dev, b, &before);

    IS(umd_buffer_write(dev, other, 0, pattern, 4), UMD_ERR_FOREIGN_HANDLE);
    IS(umd_buffer_free(dev, other), UMD_ERR_FOREIGN_HANDLE);
    unchanged("foreign buffer handle (another device's)", dev, b, &before);

    IS(umd_buffer_free(dev, 0), UMD_ERR_BAD_HANDLE);
    IS(umd_buffer_free(dev, b ^ (UINT64_C(3) << 62)), UMD_ERR_BAD_HANDLE);  /* another kind */
    IS(umd_buffer_free(dev, b + (UINT64_C(900) << 32)), UMD_ERR_BAD_HANDLE); /* a slot never used */
    IS(umd_buffer_free(dev, b + 5), UMD_ERR_BAD_HANDLE);                    /* a generation never given */
    unchanged("forged buffer handles", dev, b, &before);

    uint8_t big[64];
    memset(big, 0xEE, sizeof big);
    IS(umd_buffer_write(dev, b, 4096 - 4, big, 8), UMD_ERR_OUT_OF_RANGE);
    IS(umd_buffer_write(dev, b, UINT64_MAX - 2, big, 8), UMD_ERR_OUT_OF_RANGE);
    IS(umd_buffer_read(dev, b, 4090, big, 8), UMD_ERR_OUT_OF_RANGE);
    unchanged("a length past the buffer", dev, b, &before);

    uint64_t va;
    OK(umd_buffer_va(dev, b, &va));
    struct umd_command fill = {0};
    fill.kind = UMD_CMD_FILL;
    fill.dst = va;
    fill.size = 64;
    struct umd_submit_info info = {0};
    umd_fence f;
    info.queue = 7;
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_UNKNOWN_QUEUE);
    info.queue = 0x100;
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_UNKNOWN_QUEUE);
    info.queue = UMD_QUEUE_GFX;
    IS(umd_submit(dev, NULL, &fill, 1, &f), UMD_ERR_NULL);
    IS(umd_submit(dev, &info, NULL, 1, &f), UMD_ERR_NULL);
    IS(umd_submit(dev, &info, &fill, 0, &f), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_submit(dev, &info, &fill, 1, NULL), UMD_ERR_NULL);
    unchanged("unknown queues, NULL submission arguments", dev, b, &before);

    struct umd_command cmds[2];
    cmds[0] = fill;
    cmds[1] = fill;
    cmds[1].kind = 99;
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_INVALID_ARGUMENT);
    cmds[1] = fill;
    cmds[1].kind = UMD_CMD_WAIT_MEM;
    cmds[1].op = 7; /* one past UMD_CMP_SEQ_GE */
    cmds[1].size = 4;
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_INVALID_ARGUMENT);
    cmds[1].op = UMD_CMP_EQ;
    cmds[1].size = 5;
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_INVALID_ARGUMENT);
    cmds[1] = fill;
    cmds[1].kind = UMD_CMD_DISPATCH;
    cmds[1].op = 9;
    cmds[1].size = 4;
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_INVALID_ARGUMENT);
    cmds[1] = fill;
    cmds[1].value = UINT64_C(1) << 32; /* a fill pattern wider than 32 bits */
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_INVALID_ARGUMENT);
    cmds[1] = fill;
    cmds[1].kind = UMD_CMD_WRITE_DATA;
    cmds[1].words = NULL;
    cmds[1].word_count = 2;
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_NULL);
    cmds[1] = fill;
    cmds[1].size = 6; /* the encoder refuses a fill of 6 bytes */
    IS(umd_submit(dev, &info, cmds, 2, &f), UMD_ERR_ENCODE);
    unchanged("unknown command kinds and enum values, encoder refusals", dev, b, &before);

    umd_fence gfx_fence, foreign_fence;
    OK(umd_submit(dev, &info, &fill, 1, &gfx_fence));
    OK(umd_wait(dev, gfx_fence, UMD_WAIT_FOREVER));
    {
        struct umd_command nop = {0};
        nop.kind = UMD_CMD_NOP;
        nop.size = 1;
        OK(umd_submit(dev2, &info, &nop, 1, &foreign_fence));
        OK(umd_wait(dev2, foreign_fence, UMD_WAIT_FOREVER));
    }
    OK(umd_buffer_write(dev, b, 0, pattern, sizeof pattern));
    snap(dev, b, &before);
    umd_fence waits[5] = {gfx_fence, gfx_fence, gfx_fence, gfx_fence, gfx_fence};
    info.queue = UMD_QUEUE_COPY;
    info.waits = waits;
    info.wait_count = 5;
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_TOO_MANY);
    info.wait_count = 1;
    waits[0] = foreign_fence;
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_FOREIGN_HANDLE);
    waits[0] = b; /* a buffer handle as a fence */
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_BAD_HANDLE);
    info.wait_count = 0;
    struct umd_buffer_use use = {b, 9};
    info.buffers = &use;
    info.buffer_count = 1;
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_INVALID_ARGUMENT);
    use.access = UMD_ACCESS_WRITE;
    use.buffer = stale;
    IS(umd_submit(dev, &info, &fill, 1, &f), UMD_ERR_STALE_HANDLE);
    unchanged("bad waits and declared buffers", dev, b, &before);

    IS(umd_wait(dev, foreign_fence, 0), UMD_ERR_FOREIGN_HANDLE);
    IS(umd_wait(dev, b, 0), UMD_ERR_BAD_HANDLE);
    IS(umd_wait(dev, gfx_fence + 1000, 0), UMD_ERR_NOT_SUBMITTED);
    IS(umd_fence_state(dev, gfx_fence, NULL), UMD_ERR_NULL);
    unchanged("bad fences", dev, b, &before);

    umd_event ev;
    OK(umd_event_create(dev, &ev));
    OK(umd_event_destroy(dev, ev));
    snap(dev, b, &before);
    IS(umd_event_set(dev, ev), UMD_ERR_STALE_HANDLE);
    IS(umd_event_destroy(dev, ev), UMD_ERR_STALE_HANDLE);
    IS(umd_event_set(dev, b), UMD_ERR_BAD_HANDLE);
    IS(umd_buffer_write(dev, ev, 0, pattern, 4), UMD_ERR_BAD_HANDLE);
    IS(umd_event_wait(dev, ev + (UINT64_C(3) << 32), 0), UMD_ERR_BAD_HANDLE);
    IS(umd_event_is_set(dev, ev, NULL), UMD_ERR_NULL);
    unchanged("stale and forged events", dev, b, &before);

    char text[16];
    IS(umd_last_hang(dev, text, sizeof text, NULL), UMD_ERR_NOT_FOUND);
    IS(umd_last_hang(dev, text, 0, NULL), UMD_ERR_TOO_SMALL);
    IS(umd_last_hang(dev, NULL, sizeof text, NULL), UMD_ERR_NULL);
    if (strcmp(umd_status_str(12345), "unknown status") != 0 || strcmp(umd_status_str(UMD_OK), "ok") != 0) {
        fprintf(stderr, "umd_status_str\n");
        line_failed = 1;
    }
    unchanged("hang report arguments, unknown status values", dev, b, &before);

    /* The state dump: refused arguments write nothing; a buffer too small
     * gets the dump's beginning, NUL-terminated, and the full length. */
    char dump[64];
    size_t need = 7, got = 7;
    memset(dump, 'x', sizeof dump);
    IS(umd_device_dump_state(dev, 2, dump, sizeof dump, &got), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_device_dump_state(dev, UINT32_MAX, dump, sizeof dump, &got), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_device_dump_state(NULL, UMD_DUMP_TEXT, dump, sizeof dump, &got), UMD_ERR_NULL);
    IS(umd_device_dump_state((umd_device *)&forged, UMD_DUMP_TEXT, dump, sizeof dump, &got),
       UMD_ERR_NOT_A_DEVICE);
    IS(umd_device_dump_state(dev, UMD_DUMP_TEXT, NULL, sizeof dump, &got), UMD_ERR_NULL);
    IS(umd_device_dump_state(dev, UMD_DUMP_TEXT, dump, 0, NULL), UMD_ERR_NULL);
    IS(umd_device_dump_state(dev, UMD_DUMP_JSON, dump, sizeof dump, (size_t *)((char *)va_words + 1)),
       UMD_ERR_MISALIGNED);
    for (size_t i = 0; i < sizeof dump; i++)
        if (dump[i] != 'x')
            line_failed = 1;
    if (got != 7)
        line_failed = 1;
    IS(umd_device_dump_state(dev, UMD_DUMP_JSON, NULL, 0, &need), UMD_ERR_TRUNCATED);
    IS(umd_device_dump_state(dev, UMD_DUMP_JSON, dump, sizeof dump, &got), UMD_ERR_TRUNCATED);
    if (got != need || need < sizeof dump || strlen(dump) != sizeof dump - 1 || dump[0] != '{')
        line_failed = 1;
    IS(umd_device_dump_state(dev, UMD_DUMP_TEXT, dump, sizeof dump, NULL), UMD_ERR_TRUNCATED);
    if (strncmp(dump, "device:\n", 8) != 0 || strlen(dump) != sizeof dump - 1)
        line_failed = 1;
    unchanged("state dump arguments (unknown format, NULL, too small)", dev, b, &before);

    /* Capture: refused starts start nothing (a stop finds no capture); a
     * second start while one runs is refused and leaves the first one
     * recording; a refused stop leaves it running. */
    static uint8_t rgcs[4096];
    struct umd_capture_result cr = {0};
    IS(umd_capture_start(dev, NULL, sizeof rgcs, 1u), UMD_ERR_NULL);
    IS(umd_capture_start(dev, rgcs, UMD_CAPTURE_MIN_BYTES - 1, 1u), UMD_ERR_TOO_SMALL);
    IS(umd_capture_start(dev, rgcs, sizeof rgcs, 0u), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_capture_start(dev, rgcs, sizeof rgcs, 1u << 3), UMD_ERR_INVALID_ARGUMENT);
    IS(umd_capture_start(NULL, rgcs, sizeof rgcs, 1u), UMD_ERR_NULL);
    IS(umd_capture_stop(dev, &cr), UMD_ERR_NOT_FOUND);
    OK(umd_capture_start(dev, rgcs, sizeof rgcs, 1u << UMD_QUEUE_GFX));
    IS(umd_capture_start(dev, rgcs + 2048, 2048, 1u), UMD_ERR_BUSY);
    IS(umd_capture_stop(dev, NULL), UMD_ERR_NULL);
    IS(umd_capture_stop(dev, (struct umd_capture_result *)((char *)&cr + 1)), UMD_ERR_MISALIGNED);
    OK(umd_capture_stop(dev, &cr));
    if (cr.recorded != 0 || cr.lost != 0 || cr.bytes != UMD_CAPTURE_MIN_BYTES - 16 ||
        memcmp(rgcs, "RGCS", 4) != 0)
        line_failed = 1;
    IS(umd_capture_stop(dev, &cr), UMD_ERR_NOT_FOUND);
    unchanged("capture arguments (NULL, too small, bad queues, busy, not running)", dev, b, &before);

    OK(umd_buffer_free(dev, b));
    OK(umd_buffer_free(dev2, other));
    struct umd_shutdown_report r;
    OK(umd_device_shutdown(dev, &r));
    IS(umd_device_shutdown(dev, &r), UMD_ERR_NOT_A_DEVICE);
    IS(umd_buffer_alloc(dev, 4096, 0, 0, &nb), UMD_ERR_NOT_A_DEVICE);
    IS(umd_device_shutdown(none, &r), UMD_ERR_NULL);
    OK(umd_device_shutdown(dev2, NULL));
    if (line_failed || r.leaked_buffers != 0)
        return 1;
    printf("bad-input use after shutdown: ok\n");
    OK(umd_host_inprocess_close(&p1));
    OK(umd_host_inprocess_close(&p2));
    IS(umd_host_inprocess_close(&p1), UMD_ERR_NULL);
    if (line_failed)
        return 1;
    printf("ok\n");
    return 0;
}

/*
 * A buffer handle forged from C for an event's buffer: an event is a small
 * buffer of the core's table, and C can compute the handle its slot and
 * generation would have (the slot of a freed buffer, one generation on).
 * Every buffer call refuses it with UMD_ERR_BAD_HANDLE, nothing changes,
 * and the event goes on working. Prints one line per check and "ok" last;
 * exits 1 at the first failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

static void check(const char *what)
{
    if (line_failed) {
        fprintf(stderr, "forged-event %s: FAILED\n", what);
        exit(1);
    }
    printf("forged-event %s: ok\n", what);
}

static union umd_device_storage storage;

int main(void)
{
    struct umd_platform p;
    umd_device *dev;
    OK(umd_host_inprocess_open(2, &p));
    OK(umd_device_init(&storage, sizeof storage, &p, UMD_MMU_ENABLED, &dev));
    check("bring-up");

    /* The freed slot is the next one given out, two generations on (live
     * generations are odd; the generation is the handle's low 32 bits). */
    umd_buffer freed, forged;
    umd_event ev;
    OK(umd_buffer_alloc(dev, 64, 0, 0, &freed));
    OK(umd_buffer_free(dev, freed));
    OK(umd_event_create(dev, &ev));
    forged = freed + 2;
    check("an event in a freed buffer's slot");

    struct umd_stats before, after;
    OK(umd_device_stats(dev, &before));
    uint8_t one[4] = {1, 0, 0, 0}, out[4];
    uint64_t va;
    IS(umd_buffer_write(dev, forged, 0, one, sizeof one), UMD_ERR_BAD_HANDLE);
    IS(umd_buffer_read(dev, forged, 0, out, sizeof out), UMD_ERR_BAD_HANDLE);
    IS(umd_buffer_va(dev, forged, &va), UMD_ERR_BAD_HANDLE);
    struct umd_command barrier = {0};
    barrier.kind = UMD_CMD_BARRIER;
    struct umd_buffer_use use = {forged, UMD_ACCESS_WRITE};
    struct umd_submit_info info = {0};
    info.queue = UMD_QUEUE_COPY;
    info.buffers = &use;
    info.buffer_count = 1;
    umd_fence f;
    IS(umd_submit(dev, &info, &barrier, 1, &f), UMD_ERR_BAD_HANDLE);
    IS(umd_buffer_free(dev, forged), UMD_ERR_BAD_HANDLE);
    OK(umd_device_stats(dev, &after));
    if (after.live_buffers != before.live_buffers || after.submissions != before.submissions) {
        fprintf(stderr, "the device changed\n");
        line_failed = 1;
    }
    check("forged buffer handle to the event's buffer");

    uint32_t set = 7;
    OK(umd_event_is_set(dev, ev, &set));
    if (set != 0) {
        fprintf(stderr, "the event was set through the forged handle\n");
        line_failed = 1;
    }
    OK(umd_event_set(dev, ev));
    OK(umd_event_is_set(dev, ev, &set));
    if (set != 1) {
        fprintf(stderr, "the event does not set\n");
        line_failed = 1;
    }
    OK(umd_event_destroy(dev, ev));
    check("the event still works");

    struct umd_shutdown_report r;
    OK(umd_device_shutdown(dev, &r));
    if (r.leaked_buffers != 0) {
        fprintf(stderr, "%llu buffers leaked\n", (unsigned long long)r.leaked_buffers);
        line_failed = 1;
    }
    OK(umd_host_inprocess_close(&p));
    check("shutdown");
    printf("ok\n");
    return 0;
}

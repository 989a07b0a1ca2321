/*
 * The example workload of the C API, shared by the host example
 * (examples/host.c, the in-process model) and the Cortex-M4 firmware
 * (firmware/m4, QEMU mps2-an386 with the GPU in shared RAM): the
 * quickstart (a copy, then a fill after it on another queue), a dispatch
 * behind a cross-queue wait, an event set by the GPU, and an injected hang
 * (a WAIT_MEM on a word nothing writes) reported and recovered. Every
 * output word is checked. One buffer of 4096 bytes is left allocated on
 * purpose, for the caller's leak report to name.
 */
#include <stdio.h>
#include <string.h>

#include "workload.h"

#define CHECK(call)                                                            \
    do {                                                                       \
        umd_status s_ = (call);                                                \
        if (s_ != UMD_OK) {                                                    \
            printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
                   umd_status_str(s_));                                        \
            return 1;                                                          \
        }                                                                      \
    } while (0)

#define EXPECT(cond)                                                           \
    do {                                                                       \
        if (!(cond)) {                                                         \
            printf("%s:%d: expected %s\n", __FILE__, __LINE__, #cond);         \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static uint8_t bytes[65536];

int umd_example_workload(umd_device *dev)
{
    /* The quickstart: a copy on COPY, then a fill on COMPUTE after it. */
    umd_buffer src, dst;
    CHECK(umd_buffer_alloc(dev, 65536, 0, 0, &src));
    CHECK(umd_buffer_alloc(dev, 65536, 0, 0, &dst));
    memset(bytes, 0xAB, sizeof bytes);
    CHECK(umd_buffer_write(dev, src, 0, bytes, sizeof bytes));
    uint64_t s, d;
    CHECK(umd_buffer_va(dev, src, &s));
    CHECK(umd_buffer_va(dev, dst, &d));

    struct umd_command copy = {0};
    copy.kind = UMD_CMD_COPY;
    copy.src = s;
    copy.dst = d;
    copy.size = 65536;
    struct umd_submit_info on_copy = {0};
    on_copy.queue = UMD_QUEUE_COPY;
    umd_fence copied;
    CHECK(umd_submit(dev, &on_copy, &copy, 1, &copied));

    struct umd_command fill = {0};
    fill.kind = UMD_CMD_FILL;
    fill.dst = d;
    fill.size = 256;
    fill.value = 0;
    struct umd_buffer_use uses[1] = {{dst, UMD_ACCESS_WRITE}};
    struct umd_submit_info after = {0};
    after.queue = UMD_QUEUE_COMPUTE;
    after.waits = &copied;
    after.wait_count = 1;
    after.buffers = uses;
    after.buffer_count = 1;
    umd_fence filled;
    CHECK(umd_submit(dev, &after, &fill, 1, &filled));
    CHECK(umd_buffer_free(dev, src)); /* reused only after `copied` */
    CHECK(umd_wait(dev, filled, 1000000000u));
    CHECK(umd_buffer_read(dev, dst, 0, bytes, sizeof bytes));
    for (size_t i = 0; i < sizeof bytes; i++)
        EXPECT(bytes[i] == (i < 256 ? 0x00 : 0xAB));
    printf("copy and fill: %u bytes checked\n", (unsigned)sizeof bytes);

    /* A dispatch (a[i] + b[i]) on COMPUTE behind an upload on COPY. */
    enum { N = 1024 };
    static uint32_t a[N], b[N], out[N];
    for (uint32_t i = 0; i < N; i++) {
        a[i] = i * 3u;
        b[i] = 0x10000u + i;
    }
    umd_buffer ba, bb, stage, bo;
    CHECK(umd_buffer_alloc(dev, sizeof a, 0, 0, &ba));
    CHECK(umd_buffer_alloc(dev, sizeof b, 0, 0, &stage));
    CHECK(umd_buffer_alloc(dev, sizeof b, 0, 0, &bb));
    CHECK(umd_buffer_alloc(dev, sizeof out, 0, 0, &bo));
    CHECK(umd_buffer_write(dev, ba, 0, a, sizeof a));
    CHECK(umd_buffer_write(dev, stage, 0, b, sizeof b));
    uint64_t va_a, va_b, va_stage, va_o;
    CHECK(umd_buffer_va(dev, ba, &va_a));
    CHECK(umd_buffer_va(dev, bb, &va_b));
    CHECK(umd_buffer_va(dev, stage, &va_stage));
    CHECK(umd_buffer_va(dev, bo, &va_o));
    struct umd_command upload = {0};
    upload.kind = UMD_CMD_COPY;
    upload.src = va_stage;
    upload.dst = va_b;
    upload.size = sizeof b;
    umd_fence uploaded;
    CHECK(umd_submit(dev, &on_copy, &upload, 1, &uploaded));
    struct umd_command add = {0};
    add.kind = UMD_CMD_DISPATCH;
    add.op = UMD_DISPATCH_ADD_U32;
    add.src = va_a;
    add.src2 = va_b;
    add.dst = va_o;
    add.size = N;
    struct umd_submit_info compute = {0};
    compute.queue = UMD_QUEUE_COMPUTE;
    compute.waits = &uploaded;
    compute.wait_count = 1;
    umd_fence added;
    CHECK(umd_submit(dev, &compute, &add, 1, &added));
    CHECK(umd_wait(dev, added, UMD_WAIT_FOREVER));
    CHECK(umd_buffer_read(dev, bo, 0, out, sizeof out));
    for (uint32_t i = 0; i < N; i++)
        EXPECT(out[i] == a[i] + b[i]);
    printf("dispatch after a cross-queue wait: %d words checked\n", N);

    /* An event set by the GPU, waited for by the CPU. */
    umd_event ev;
    CHECK(umd_event_create(dev, &ev));
    struct umd_command set = {0};
    set.kind = UMD_CMD_EVENT_SET;
    set.event = ev;
    struct umd_submit_info gfx = {0};
    gfx.queue = UMD_QUEUE_GFX;
    umd_fence set_done;
    CHECK(umd_submit(dev, &gfx, &set, 1, &set_done));
    CHECK(umd_event_wait(dev, ev, 1000000000u));
    CHECK(umd_wait(dev, set_done, 1000000000u));
    CHECK(umd_event_destroy(dev, ev));
    printf("event set by the GPU\n");

    /* An injected hang: GFX waits for a word nothing writes. */
    struct umd_command stuck = {0};
    stuck.kind = UMD_CMD_WAIT_MEM;
    stuck.op = UMD_CMP_EQ;
    stuck.src = va_o; /* holds a[0] + b[0] = 0x10000, never 1 */
    stuck.value = 1;
    stuck.mask = 0xFFFFFFFFu;
    stuck.size = 4;
    umd_fence hung;
    CHECK(umd_submit(dev, &gfx, &stuck, 1, &hung));
    umd_status w = umd_wait(dev, hung, 10000000000u);
    EXPECT(w == UMD_ERR_FENCE_FAILED);
    uint32_t state;
    CHECK(umd_fence_state(dev, hung, &state));
    EXPECT(state == UMD_FENCE_FAILED);
    static char report[8192];
    size_t len;
    CHECK(umd_last_hang(dev, report, sizeof report, &len));
    EXPECT(len > 0 && strlen(report) == len);
    printf("hang reported (%u bytes), first line: %.*s\n", (unsigned)len,
           (int)strcspn(report, "\n"), report);
    /* Recovered: the queue runs new work. */
    struct umd_command again = {0};
    again.kind = UMD_CMD_FILL;
    again.dst = va_o;
    again.size = sizeof out;
    again.value = 0x5A5A5A5Au;
    umd_fence refilled;
    CHECK(umd_submit(dev, &gfx, &again, 1, &refilled));
    CHECK(umd_wait(dev, refilled, 1000000000u));
    CHECK(umd_buffer_read(dev, bo, 0, out, sizeof out));
    for (uint32_t i = 0; i < N; i++)
        EXPECT(out[i] == 0x5A5A5A5Au);
    struct umd_stats st;
    CHECK(umd_device_stats(dev, &st));
    EXPECT(st.hangs == 1 && st.resets >= 1);
    printf("recovered: %d words checked; %llu submissions, %llu hangs, %llu resets\n", N,
           (unsigned long long)st.submissions, (unsigned long long)st.hangs,
           (unsigned long long)st.resets);

    /* One buffer left on purpose: the leak report names it. */
    CHECK(umd_buffer_free(dev, dst));
    CHECK(umd_buffer_free(dev, ba));
    CHECK(umd_buffer_free(dev, bb));
    CHECK(umd_buffer_free(dev, stage));
    return 0;
}

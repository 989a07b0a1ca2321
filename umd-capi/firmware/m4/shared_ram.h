/* The refgpu over the shared-RAM binding (docs/refgpu.md 2.3, "shared
 * RAM") as a C platform for the C API. */
#ifndef M4_SHARED_RAM_H
#define M4_SHARED_RAM_H

#include "umd.h"

/* Waits up to `wait_ms` for the model to attach (ATTACH reads "RGSR"),
 * checks the layout, and fills `*p` with the platform. UMD_ERR_DEVICE_LOST
 * when no model attached in time, UMD_ERR_UNSUPPORTED for another layout. */
umd_status shared_ram_attach(struct umd_platform *p, uint32_t wait_ms);
/* Pages of system memory handed out now. */
uint32_t shared_ram_pages_used(void);

#endif

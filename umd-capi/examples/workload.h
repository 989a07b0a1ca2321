/* The example workload of the C API (workload.c). */
#ifndef UMD_EXAMPLE_WORKLOAD_H
#define UMD_EXAMPLE_WORKLOAD_H

#include "umd.h"

/* Runs the workload on `dev`; 0 when every step and every word checked,
 * else 1 after printing the failure. Leaves one 4096-byte buffer
 * allocated. */
int umd_example_workload(umd_device *dev);

#endif

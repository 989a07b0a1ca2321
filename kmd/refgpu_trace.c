// SPDX-License-Identifier: GPL-2.0 OR MIT
/* Copyright the refgpu authors */
/* The tracepoints' definitions (refgpu_trace.h). */

#define CREATE_TRACE_POINTS
#include "refgpu_trace.h"

/*
 * The checks the C tests share: IS(call, want) compares a call's status
 * with the one expected and notes a failure (with the call, its status
 * and the line) without stopping, so one run reports every wrong status
 * of a group; OK(call) expects UMD_OK. A test ends each group with its
 * own report, which exits 1 when `line_failed` is set.
 */
#ifndef UMD_TEST_CHECK_H
#define UMD_TEST_CHECK_H

#include <stdio.h>

#include "umd.h"

static int line_failed;

#define IS(call, want)                                                         \
    do {                                                                       \
        umd_status got_ = (call);                                              \
        if (got_ != (want)) {                                                  \
            fprintf(stderr, "%s:%d: %s gave %d (%s), expected %s\n", __FILE__, \
                    __LINE__, #call, (int)got_, umd_status_str(got_), #want);  \
            line_failed = 1;                                                   \
        }                                                                      \
    } while (0)

#define OK(call) IS(call, UMD_OK)

#endif

/* The mps2-an386 board, as the C firmware uses it: UART0, SysTick time,
 * semihosting exit. */
#ifndef M4_BOARD_H
#define M4_BOARD_H

#include <stdint.h>

/* UART0 on, stdout (picolibc's tinystdio) on UART0, SysTick counting. */
void board_init(void);
/* Monotonic nanoseconds since board_init (SysTick on the 25 MHz CPU clock). */
uint64_t board_now_ns(void);
/* Leaves QEMU with `code` as its exit status (semihosting). */
void board_exit(int code) __attribute__((noreturn));

#endif

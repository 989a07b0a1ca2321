/*
 * Board support of the C firmware on QEMU mps2-an386 (Cortex-M4, 25 MHz):
 * the vector table, UART0 (CMSDK APB UART) as stdout, SysTick as the
 * clock (24-bit reload, wraps counted by its exception), and the exit
 * through semihosting SYS_EXIT_EXTENDED. picolibc's crt0 (crt0-minimal)
 * does the rest of the start-up: .data, .bss, TLS, the FPU, main.
 */
#include <stdio.h>

#include "board.h"

#define UART0 0x40004000u
#define UART_DATA (*(volatile uint32_t *)(UART0 + 0x00))
#define UART_STATE (*(volatile uint32_t *)(UART0 + 0x04))
#define UART_CTRL (*(volatile uint32_t *)(UART0 + 0x08))
#define UART_BAUDDIV (*(volatile uint32_t *)(UART0 + 0x10))
#define UART_TX_FULL 1u
#define UART_TX_EN 1u

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define SCB_ICSR (*(volatile uint32_t *)0xE000ED04u)
#define ICSR_PENDSTSET (1u << 26)
#define SYST_RELOAD 0xFFFFFFu
#define NS_PER_TICK 40u /* 25 MHz */

static volatile uint32_t systick_wraps;

static void systick_isr(void)
{
    systick_wraps++;
}

static void fault_isr(void)
{
    static const char msg[] = "@@ FATAL HardFault in the C firmware\n";
    for (const char *p = msg; *p; p++) {
        while (UART_STATE & UART_TX_FULL)
            ;
        UART_DATA = (uint32_t)(unsigned char)*p;
    }
    board_exit(3);
}

static void default_isr(void)
{
    fault_isr();
}

extern uint8_t __stack[];
extern void _start(void);

/* A vector table entry: the initial stack pointer or a handler. */
union vector {
    void *stack;
    void (*handler)(void);
};

/* The vector table: picolibc's linker script puts `.data.init.enter` at
 * the start of flash (address 0, where the M4 looks for it). */
__attribute__((section(".data.init.enter"), used)) const union vector __interrupt_vector[16] = {
    {.stack = __stack},          {.handler = _start},       {.handler = default_isr},
    {.handler = fault_isr},      {.handler = fault_isr},    {.handler = fault_isr},
    {.handler = fault_isr},      {.handler = 0},            {.handler = 0},
    {.handler = 0},              {.handler = 0},            {.handler = default_isr},
    {.handler = default_isr},    {.handler = 0},            {.handler = default_isr},
    {.handler = systick_isr},
};

static int uart_putc(char c, FILE *f)
{
    (void)f;
    while (UART_STATE & UART_TX_FULL)
        ;
    UART_DATA = (uint32_t)(unsigned char)c;
    return (unsigned char)c;
}

static FILE uart_file = FDEV_SETUP_STREAM(uart_putc, NULL, NULL, _FDEV_SETUP_WRITE);
FILE *const stdout = &uart_file;
FILE *const stderr = &uart_file;

void board_init(void)
{
    UART_BAUDDIV = 16;
    UART_CTRL = UART_TX_EN;
    SYST_RVR = SYST_RELOAD;
    SYST_CVR = 0;
    SYST_CSR = 7; /* enable, exception, processor clock */
}

uint64_t board_now_ns(void)
{
    uint32_t primask;
    __asm__ volatile("mrs %0, primask\n cpsid i" : "=r"(primask)::"memory");
    uint32_t wraps = systick_wraps;
    uint32_t cvr = SYST_CVR;
    /* The counter wrapped but its exception is not taken yet (interrupts
     * are off): count the wrap and read the reloaded value. */
    if (SCB_ICSR & ICSR_PENDSTSET) {
        cvr = SYST_CVR;
        wraps++;
    }
    __asm__ volatile("msr primask, %0" ::"r"(primask) : "memory");
    uint64_t ticks = ((uint64_t)wraps << 24) + (SYST_RELOAD - cvr);
    return ticks * NS_PER_TICK;
}

void board_exit(int code)
{
    /* SYS_EXIT_EXTENDED: ADP_Stopped_ApplicationExit with the status. */
    static uint32_t block[2];
    block[0] = 0x20026u;
    block[1] = (uint32_t)code;
    register uint32_t r0 __asm__("r0") = 0x20u;
    register uint32_t *r1 __asm__("r1") = block;
    __asm__ volatile("bkpt 0xab" : : "r"(r0), "r"(r1) : "memory");
    for (;;)
        ;
}

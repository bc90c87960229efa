/* A program whose signal handlers read its paged memory, for tests/run_signals.rs.
 *
 * Usage: handler_pages MIB
 *
 * Fills MIB MiB with a known pattern, then makes three checking passes over it while a 1 ms
 * SIGALRM timer (a process-directed signal) runs a handler that reads and checks 4 words at
 * random. Then it blocks SIGUSR1 (in its only thread) and sends SIGUSR1 to itself 100 times:
 * without farmem the signal stays pending and its handler never runs. Prints
 * "ok alarms=N usr1=0" and exits 0, or "BAD ..." and exits 3.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile uint64_t *buf;
static size_t words;
static volatile sig_atomic_t alarms, usr1, bad;
static uint64_t rng = 88172645463325252ULL;

static uint64_t pattern(size_t i) { return (uint64_t)i * 0x9E3779B97F4A7C15ULL ^ 0x5555; }

static void on_alarm(int sig) {
    (void)sig;
    for (int k = 0; k < 4; k++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        size_t i = rng % words;
        if (buf[i] != pattern(i)) bad = 1;
    }
    alarms++;
}

static void on_usr1(int sig) {
    (void)sig;
    usr1++;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: handler_pages MIB\n");
        return 2;
    }
    words = ((size_t)atoi(argv[1]) << 20) / 8;
    buf = malloc(words * 8);
    if (!buf) return 2;
    for (size_t i = 0; i < words; i++) buf[i] = pattern(i);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval t = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &t, NULL);
    for (int pass = 0; pass < 3; pass++)
        for (size_t i = 0; i < words; i += 64)
            if (buf[i] != pattern(i)) bad = 1;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);

    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    sigprocmask(SIG_BLOCK, &s, NULL);
    for (int k = 0; k < 100; k++) {
        kill(getpid(), SIGUSR1);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }

    if (bad || usr1 != 0 || alarms == 0) {
        printf("BAD alarms=%d usr1=%d bad=%d\n", (int)alarms, (int)usr1, (int)bad);
        return 3;
    }
    printf("ok alarms=%d usr1=0\n", (int)alarms);
    return 0;
}

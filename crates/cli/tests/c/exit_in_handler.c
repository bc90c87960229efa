/* Ends with _exit(7) from a signal handler that interrupts the allocator: farmem's _exit must
 * write the final statistics without taking a lock the interrupted code may hold (it asks its
 * stats thread), and must end the process with the status given. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void on_alarm(int sig) {
    (void)sig;
    _exit(7);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(1);
    for (;;) {
        char *p = malloc(1 << 16);
        if (!p) return 1;
        memset(p, 1, 1 << 16);
        free(p);
    }
}

/* Stands in for the `farmem` binary a hostile environment names: it records that it ran, and
 * with which effective user id, in the file MARKER (given with -DMARKER=...), then fails. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    FILE *f = fopen(MARKER, "w");
    if (f != NULL) {
        fprintf(f, "euid=%d\n", (int)geteuid());
        fclose(f);
    }
    return 1;
}

/* A statically linked program for run_errors.rs: creates the file named by argv[1], so the
 * test can tell whether it was started. */
#include <stdio.h>
int main(int argc, char **argv) {
    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (f) fclose(f);
    }
    return 0;
}

/* Run set-user-ID root by another user: starts the runtime with the embedded donor (no donors
 * named) and prints its effective user id and what fm_init said. */
#include <farmem.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    int rc = fm_init(64u << 20, NULL);
    printf("euid=%d fm_init=%d\n", (int)geteuid(), rc);
    if (rc != 0) printf("error: %s\n", fm_last_error());
    return 0;
}

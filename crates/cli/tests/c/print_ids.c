/* Prints its real and effective user ids: run set-user-ID root by another user, it shows
 * whether the kernel gave it root's rights (euid 0). */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("ruid=%d euid=%d\n", (int)getuid(), (int)geteuid());
    return 0;
}

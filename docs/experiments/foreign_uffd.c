/* Does a userfaultfd created by one process work for another's memory?
 * The parent creates it and hands it to a forked child (fork copies the fd table, as
 * SCM_RIGHTS or SECCOMP_IOCTL_NOTIF_ADDFD would hand it over); the child maps memory of its
 * own at an address the parent does not have and tries UFFDIO_REGISTER on it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (uffd < 0) { perror("userfaultfd"); return 1; }
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(uffd, UFFDIO_API, &api)) { perror("UFFDIO_API"); return 1; }
    pid_t pid = fork();
    if (pid == 0) {
        /* the child: memory only it has */
        void *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        /* make sure the parent has nothing there: the parent unmaps the same address below,
         * but it never mapped it (the child's mapping is new) */
        struct uffdio_register r = {.range = {.start = (unsigned long)p, .len = 1 << 20},
                                    .mode = UFFDIO_REGISTER_MODE_MISSING};
        int rc = ioctl(uffd, UFFDIO_REGISTER, &r);
        printf("child: UFFDIO_REGISTER of its own memory with the parent's userfaultfd: %s\n",
               rc == 0 ? "ok" : strerror(errno));
        int mine = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
        struct uffdio_api api2 = {.api = UFFD_API};
        ioctl(mine, UFFDIO_API, &api2);
        rc = ioctl(mine, UFFDIO_REGISTER, &r);
        printf("child: the same with a userfaultfd it created itself: %s\n",
               rc == 0 ? "ok" : strerror(errno));
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return 0;
}

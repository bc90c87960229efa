/* farmem.h — the C API of farmem's paging runtime (libfarmem_capi.so / .a, crate farmem-capi).
 *
 * Memory from fm_alloc lives in a region: it stays in local memory up to the budget given to
 * fm_init; the rest lives on donors (`farmem donor` processes) and comes back on access,
 * transparently. With no donor named, fm_init starts a local donor child process (the
 * `farmem` binary from $FARMEM_BIN or PATH; a set-user-ID or set-group-ID program must name
 * donors instead, since the user's environment is not trusted there).
 *
 * All functions are thread-safe. On failure they return -1 or NULL and fm_last_error()
 * says what failed and what to do.
 */
#ifndef FARMEM_H
#define FARMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Starts the runtime. donors: comma-separated HOST:PORT list, or NULL/"" for the embedded
 * local donor. Returns 0 or -1. Call once per process. */
int fm_init(uint64_t budget_bytes, const char *donors);

/* A new zero-filled, page-aligned region of at least `bytes`. NULL on error. */
void *fm_alloc(size_t bytes);

/* Frees a region from fm_alloc. Returns 0, or -1 if ptr did not come from fm_alloc. */
int fm_free(void *ptr);

/* Writes the runtime's counters as a NUL-terminated JSON object into buf (len bytes).
 * Returns the JSON length; a value >= len means the output was truncated. -1 on error. */
long fm_stats(char *buf, size_t len);

/* The message of the last failed call ("" if none). */
const char *fm_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FARMEM_H */
